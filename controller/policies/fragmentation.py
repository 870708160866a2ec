"""Fragmentation policy: drain and restart an engine whose allocator stays fragmented.

The design (docs/design.md): "restart the service when fragmentation passes 30 %". Fragmentation here is
the allocator's reserved-but-unallocated share (:func:`controller.signals.fragmentation_ratio`),
not free memory. Decides only; the loop drains the engine, restarts it and records events.

States (one instance per engine)::

    NORMAL ──fragmentation > threshold for hold_seconds, also while idle──▶ RESTARTING
      ▲          (refused, action None, while the last restart is < min_interval ago)   │
      └─ the action reports the restart done / not done (postponed by the rails, failed),
         or a NEW engine process (restart evidence against the last good poll before the
         decision) answers with fragmentation ≤ threshold, or restart_timeout ──────────┘

A restart that was not done (the fleet rails postponed it, the drain timed out, the restart
failed) does not count against ``min_interval_seconds``: the hold starts again and the policy
may decide it again. A low sample alone never ends RESTARTING: a drained engine's idle
allocator reads 0 % before it is restarted. Nor does a failed poll followed by a good one: a
busy engine's poll times out while the same process serves on. Only proof of a new process
ends it from the polls: ``engine.instance_id`` changed (else the uptime went down or a counter
reset; :func:`~inferctl.controller.policies.liveness.restart_evidence`).

The hold clock runs only while every sample is valid and above the threshold; a missing or
invalid sample (reserved 0, allocated > reserved, NaN, engine down) resets it. A refusal is
recorded once per blocked period, not on every poll.

Busy engines (``confirm_idle``, default on): while requests run, a caching allocator keeps the
step's activation working set reserved between steps (PyTorch's CUDA caching allocator does;
the bundled engine's simulated allocator on CPU models it), so reserved-but-unallocated reads
high on a healthy busy engine — 45-49 % for stories260K under 16 concurrent long prompts with
an 8.76 MB budget — although the next step reuses all of it. That is cache, not fragmentation.
The bundled engine releases its cache when it goes idle (``empty_cache``), so fragmentation that
survives an idle moment is real (segments pinned by live blocks). Hence a restart needs the
high ratio to persist across an idle moment: the hold runs over busy and idle samples alike,
but the restart is decided only once a sample taken while idle (``running`` 0 and ``waiting``
0, both reported) was above the threshold during the hold. A busy engine that never idles is
never restarted by this path; its real fragmentation shows as fragmentation OOMs, which the
precision policy compacts and, on a recurrence, escalates through :meth:`request_restart`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from inferctl.contract.thresholds import THRESHOLDS
from inferctl.controller.policies.common import (HoldClock, PerEnginePolicy, check_number,
                                        config_from_mapping)
from inferctl.controller.policies.liveness import restart_evidence
from inferctl.controller.signals import InvalidSampleCounter, format_bytes, fragmentation_ratio
from inferctl.controller.types import Decision, EngineSnapshot, GpuSnapshot

POLICY = "fragmentation"


class FragmentationState(str, enum.Enum):
    NORMAL = "normal"
    RESTARTING = "restarting"


_F = FragmentationState
#: (state, event) → state: every state change of the fragmentation policy (docs/policies.md).
TRANSITIONS: Mapping[tuple[FragmentationState, str], FragmentationState] = {
    (_F.NORMAL, "restart_decided"): _F.RESTARTING,
    (_F.RESTARTING, "restart_done"): _F.NORMAL,
    (_F.RESTARTING, "restart_timeout"): _F.NORMAL,
    (_F.RESTARTING, "restart_not_done"): _F.NORMAL,
}


@dataclass
class FragmentationConfig:
    """``threshold_ratio`` (0.30, the design's 30 %: ``contract.thresholds.THRESHOLDS.
    fragmentation_ratio``); ``hold_seconds`` (60) the
    fragmentation must stay above it; ``min_interval_seconds`` (600) between two restarts of
    the engine; ``restart_timeout_seconds`` (300) to wait for the restarted engine;
    ``min_unallocated_bytes`` (0 = off): ignore fragmentation of less than this many bytes
    (a few MiB of a tiny pool are not worth a restart); ``confirm_idle`` (True): restart only
    once the high ratio has been seen at an idle moment (running 0, waiting 0) during the hold,
    so a busy engine's cached activation working set never restarts it (False: any samples)."""

    threshold_ratio: float = THRESHOLDS.fragmentation_ratio
    hold_seconds: float = 60.0
    min_interval_seconds: float = 600.0
    restart_timeout_seconds: float = 300.0
    min_unallocated_bytes: int = 0
    confirm_idle: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.confirm_idle, bool):
            raise ValueError(f"confirm_idle: {self.confirm_idle!r} must be true or false")
        check_number("threshold_ratio", self.threshold_ratio, minimum=0, maximum=1,
                     strict_min=True)
        check_number("hold_seconds", self.hold_seconds, minimum=0)
        check_number("min_interval_seconds", self.min_interval_seconds, minimum=0)
        check_number("restart_timeout_seconds", self.restart_timeout_seconds, minimum=0,
                     strict_min=True)
        check_number("min_unallocated_bytes", self.min_unallocated_bytes, minimum=0)


