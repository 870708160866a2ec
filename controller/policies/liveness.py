"""Liveness: every outage is an event, and an engine that hangs is handled like a crash.

Two policies observe the snapshots the loop already hands to policies (they poll nothing):

* :class:`EngineLiveness` (``liveness``, one per engine) —
  - **down / up**: the engine's poll goes from ok to not ok (one ``transition`` event,
    severity warning, with the last-seen values: time, running, waiting, steps, uptime) and
    back (one event with the downtime). A one-poll outage is still one down and one up
    event; more failed polls add nothing.
  - **restart**: the engine's process changed while we looked away — its ``/stats``
    ``engine.instance_id`` changed (when reported, it alone decides), else its
    ``engine.uptime_seconds`` went down, or a counter reset (``steps_total``,
    ``finished_total``, ``prompt_tokens_total``, ``generation_tokens_total`` decreased). The
    evidence names which. Coming back from down, the evidence goes in the ``up`` event (one
    outage, one pair); a restart between two good polls is one ``observation`` event.
  - **hang**: alive (answers the poll) but not stepping while work is queued:
    ``scheduler.steps_total`` unchanged for ``hang_seconds`` while ``running + waiting > 0``
    (only known values count: an unknown queue is not work, a missing ``steps_total`` starts
    no clock), or the async engine reports ``engine.step_thread_alive: false`` with work
    queued (at once). The decision is critical and carries the evidence; for a bundled engine
    the controller launched it asks ``restart_engine`` (the hardware policy's forced restart:
    the fleet rails are skipped and in-flight work is not waited for past the drain timeout —
    a hung engine never drains); for an engine the controller does not launch it records
    only (action None). One restart per hang episode; if the engine is still stalled
    ``hang_seconds`` after it, one critical observation says so and nothing more is tried
    (a person must look). The episode ends when steps advance, the queue empties, the engine
    restarts or goes down.
* :class:`GpuTelemetryLiveness` (``telemetry``, one for the GPU source) — the GPU reading goes
  not ok (telemetry lost: warning, with the last-seen GPUs) and ok again (with the downtime);
  a GPU seen in a good reading missing from a later good reading (warning, with its last-seen
  index, name and PCI bus id) and back (with how long it was missing). Telemetry down says
  nothing about single GPUs.

Neither policy acts on anything but the hang; the other events are the record. Pure: ``now``
comes from the caller (docs/policies.md).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from inferctl.controller.policies.base import GpuPolicy
from inferctl.controller.policies.common import PerEnginePolicy, check_number, config_from_mapping
from inferctl.controller.types import Decision, EngineSnapshot, GpuReading, GpuSnapshot

#: counters whose decrease means the engine process started again (its start time changed)
RESET_COUNTERS: tuple[str, ...] = ("steps_total", "finished_total", "prompt_tokens_total",
                                   "generation_tokens_total")


class Liveness(str, enum.Enum):
    """An engine's liveness state."""

    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"
    HUNG = "hung"


class TelemetryState(str, enum.Enum):
    """The GPU source's state (unknown, up, down) and each GPU's (up, missing)."""

    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"
    MISSING = "missing"


_L = Liveness
#: (state, event) → state of one engine (docs/policies.md).
ENGINE_TRANSITIONS: Mapping[tuple[Liveness, str], Liveness] = {
    (_L.UNKNOWN, "poll_ok"): _L.UP,
    (_L.UNKNOWN, "poll_failed"): _L.DOWN,
    (_L.UP, "poll_failed"): _L.DOWN,
    (_L.DOWN, "poll_ok"): _L.UP,
    (_L.UP, "hang"): _L.HUNG,
    (_L.HUNG, "stepping"): _L.UP,
    (_L.HUNG, "poll_failed"): _L.DOWN,
}
_G = TelemetryState
#: (state, event) → state of the GPU source (``reading_*``) and of each GPU (``gpu_*``).
GPU_TRANSITIONS: Mapping[tuple[TelemetryState, str], TelemetryState] = {
    (_G.UNKNOWN, "reading_ok"): _G.UP,
    (_G.UNKNOWN, "reading_failed"): _G.DOWN,
    (_G.UP, "reading_failed"): _G.DOWN,
    (_G.DOWN, "reading_ok"): _G.UP,
    (_G.UP, "gpu_missing"): _G.MISSING,
    (_G.MISSING, "gpu_back"): _G.UP,
}