class FragmentationPolicy(PerEnginePolicy):
    """The fragmentation state machine for one engine. Pure: ``now`` comes from the caller.
    Its state changes are :data:`TRANSITIONS`."""

    NAME = POLICY
    TRANSITIONS = TRANSITIONS

    def __init__(self, config: FragmentationConfig | Mapping[str, Any] | None = None, *,
                 engine: str | None = None,
                 counter: InvalidSampleCounter | None = None) -> None:
        self.config = config_from_mapping(FragmentationConfig, config)
        self.engine = engine
        self.counter = counter
        self._state = FragmentationState.NORMAL
        self._since: float | None = None
        self._hold = HoldClock()
        self._last_restart: float | None = None
        self._refused_since_restart = False
        self._last_value: float | None = None
        self._last_now: float | None = None
        self._idle_confirmed: float | None = None   # when an idle sample was above, this hold
        self._previous_restart: float | None = None  # the rate limit's clock before this restart
        self._last_good: EngineSnapshot | None = None   # the engine's last good poll
        self._before: EngineSnapshot | None = None      # the last good poll before the decision

    @property
    def current(self) -> FragmentationState:
        return self._state

    def observe(self, now: float, engine: EngineSnapshot, gpu: GpuSnapshot | None = None,
                telemetry_ok: bool = True) -> list[Decision]:
        """One poll of the engine → decisions (``drain_restart``, a refusal with action None,
        or the end of a restart); ``gpu`` and ``telemetry_ok`` are not used. Raises
        ``ValueError`` for another engine's snapshot."""
        self._start_poll(now, engine.name)
        sig = (fragmentation_ratio(engine.memory_reserved_bytes, engine.memory_allocated_bytes,
                                   self.counter) if engine.ok else None)
        self._last_value = None if sig is None else sig.value
        if self._state is FragmentationState.RESTARTING:
            out = self._watch_restart(now, engine, sig)
            if engine.ok:
                self._last_good = engine
            return out
        if engine.ok:
            self._last_good = engine
        if sig is None or sig.value is None:
            self._hold.update(now, False, "engine did not answer" if sig is None else
                              f"no valid sample: {sig.reason}")
            self._idle_confirmed = None
            return []
        unalloc = sig.inputs.get("unallocated_bytes", 0.0)
        above = (sig.value > self.config.threshold_ratio
                 and unalloc >= self.config.min_unallocated_bytes)
        self._hold.update(now, above, None if above else
                          f"fragmentation {sig.value:.2%} <= {self.config.threshold_ratio:.0%}"
                          if sig.value <= self.config.threshold_ratio else
                          f"unallocated {format_bytes(unalloc)} below the minimum")
        if not above:
            self._idle_confirmed = None
            return []
        idle = engine.running == 0 and engine.waiting == 0
        if idle and self._idle_confirmed is None:
            self._idle_confirmed = now
        held = self._hold.held(now)
        if held < self.config.hold_seconds:
            return []
        if self.config.confirm_idle and self._idle_confirmed is None:
            return []      # busy all along: possibly the cached activation working set
        inputs = {"fragmentation_ratio": sig.value, "threshold_ratio": self.config.threshold_ratio,
                  "held_seconds": held, "hold_seconds": self.config.hold_seconds,
                  "reserved_bytes": sig.inputs.get("reserved_bytes"),
                  "allocated_bytes": sig.inputs.get("allocated_bytes"),
                  "unallocated_bytes": unalloc, "unallocated": format_bytes(unalloc),
                  "idle_confirmed_at": self._idle_confirmed, "running": engine.running,
                  "waiting": engine.waiting}
        d = self.request_restart(
            now, f"allocator fragmentation {sig.value:.1%} (reserved-but-unallocated "
                 f"{format_bytes(unalloc)}) has stayed above {self.config.threshold_ratio:.0%} "
                 f"for {held:g} s" + (", also while idle (not a busy engine's cached "
                                      "activations)" if self._idle_confirmed is not None else ""),
            inputs)
        return [] if d is None else [d]

    def request_restart(self, now: float, reason: str,
                        inputs: Mapping[str, Any] | None = None) -> Decision | None:
        """Ask for a drain-and-restart (from this policy's hold, or from the precision policy
        after a recurring fragmentation OOM). Returns the ``drain_restart`` decision, a
        refusal (action None, with the reason and when the next one is allowed), or None
        for a refusal already recorded since the last restart."""
        inputs = dict(inputs or {})
        inputs["min_interval_seconds"] = self.config.min_interval_seconds
        inputs["last_restart"] = self._last_restart
        st = self._state.value
        if self._state is FragmentationState.RESTARTING:
            return Decision(POLICY, self.engine or "", None, st, st,
                            f"{reason}; refused: a restart is already in progress", inputs,
                            "info")
        if self._last_restart is not None and \
                now - self._last_restart < self.config.min_interval_seconds:
            if self._refused_since_restart:
                return None
            self._refused_since_restart = True
            nxt = self._last_restart + self.config.min_interval_seconds
            inputs["next_allowed"] = nxt
            return Decision(POLICY, self.engine or "", None, st, st,
                            f"{reason}; refused by the rate limit: last restart "
                            f"{now - self._last_restart:g} s ago, at most one per "
                            f"{self.config.min_interval_seconds:g} s (next allowed in "
                            f"{nxt - now:g} s)", inputs, "warning")
        self.check_transition(self._state, "restart_decided", FragmentationState.RESTARTING)
        self._previous_restart = self._last_restart
        self._before = self._last_good
        self._last_restart = now
        self._refused_since_restart = False
        self._state = FragmentationState.RESTARTING
        self._since = now
        self._hold.reset(now, "restart decided")
        self._idle_confirmed = None
        return Decision(POLICY, self.engine or "", "drain_restart", st,
                        FragmentationState.RESTARTING.value, f"{reason}: drain and restart "
                        "the engine", inputs, "warning")

    def _watch_restart(self, now: float, engine: EngineSnapshot, sig: Any) -> list[Decision]:
        elapsed = 0.0 if self._last_restart is None else now - self._last_restart
        evidence = (restart_evidence(self._before, engine)
                    if engine.ok and self._before is not None else [])
        if evidence and sig is not None and sig.value is not None \
                and sig.value <= self.config.threshold_ratio:
            return [self._back(now, f"a new engine process ({evidence[0]['signal']} changed) answers with "
                                    f"fragmentation {sig.value:.1%} <= {self.config.threshold_ratio:.0%}:"
                                    " restart done",
                               {"fragmentation_ratio": sig.value, "elapsed_seconds": elapsed,
                                "evidence": evidence}, event="restart_done")]
        if elapsed >= self.config.restart_timeout_seconds:
            value = None if sig is None else sig.value
            shown = "no data" if value is None else f"{value:.1%}"
            return [self._back(now, f"restart not confirmed after {elapsed:g} s "
                                    f"(fragmentation {shown}); watching again, the rate limit "
                                    "still applies",
                               {"elapsed_seconds": elapsed,
                                "fragmentation_ratio": None if sig is None else sig.value},
                               severity="warning", event="restart_timeout")]
        return []

    def record_action_result(self, now: float, action: str, ok: bool, detail: str = "") -> list[Decision]:
        """How the ``drain_restart`` went (the loop's ``on_result``): done → NORMAL
        (``restart_done``); not done (``ok`` False: postponed by the fleet rails, drain timed
        out, restart failed) → NORMAL (``restart_not_done``, warning) with the rate limit's
        clock put back, so the restart may be decided again after a new hold. Another action,
        or no restart in progress: nothing."""
        if action != "drain_restart" or self._state is not FragmentationState.RESTARTING:
            return []
        elapsed = 0.0 if self._last_restart is None else now - self._last_restart
        if ok:
            return [self._back(now, f"restart done: {detail}" if detail else "restart done",
                               {"elapsed_seconds": elapsed}, event="restart_done")]
        self._last_restart = self._previous_restart
        return [self._back(now, f"restart not done ({detail or 'no detail'}); it does not count against"
                                " the rate limit, watching again", {"elapsed_seconds": elapsed},
                           severity="warning", event="restart_not_done")]

    def _back(self, now: float, reason: str, inputs: dict[str, Any],
              severity: str = "info", *, event: str) -> Decision:
        """RESTARTING → NORMAL on ``event`` (``restart_done``, ``restart_timeout`` or
        ``restart_not_done``)."""
        self.check_transition(self._state, event, FragmentationState.NORMAL)
        self._state = FragmentationState.NORMAL
        self._since = now
        self._hold.reset(now, "restart finished")
        self._idle_confirmed = None
        return Decision(POLICY, self.engine or "", None, FragmentationState.RESTARTING.value,
                        FragmentationState.NORMAL.value, reason, inputs, severity)

    def state(self, now: float | None = None) -> dict[str, Any]:
        """A plain dict for ``/status``."""
        now = self._last_now if now is None else now
        nxt = (None if self._last_restart is None
               else self._last_restart + self.config.min_interval_seconds)
        return {"policy": POLICY, "engine": self.engine, "state": self._state.value,
                "since": self._since, "fragmentation_ratio": self._last_value,
                "threshold_ratio": self.config.threshold_ratio,
                "hold_seconds": self.config.hold_seconds, "hold_started": self._hold.since,
                "held_seconds": None if now is None else self._hold.held(now),
                "last_restart": self._last_restart, "next_restart_allowed": nxt,
                "last_hold_reset": self._hold.last_reset, "confirm_idle": self.config.confirm_idle,
                "idle_confirmed_at": self._idle_confirmed}