@dataclass
class LivenessConfig:
    """``hang_seconds`` (30): how long ``steps_total`` may stay unchanged with work queued
    before the engine is hung; it must exceed the longest legitimate step (a long prefill of
    ``max_num_batched_tokens`` on the slowest device) plus one poll interval.
    ``restart_hung`` (True): ask ``restart_engine`` for a hung engine the controller launched
    (False: record only, for every engine)."""

    hang_seconds: float = 30.0
    restart_hung: bool = True

    def __post_init__(self) -> None:
        check_number("hang_seconds", self.hang_seconds, minimum=0, strict_min=True)
        if not isinstance(self.restart_hung, bool):
            raise ValueError(f"restart_hung: {self.restart_hung!r} must be true or false")


def _engine_doc(snap: EngineSnapshot) -> Mapping[str, Any]:
    raw = snap.raw
    if type(raw) is dict:       # a parsed /stats (every bundled poll): no Mapping ABC check for it
        doc = raw.get("engine")
        if type(doc) is dict:
            return doc
    elif raw is None or not isinstance(raw, Mapping):
        return _NO_DOC
    else:
        doc = raw.get("engine")
    return doc if isinstance(doc, Mapping) else _NO_DOC


#: What :func:`_engine_doc` answers for a snapshot without an ``engine`` section (read-only).
_NO_DOC: Mapping[str, Any] = MappingProxyType({})


def uptime_of(snap: EngineSnapshot) -> float | None:
    """``engine.uptime_seconds`` of a bundled ``/stats`` (seconds), None when not reported."""
    v = _engine_doc(snap).get("uptime_seconds")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def step_thread_alive(snap: EngineSnapshot) -> bool | None:
    """``engine.step_thread_alive`` of the async engine's ``/stats``, None when not reported."""
    v = _engine_doc(snap).get("step_thread_alive")
    return v if isinstance(v, bool) else None


def queued_work(snap: EngineSnapshot) -> int | None:
    """``running + waiting`` over the known ones; None when neither is known (no data is not
    work)."""
    known = [v for v in (snap.running, snap.waiting) if isinstance(v, int)]
    return sum(known) if known else None


def instance_id_of(snap: EngineSnapshot) -> str | None:
    """``engine.instance_id`` of a bundled ``/stats`` (a uuid4 hex the engine process makes at
    start, engine/entrypoints/state.py), None when not reported (an older engine, vLLM...)."""
    v = _engine_doc(snap).get("instance_id")
    return v if isinstance(v, str) and v else None


def restart_evidence(before: EngineSnapshot, after: EngineSnapshot) -> list[dict[str, Any]]:
    """Why ``after`` comes from a newer process than ``before`` (both good polls). Empty when
    nothing says so.

    When both report ``engine.instance_id`` it alone decides (a changed id is a restart, the
    same id is the same process, whatever else moved). Otherwise: the uptime went down, or one
    of :data:`RESET_COUNTERS` decreased. A failed poll in between is never evidence: a busy
    engine's poll times out while the same process serves on."""
    i0, i1 = instance_id_of(before), instance_id_of(after)
    if i0 is not None and i1 is not None:
        return [] if i0 == i1 else [{"signal": "instance_id", "before": i0, "after": i1}]
    out: list[dict[str, Any]] = []
    u0, u1 = uptime_of(before), uptime_of(after)
    if u0 is not None and u1 is not None and u1 < u0:
        out.append({"signal": "uptime_seconds", "before": u0, "after": u1})
    for name in RESET_COUNTERS:
        v0, v1 = getattr(before, name), getattr(after, name)
        if v0 is not None and v1 is not None and v1 < v0:
            out.append({"signal": name, "before": v0, "after": v1})
    return out


def _last_seen(snap: EngineSnapshot | None) -> dict[str, Any] | None:
    if snap is None:
        return None
    return {"time": snap.time, "running": snap.running, "waiting": snap.waiting,
            "steps_total": snap.steps_total, "finished_total": snap.finished_total,
            "uptime_seconds": uptime_of(snap), "precision": snap.precision}


def _evidence_text(evidence: list[dict[str, Any]]) -> str:
    return ", ".join(f"{e['signal']} {_shown(e['before'])} → {_shown(e['after'])}" for e in evidence)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


class EngineLiveness(PerEnginePolicy):
    """Down/up, restart and hang of one engine (module docstring). ``can_restart``: the engine
    is a bundled engine the controller launched (only then is a hang a ``restart_engine``)."""

    NAME = "liveness"
    TRANSITIONS = ENGINE_TRANSITIONS

    def __init__(self, config: LivenessConfig | Mapping[str, Any] | None = None, *,
                 engine: str | None = None, can_restart: bool = False) -> None:
        self.config = config_from_mapping(LivenessConfig, config)
        self.engine = engine
        self.can_restart = can_restart
        self._state = Liveness.UNKNOWN
        self._since: float | None = None
        self._last_now: float | None = None
        self._last_ok: EngineSnapshot | None = None
        self._down_since: float | None = None
        self._down_error: str | None = None
        self._stall: tuple[float, float] | None = None     # (steps_total, since)
        self._hang: dict[str, Any] | None = None           # the current episode
        self.counts = {"down": 0, "restarts": 0, "hangs": 0}

    @property
    def current(self) -> Liveness:
        return self._state

    def observe(self, now: float, engine: EngineSnapshot, gpu: GpuSnapshot | None = None,
                telemetry_ok: bool = True) -> list[Decision]:
        """One poll → at most one decision (down, up, restart, hang, still hung, recovered).
        ``gpu``/``telemetry_ok`` are not used. Raises ``ValueError`` for another engine's
        snapshot."""
        self._start_poll(now, engine.name)
        if not engine.ok:
            return self._failed(now, engine)
        before, self._last_ok = self._last_ok, engine
        if self._state in (Liveness.UNKNOWN, Liveness.DOWN):
            return self._back(now, before, engine)
        evidence = [] if before is None else restart_evidence(before, engine)
        if evidence:
            self._stall = None
            self.counts["restarts"] += 1
            inputs = {"evidence": evidence, "last_seen": _last_seen(before)}
            if self._state is Liveness.HUNG:
                return [self._recovered(now, f"restarted ({_evidence_text(evidence)})", inputs)]
            return [Decision(self.NAME, self.engine or "", None, self._state.value, self._state.value,
                             f"engine {self.engine} restarted: {_evidence_text(evidence)}", inputs, "warning")]
        return self._judge_hang(now, engine)

    # ------------------------------------------------------------------ down / up
    def _failed(self, now: float, snap: EngineSnapshot) -> list[Decision]:
        self._stall = None
        self._down_error = snap.error
        if self._state is Liveness.DOWN:
            return []
        self._down_since = now
        self._hang = None
        self.counts["down"] += 1
        last = self._last_ok
        seen = ("never seen up" if last is None else f"last seen up {now - last.time:g} s ago")
        return [self._move(now, Liveness.DOWN, "poll_failed", None,
                           f"engine {self.engine} down: {snap.error or 'poll failed'} ({seen})",
                           {"error": snap.error, "last_seen": _last_seen(last)}, "warning")]

    def _back(self, now: float, before: EngineSnapshot | None, snap: EngineSnapshot) -> list[Decision]:
        if self._state is Liveness.UNKNOWN:      # the first good poll: nothing happened
            self.check_transition(self._state, "poll_ok", Liveness.UP)
            self._state, self._since = Liveness.UP, now
            return self._judge_hang(now, snap)      # starts the stall clock
        downtime = None if self._down_since is None else now - self._down_since
        evidence = [] if before is None else restart_evidence(before, snap)
        if evidence:
            self.counts["restarts"] += 1
        reason = (f"engine {self.engine} up again after {downtime:g} s down"
                  + (f"; restarted ({_evidence_text(evidence)})" if evidence else ""))
        inputs = {"downtime_seconds": downtime, "down_since": self._down_since,
                  "last_error": self._down_error, "restarted": bool(evidence), "evidence": evidence,
                  "last_seen": _last_seen(before), "now_seen": _last_seen(snap)}
        self._down_since = self._down_error = None
        return [self._move(now, Liveness.UP, "poll_ok", None, reason, inputs, "info")] + self._judge_hang(now, snap)

    # ------------------------------------------------------------------ hang
    def _judge_hang(self, now: float, snap: EngineSnapshot) -> list[Decision]:
        work = queued_work(snap)
        steps = snap.steps_total
        alive = step_thread_alive(snap)
        if steps is None or not work:
            self._stall = None
        elif self._stall is None or self._stall[0] != steps:
            self._stall = (steps, now)
        stalled = 0.0 if self._stall is None else now - self._stall[1]
        thread_dead = alive is False and bool(work)
        hung = thread_dead or (self._stall is not None and stalled >= self.config.hang_seconds)
        if self._state is Liveness.HUNG:
            if not hung:
                why = ("the queue is empty" if not work else "steps advance" if steps is not None
                       else "steps_total no longer reported")
                return [self._recovered(now, why, {"steps_total": steps, "queued": work})]
            return self._still_hung(now, stalled)
        if not hung:
            return []
        self.counts["hangs"] += 1
        evidence = {"steps_total": steps, "running": snap.running, "waiting": snap.waiting,
                    "stalled_seconds": stalled if self._stall is not None else None,
                    "hang_seconds": self.config.hang_seconds, "step_thread_alive": alive}
        what = ("its step thread is dead (step_thread_alive false)" if thread_dead else
                f"steps_total stuck at {steps:g} for {stalled:g} s")
        restart = self.can_restart and self.config.restart_hung
        self._hang = {"since": now, "action": "restart_engine" if restart else None, "result": None,
                      "escalated": False}
        tail = ("restart it (forced)" if restart else
                "not launched by the controller: record only, restart it where it runs" if not self.can_restart
                else "restart_hung is off: record only")
        return [self._move(now, Liveness.HUNG, "hang", "restart_engine" if restart else None,
                           f"engine {self.engine} hung: {what} with {work} requests queued; {tail}",
                           {**evidence, "force": restart, "skip_drain_wait": restart, "evidence": what},
                           "critical")]

    def _still_hung(self, now: float, stalled: float) -> list[Decision]:
        h = self._hang or {}
        if h.get("escalated") or now - h.get("since", now) < self.config.hang_seconds:
            return []
        h["escalated"] = True
        return [Decision(self.NAME, self.engine or "", None, Liveness.HUNG.value, Liveness.HUNG.value,
                         f"engine {self.engine} still hung {now - h['since']:g} s after the hang was found"
                         f" (action {h.get('action') or 'none'}: {h.get('result') or 'no result'});"
                         " nothing more is tried: a person must look", {"stalled_seconds": stalled,
                                                                         "hang": dict(h)}, "critical")]

    def _recovered(self, now: float, why: str, inputs: dict[str, Any]) -> Decision:
        self._hang = None
        return self._move(now, Liveness.UP, "stepping", None, f"engine {self.engine} no longer hung: {why}",
                          inputs, "info")

    def record_action_result(self, now: float, action: str, ok: bool, detail: str = "") -> list[Decision]:
        """The hang restart's outcome is kept for ``/status`` and the "still hung" note."""
        if self._hang is not None and action == self._hang.get("action"):
            self._hang["result"] = ("ok: " if ok else "failed: ") + (detail or "")
        return []

    # ------------------------------------------------------------------ helpers
    def _move(self, now: float, to: Liveness, event: str, action: str | None, reason: str,
              inputs: dict[str, Any], severity: str) -> Decision:
        frm = self._state
        self.check_transition(frm, event, to)
        self._state, self._since = to, now
        return Decision(self.NAME, self.engine or "", action, frm.value, to.value, reason, inputs, severity)

    def state(self, now: float | None = None) -> dict[str, Any]:
        """``/status``: state, since, the down time so far, the stall clock (seconds steps have
        not moved with work queued; None when not counting), the hang episode, and counts."""
        t = self._last_now if now is None else now
        return {"policy": self.NAME, "engine": self.engine, "state": self._state.value, "since": self._since,
                "down_since": self._down_since, "last_error": self._down_error,
                "stalled_seconds": None if self._stall is None or t is None else t - self._stall[1],
                "hang_seconds": self.config.hang_seconds, "can_restart": self.can_restart,
                "hang": None if self._hang is None else dict(self._hang), "counts": dict(self.counts)}


class GpuTelemetryLiveness(GpuPolicy):
    """GPU telemetry lost/regained and single GPUs missing from the reading (module docstring).
    Decision targets: the source's name for telemetry, the GPU's UUID for a GPU."""

    NAME = "telemetry"
    TRANSITIONS = GPU_TRANSITIONS

    def __init__(self) -> None:
        self._state = TelemetryState.UNKNOWN
        self._since: float | None = None
        self._last_ok: GpuReading | None = None
        self._error: str | None = None
        self._gpus: dict[str, tuple[TelemetryState, float, GpuSnapshot]] = {}   # uuid → (state, since, last seen)

    def observe(self, now: float, reading: GpuReading,
                engines: Mapping[str, EngineSnapshot] | None = None) -> list[Decision]:
        """One GPU poll → the telemetry event (on a change) and one event per GPU that went
        missing or came back."""
        if not reading.ok:
            self._error = reading.error
            if self._state is TelemetryState.DOWN:
                return []
            last = self._last_ok
            seen = None if last is None else {
                "time": last.time, "gpus": {u: s.index for u, s in last.gpus.items()}}
            return [self._move(now, reading.source, TelemetryState.DOWN, "reading_failed",
                               f"GPU telemetry ({reading.source}) lost: {reading.error or 'no detail'}",
                               {"error": reading.error, "last_seen": seen}, "warning")]
        out: list[Decision] = []
        if self._state is TelemetryState.UNKNOWN:
            self.check_transition(self._state, "reading_ok", TelemetryState.UP)
            self._state, self._since = TelemetryState.UP, now
        elif self._state is TelemetryState.DOWN:
            downtime = None if self._since is None else now - self._since
            out.append(self._move(now, reading.source, TelemetryState.UP, "reading_ok",
                                  f"GPU telemetry ({reading.source}) back after {downtime:g} s",
                                  {"downtime_seconds": downtime, "last_error": self._error,
                                   "gpus": {u: s.index for u, s in reading.gpus.items()}}, "info"))
            self._error = None
        self._last_ok = reading
        for uuid, (st, since, last) in list(self._gpus.items()):
            if st is TelemetryState.UP and uuid not in reading.gpus:
                self.check_transition(st, "gpu_missing", TelemetryState.MISSING)
                self._gpus[uuid] = (TelemetryState.MISSING, now, last)
                out.append(Decision(self.NAME, uuid, None, st.value, TelemetryState.MISSING.value,
                                    f"GPU {last.index} ({uuid}) missing from the {reading.source} reading",
                                    {"gpu_index": last.index, "name": last.name, "pci_bus_id": last.pci_bus_id,
                                     "last_seen": last.time, "gpus_in_reading": len(reading.gpus)}, "warning"))
        for uuid, snap in reading.gpus.items():
            prev = self._gpus.get(uuid)
            if prev is not None and prev[0] is TelemetryState.MISSING:
                self.check_transition(prev[0], "gpu_back", TelemetryState.UP)
                out.append(Decision(self.NAME, uuid, None, TelemetryState.MISSING.value, TelemetryState.UP.value,
                                    f"GPU {snap.index} ({uuid}) back in the {reading.source} reading after"
                                    f" {now - prev[1]:g} s missing",
                                    {"gpu_index": snap.index, "missing_seconds": now - prev[1]}, "info"))
                self._gpus[uuid] = (TelemetryState.UP, now, snap)
            else:
                self._gpus[uuid] = (TelemetryState.UP, now if prev is None else prev[1], snap)
        return out

    def _move(self, now: float, target: str, to: TelemetryState, event: str, reason: str, inputs: dict[str, Any],
              severity: str) -> Decision:
        frm = self._state
        self.check_transition(frm, event, to)
        self._state, self._since = to, now
        return Decision(self.NAME, target, None, frm.value, to.value, reason, inputs, severity)

    def state(self, now: float | None = None) -> dict[str, Any]:
        """``/status``: telemetry state and since, the last error, every GPU seen and whether it
        is in the reading (``up``) or ``missing``, since when."""
        return {"policy": self.NAME, "state": self._state.value, "since": self._since, "error": self._error,
                "gpus": {u: {"index": s.index, "state": st.value, "since": since}
                         for u, (st, since, s) in self._gpus.items()}}
