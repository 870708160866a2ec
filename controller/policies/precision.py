"""Precision policy: FULL → INT8 on an exhaustion OOM, back to FULL once memory has recovered.

An engine that reports a start-only mode (``int4``, contract/precision.py ``START_ONLY_MODES``)
is left alone: degrading it to int8 would use more memory, and it has no full weights to roll
back to; its OOMs are handled by the engine's own backoff.

The design's "Error 800" flow (docs/design.md): switch to int8, record the event and alert,
switch back when resources recover. This module only DECIDES: :meth:`PrecisionPolicy.observe`
returns :class:`~controller.types.Decision` objects; the loop executes them (``degrade`` →
``POST /admin/precision {"mode": "int8"}``, ``rollback`` → ``{"mode": "full"}``, ``compact``
→ the engine's cache release) and records each one as an event.

States (one policy instance per engine)::

    FULL ──exhaustion OOM──▶ DEGRADING ──engine reports int8──▶ INT8
      ▲                          │ (more than max_switches_per_hour degrades in the
      │                          ▼  last hour: PINNED_INT8 instead, critical)
      └──engine reports full── ROLLING_BACK ◀──free ≥ threshold for the hold── INT8
    PINNED_INT8 ──operator unpin()──▶ INT8

* Faults are the engine's recent OOM records (``EngineSnapshot.faults``), keyed by
  (time, id) so that the same fault seen on several polls acts once and an engine restart
  that reuses ids is still new. Faults older than ``fault_max_age_seconds`` are history.
* Kind ``exhaustion`` (or unknown) → degrade. ``fragmentation`` → ``compact`` (and on a
  recurrence within ``compact_window_seconds``, a drain-restart requested through the
  fragmentation policy, which rate-limits it). ``impossible`` → the request is rejected; no
  switch. A hardware fault (Xid, GPU lost, uncorrectable ECC — in the fault's text or in the
  GPU snapshot) is never a degrade, whatever the engine called it.
* Rollback threshold = the full-precision weights' extra bytes (full − int8 weights) + a
  margin (``margin_bytes``, else ``margin_ratio`` × total memory). Free memory is the GPU's
  free bytes, or (no GPU snapshot: the sim/bundled engine) the engine's budget − reserved.
  It must stay ≥ the threshold continuously for the hold with no new OOM; a missing or
  invalid sample, telemetry down, or an engine that does not answer resets the hold clock.
* Flap guard: an exhaustion OOM within ``relapse_window_seconds`` of a rollback is a relapse
  and multiplies the next hold by ``hold_growth`` (capped at ``max_hold_seconds``); a
  non-relapse degrade resets it to ``hold_seconds``. More than ``max_switches_per_hour``
  degrades in a rolling hour pins INT8 (critical) until an operator calls :meth:`unpin`.
* No ping-pong (``precision_flap``): at most ``max_switches_per_window`` automatic switches
  (degrades + rollbacks) per ``switch_window_seconds`` (a rollback without room for a relapse's
  degrade is deferred), a hold per prompt-size class, and a pin after
  ``pin_after_class_relapses`` relapses of one class.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping

from inferctl.contract.precision import FULL, INT8, START_ONLY_MODES, check_precision_mode
from inferctl.contract.thresholds import THRESHOLDS
from inferctl.controller.policies.base import Gauge
from inferctl.controller.policies.common import (HoldClock, PerEnginePolicy, PolicyError,
                                                 check_number, config_from_mapping)
from inferctl.controller.policies.precision_flap import FlapGuard, size_class
from inferctl.controller.policies.precision_inputs import BENIGN_XIDS, HARDWARE_RECOVERY_ACTIONS  # noqa: F401
from inferctl.controller.policies.precision_inputs import (fault_inputs, fault_numbers, hardware_evidence,
                                                           memory_sample, queue_backlog, rollback_reason)
from inferctl.controller.signals import (InvalidSampleCounter, classify_oom, format_bytes,
                                         hardware_fault_evidence, validate_nonneg)
from inferctl.controller.types import Decision, EngineSnapshot, GpuSnapshot

POLICY = "precision"
HOUR = 3600.0


class PrecisionState(str, enum.Enum):
    FULL = FULL
    DEGRADING = "degrading"
    INT8 = INT8
    ROLLING_BACK = "rolling_back"
    PINNED_INT8 = "pinned_int8"


_P = PrecisionState
#: (state, event) → state: every state change the precision policy makes (docs/policies.md).
TRANSITIONS: Mapping[tuple[PrecisionState, str], PrecisionState] = {
    (_P.FULL, "exhaustion_oom"): _P.DEGRADING,
    (_P.ROLLING_BACK, "exhaustion_oom"): _P.DEGRADING,
    (_P.FULL, "flap_guard"): _P.PINNED_INT8,
    (_P.ROLLING_BACK, "flap_guard"): _P.PINNED_INT8,
    (_P.DEGRADING, "engine_int8"): _P.INT8,
    (_P.DEGRADING, "precision_unreported"): _P.INT8,
    (_P.DEGRADING, "degrade_failed"): _P.FULL,
    (_P.INT8, "memory_recovered"): _P.ROLLING_BACK,
    (_P.INT8, "engine_full"): _P.DEGRADING,
    (_P.ROLLING_BACK, "engine_full"): _P.FULL,
    (_P.ROLLING_BACK, "precision_unreported"): _P.FULL,
    (_P.ROLLING_BACK, "confirm_timeout"): _P.INT8,
    (_P.ROLLING_BACK, "rollback_failed"): _P.INT8,
    (_P.FULL, "engine_int8"): _P.INT8,
    (_P.PINNED_INT8, "unpin"): _P.INT8,
    (_P.FULL, "operator_degrade"): _P.DEGRADING,
    (_P.ROLLING_BACK, "operator_degrade"): _P.DEGRADING,
    (_P.DEGRADING, "operator_rollback"): _P.ROLLING_BACK,
    (_P.INT8, "operator_rollback"): _P.ROLLING_BACK,
    (_P.PINNED_INT8, "operator_rollback"): _P.ROLLING_BACK,
}


@dataclass
class PrecisionConfig:
    """Settings of :class:`PrecisionPolicy` (times in seconds, sizes in bytes).

    ``hold_seconds`` (60) base hold before a rollback; ``margin_ratio`` (0.10) of total memory,
    or ``margin_bytes`` when set, is added to the full-precision weights' extra bytes;
    ``full_weights_extra_bytes`` overrides the extra bytes when the engine does not report
    its weights; ``relapse_window_seconds`` (600) after a rollback in which an OOM counts as a
    relapse; ``hold_growth`` (×2) per relapse up to ``max_hold_seconds`` (3600);
    ``max_switches_per_hour`` (4) degrades per rolling hour before pinning;
    ``confirm_timeout_seconds`` (30) to wait for the engine to report the new precision;
    ``fault_max_age_seconds`` (300) beyond which a fault is history;
    ``compact_window_seconds`` (300) in which a second fragmentation OOM escalates to a
    restart; ``hardware_window_seconds`` (120) within which an Xid makes an OOM a hardware fault;
    ``max_switches_per_window`` (4, >= 2) automatic switches per ``switch_window_seconds`` (600)
    and ``pin_after_class_relapses`` (2) (contract/thresholds.py; ``precision_flap``).
    """

    hold_seconds: float = 60.0
    margin_ratio: float = 0.10
    margin_bytes: int | None = None
    full_weights_extra_bytes: int | None = None
    relapse_window_seconds: float = 600.0
    hold_growth: float = 2.0
    max_hold_seconds: float = 3600.0
    max_switches_per_hour: int = 4
    confirm_timeout_seconds: float = 30.0
    fault_max_age_seconds: float = 300.0
    compact_window_seconds: float = 300.0
    hardware_window_seconds: float = 120.0
    max_switches_per_window: int = THRESHOLDS.precision_max_switches
    switch_window_seconds: float = THRESHOLDS.precision_switch_window_seconds
    pin_after_class_relapses: int = THRESHOLDS.precision_pin_after_class_relapses

    def __post_init__(self) -> None:
        check_number("hold_seconds", self.hold_seconds, minimum=0)
        check_number("margin_ratio", self.margin_ratio, minimum=0, maximum=1)
        check_number("margin_bytes", self.margin_bytes, minimum=0, allow_none=True)
        check_number("full_weights_extra_bytes", self.full_weights_extra_bytes, minimum=0,
                     allow_none=True)
        check_number("relapse_window_seconds", self.relapse_window_seconds, minimum=0)
        check_number("hold_growth", self.hold_growth, minimum=1)
        check_number("max_hold_seconds", self.max_hold_seconds, minimum=self.hold_seconds)
        check_number("max_switches_per_hour", self.max_switches_per_hour, minimum=1)
        check_number("confirm_timeout_seconds", self.confirm_timeout_seconds, minimum=0,
                     strict_min=True)
        check_number("fault_max_age_seconds", self.fault_max_age_seconds, minimum=0)
        check_number("compact_window_seconds", self.compact_window_seconds, minimum=0)
        check_number("hardware_window_seconds", self.hardware_window_seconds, minimum=0)
        check_number("max_switches_per_window", self.max_switches_per_window, minimum=2)
        check_number("switch_window_seconds", self.switch_window_seconds, minimum=0)
        check_number("pin_after_class_relapses", self.pin_after_class_relapses, minimum=1)


def _operator(who: str) -> str:
    """``who`` as the event reason names it: callers pass ``operator:NAME`` (the API) or a bare
    name; never print "operator operator:"."""
    return who if who.startswith("operator") else f"operator {who}"


class PrecisionPolicy(PerEnginePolicy):
    """The precision state machine for one engine. Pure: ``now`` comes from the caller.
    Its state changes are :data:`TRANSITIONS`.

    ``fragmentation`` is the same engine's :class:`FragmentationPolicy` (optional): a
    fragmentation OOM that recurs after a compaction asks it for a rate-limited restart.
    """

    NAME = POLICY
    TRANSITIONS = TRANSITIONS

    def __init__(self, config: PrecisionConfig | Mapping[str, Any] | None = None, *,
                 engine: str | None = None, fragmentation: Any = None,
                 counter: InvalidSampleCounter | None = None) -> None:
        self.config = config_from_mapping(PrecisionConfig, config)
        self.engine = engine
        self.fragmentation = fragmentation
        self.counter = counter
        self._state = PrecisionState.FULL
        self._since: float | None = None
        self._hold = HoldClock()
        self._hold_seconds = self.config.hold_seconds
        self._relapses = 0
        self._degrades: deque[float] = deque()      # times of degrades (rolling hour)
        self._seen: dict[tuple[Any, Any], float] = {}   # (time, id) -> when first seen
        self._last_command: float | None = None     # when the last degrade/rollback was decided
        self._last_rollback_done: float | None = None
        self._last_compact: float | None = None
        self._ecc_uncorrected: dict[str, int] = {}
        self._pinned_by: str | None = None
        self._last_fault: dict[str, Any] | None = None
        self._last_now: float | None = None
        self._last_threshold: dict[str, Any] | None = None
        self._backlog_noted = False                 # a 'rollback deferred: queue' note was emitted
        c = self.config
        self._flap = FlapGuard(c.max_switches_per_window, c.switch_window_seconds, c.pin_after_class_relapses,
                               c.hold_seconds, c.hold_growth, c.max_hold_seconds)

    # ------------------------------------------------------------------ public
    @property
    def current(self) -> PrecisionState:
        return self._state

    def observe(self, now: float, engine: EngineSnapshot, gpu: GpuSnapshot | None = None,
                telemetry_ok: bool = True) -> list[Decision]:
        """Look at one poll of the engine (and its GPU) and return what to do.

        ``gpu`` is the engine's GPU (None for the sim/bundled engine on CPU);
        ``telemetry_ok`` False means the GPU source is down (docs/field-cases.md, NVML "Unknown
        Error"): no memory sample, so the hold clock resets. Raises ``ValueError`` if the snapshot is of another engine.
        """
        self._start_poll(now, engine.name)
        if engine.ok and engine.precision in START_ONLY_MODES:
            return []  # int4: started there, below int8 already; no degrade, no rollback
        out: list[Decision] = []
        hw = hardware_evidence(now, gpu, telemetry_ok, self.config.hardware_window_seconds,
                               self._ecc_uncorrected)
        out += self._handle_faults(now, engine, hw)
        out += self._reconcile(now, engine)
        if self._state is PrecisionState.INT8:
            out += self._track_recovery(now, engine, gpu, telemetry_ok)
        return out

    def unpin(self, now: float, who: str) -> list[Decision]:
        """Operator action: leave PINNED_INT8 for INT8 (the hold starts again, the switch
        history and relapses are cleared). Raises :class:`PolicyError` when not pinned."""
        if self._state is not PrecisionState.PINNED_INT8:
            raise PolicyError(f"engine {self.engine}: not pinned (state {self._state.value})")
        if not who:
            raise PolicyError("who: the operator's name is required to unpin")
        self._degrades.clear()
        self._relapses = 0
        self._flap.reset()
        self._hold_seconds = self.config.hold_seconds
        self._hold.reset(now, f"unpinned by {who}")
        d = self._transition(now, PrecisionState.INT8, None,
                             f"unpinned by {who}: int8 kept, rollback allowed after a "
                             f"{self._hold_seconds:g} s hold with memory recovered",
                             {"who": who, "pinned_by": self._pinned_by}, event="unpin")
        self._pinned_by = None
        return [d]

    def operator_switch(self, now: float, mode: str, who: str) -> list[Decision]:
        """An operator's manual switch (``inferctl degrade|rollback``, ``POST
        /actions/degrade|rollback``), told to the policy before the loop runs it, so the
        policy follows the operator instead of undoing the switch.

        ``mode`` ``"int8"`` (degrade): → DEGRADING, then INT8 when the engine reports int8,
        and the rollback hold starts again from there: no rollback before the hold has passed
        with memory recovered. ``"full"`` (rollback): → ROLLING_BACK, then FULL when the engine
        reports full; no automatic degrade follows without a new exhaustion OOM (an OOM within
        ``relapse_window_seconds`` is a relapse, as after an automatic rollback). A manual
        rollback also releases a pin (the switch history is kept, so a new OOM storm pins
        again). The confirmation and ``record_action_result`` rules are those of the policy's
        own switches. Operator switches are not counted by the flap guard. The decision has
        no action (the operator's call runs it) and names the operator in ``reason`` and
        ``inputs["who"]``. Raises :class:`PolicyError` for another mode or an empty ``who``.
        """
        try:
            check_precision_mode(mode, "mode")
        except ValueError as exc:
            raise PolicyError(str(exc)) from None
        if not who:
            raise PolicyError("who: the operator's name is required for a manual switch")
        self._last_now = now
        if self._since is None:
            self._since = now
        st = self._state
        inputs = {"who": who, "mode": mode, "operator": True}
        if mode == INT8:
            if st in (PrecisionState.INT8, PrecisionState.PINNED_INT8):
                self._hold.reset(now, f"manual degrade by {who}")
                return [self._note(now, None, f"{_operator(who)} asked for int8 while already in "
                                              f"{st.value}: hold restarted", inputs)]
            if st is PrecisionState.DEGRADING:
                return [self._note(now, None, f"{_operator(who)} asked for int8 while the switch "
                                              "to int8 is in progress", inputs)]
            self._last_command = now
            self._hold.reset(now, f"manual degrade by {who}")
            return [self._transition(now, PrecisionState.DEGRADING, None,
                                     f"{_operator(who)}: manual degrade to int8; rollback only "
                                     f"after a {self._hold_seconds:g} s hold with memory "
                                     "recovered", inputs, severity="warning", event="operator_degrade")]
        if st is PrecisionState.FULL:
            return [self._note(now, None, f"{_operator(who)} asked for full precision while "
                                          "already in full", inputs)]
        if st is PrecisionState.ROLLING_BACK:
            return [self._note(now, None, f"{_operator(who)} asked for full precision while the "
                                          "rollback is in progress", inputs)]
        if st is PrecisionState.PINNED_INT8:
            inputs["pinned_by"] = self._pinned_by
            self._pinned_by = None
        self._last_command = now
        self._hold.reset(now, f"manual rollback by {who}")
        return [self._transition(now, PrecisionState.ROLLING_BACK, None,
                                 f"{_operator(who)}: manual rollback to full precision"
                                 + (" (releases the pin)" if st is PrecisionState.PINNED_INT8
                                    else "") + "; no automatic degrade without a new OOM",
                                 inputs, severity="warning", event="operator_rollback")]

    def record_action_result(self, now: float, action: str, ok: bool,
                             detail: str = "") -> list[Decision]:
        """Tell the policy how a decided action went. A failed ``degrade`` returns to FULL
        (the next OOM decides again); a failed ``rollback`` returns to INT8 with the hold
        restarted. Successes need nothing: the engine's reported precision confirms them."""
        if ok:
            return []
        if action == "degrade" and self._state is PrecisionState.DEGRADING:
            return [self._transition(now, PrecisionState.FULL, None,
                                     f"degrade failed: {detail or 'no detail'}",
                                     {"action": action, "detail": detail}, severity="critical", event="degrade_failed")]
        if action == "rollback" and self._state is PrecisionState.ROLLING_BACK:
            self._hold.reset(now, "rollback failed")
            return [self._transition(now, PrecisionState.INT8, None,
                                     f"rollback failed: {detail or 'no detail'}; staying in "
                                     "int8, hold restarts", {"action": action, "detail": detail},
                                     severity="warning", event="rollback_failed")]
        return []

    def state(self, now: float | None = None) -> dict[str, Any]:
        """A plain dict for ``/status``: state, since, hold (required seconds), hold_started,
        held_seconds, relapses, switches in the last hour, pinned, last fault, last reset of
        the hold clock and the last rollback threshold."""
        now = self._last_now if now is None else now
        self._trim(now)
        return {"policy": POLICY, "engine": self.engine, "state": self._state.value, "since": self._since,
                "hold_seconds": self._hold_seconds, "hold_started": self._hold.since,
                "held_seconds": None if now is None else self._hold.held(now),
                "relapses": self._relapses, "switches_last_hour": len(self._degrades),
                "max_switches_per_hour": self.config.max_switches_per_hour,
                "pinned": self._state is PrecisionState.PINNED_INT8,
                "last_fault": self._last_fault, "last_hold_reset": self._hold.last_reset,
                "threshold": self._last_threshold, "pinned_by": self._pinned_by,
                **({} if now is None else self._flap.state(now))}

    def gauges(self, now: float) -> list[Gauge]:
        """``inferctl_precision_pinned`` (1 while pinned in int8, else 0) and
        ``inferctl_rollback_hold_seconds`` (the current hold before a rollback, seconds)."""
        pinned = 1.0 if self._state is PrecisionState.PINNED_INT8 else 0.0
        return [Gauge("inferctl_precision_pinned", pinned),
                Gauge("inferctl_rollback_hold_seconds", self._hold_seconds),
                Gauge("inferctl_precision_switches_in_window", float(self._flap.count(now))),
                Gauge("inferctl_precision_max_switches_per_window", float(self.config.max_switches_per_window))]

    # ------------------------------------------------------------------ faults
    def _new_faults(self, now: float, engine: EngineSnapshot) -> list[Mapping[str, Any]]:
        fresh = []
        for f in engine.faults or []:
            if not isinstance(f, Mapping):
                continue
            key = (f.get("time"), f.get("id"), None if f.get("id") is not None
                   else f.get("message"))
            try:
                hash(key)
            except TypeError:       # a list or dict where a number was expected
                key = repr(key)
            if key in self._seen:
                continue
            self._seen[key] = now
            t = validate_nonneg(f.get("time")).value
            if t is not None and now - t > self.config.fault_max_age_seconds:
                continue   # history (e.g. faults from before the controller started)
            fresh.append(f)
        fresh.sort(key=lambda f: (validate_nonneg(f.get("time")).value or 0.0,
                                  validate_nonneg(f.get("id")).value or 0.0))
        horizon = now - max(self.config.fault_max_age_seconds, HOUR) * 2
        for k in [k for k, seen in self._seen.items() if seen < horizon]:
            del self._seen[k]
        return fresh

    def _handle_faults(self, now: float, engine: EngineSnapshot,
                       hw: list[str]) -> list[Decision]:
        out: list[Decision] = []
        exhaustion: list[dict[str, Any]] = []
        for f in self._new_faults(now, engine):
            nums, origin = fault_numbers(f)
            text_hw = hardware_fault_evidence(f.get("message"))
            kind = f.get("kind") if f.get("kind") in ("exhaustion", "fragmentation",
                                                       "impossible", "hardware") else None
            evidence = ([f"fault text mentions {text_hw!r}"] if text_hw else []) + hw
            if kind == "hardware" and not evidence:
                evidence = ["the engine classified the fault as hardware"]
            if evidence:
                kind_for_record = "hardware"
            else:
                kind_for_record = kind or classify_oom(nums) or "exhaustion"
            inputs = fault_inputs(f, nums, kind_for_record)
            inputs["numbers_from"] = origin
            self._last_fault = {k: inputs[k] for k in ("fault_id", "fault_time", "kind",
                                                       "requested", "free")}
            if evidence:
                inputs.update({"hardware_evidence": evidence, "handoff": "hardware"})
                out.append(self._note(
                    now, None, f"hardware fault, not an int8 trigger even though the engine "
                    f"reported {f.get('kind') or 'an OOM'}: {'; '.join(evidence)}; handed to "
                    "the hardware policy", inputs, severity="critical"))
            elif kind_for_record == "impossible":
                out.append(self._note(
                    now, None, f"rejected request: {inputs['requested']} requested exceeds the "
                    f"device's total {format_bytes(nums.total_bytes)}; no switch, no retry",
                    inputs, severity="warning"))
            elif kind_for_record == "fragmentation":
                out.append(self._compact(now, inputs))
            else:
                if kind is None and kind_for_record == "exhaustion" and \
                        classify_oom(nums) is None:
                    inputs["kind_note"] = "kind unknown; treated as exhaustion"
                exhaustion.append(inputs)
        if exhaustion:
            out += self._on_exhaustion(now, exhaustion)
        return out

    def _compact(self, now: float, inputs: dict[str, Any]) -> Decision:
        recurrence = (self._last_compact is not None
                      and now - self._last_compact <= self.config.compact_window_seconds)
        if recurrence and self.fragmentation is not None:
            self._last_compact = now
            return self.fragmentation.request_restart(
                now, f"fragmentation OOM recurred within {self.config.compact_window_seconds:g} s "
                     "of a compaction (reserved-but-unallocated >= requested)", inputs)
        self._last_compact = now
        why = ("fragmentation OOM: reserved-but-unallocated "
               f"{format_bytes(inputs.get('reserved_unallocated_bytes'))} >= requested "
               f"{inputs['requested']}; release the allocator cache, no precision switch")
        if recurrence:
            why += " (recurred after a compaction; no fragmentation policy to restart)"
        return self._note(now, "compact", why, inputs, severity="warning")

    def _on_exhaustion(self, now: float, faults: list[dict[str, Any]]) -> list[Decision]:
        """One decision for all the exhaustion OOMs of this poll, with the newest's numbers."""
        newest_inputs = dict(faults[-1])
        newest_inputs["fault_ids"] = [f["fault_id"] for f in faults]
        st = self._state
        if st in (PrecisionState.FULL, PrecisionState.ROLLING_BACK):
            return [self._degrade(now, newest_inputs)]
        self._hold.reset(now, "new OOM")
        where = {"degrading": "while the switch to int8 is in progress",
                 "int8": "in int8", "pinned_int8": "while pinned in int8"}[st.value]
        return [self._note(now, None, f"OOM {where}: {newest_inputs['requested']} requested, "
                                      f"{newest_inputs['free']} free; no further switch, "
                                      "rollback hold restarted", newest_inputs,
                           severity="warning")]

    def _degrade(self, now: float, inputs: dict[str, Any]) -> Decision:
        relapse = self._state is PrecisionState.ROLLING_BACK or (
            self._last_rollback_done is not None
            and now - self._last_rollback_done <= self.config.relapse_window_seconds)
        if relapse:
            self._relapses += 1
            self._hold_seconds = min(self.config.hold_seconds
                                     * self.config.hold_growth ** self._relapses,
                                     self.config.max_hold_seconds)
        else:
            self._relapses = 0
            self._hold_seconds = self.config.hold_seconds
        cls = size_class(inputs)
        class_hold, pin_why = self._flap.on_degrade(now, cls, relapse)
        self._hold_seconds = max(self._hold_seconds, class_hold)
        self._trim(now)
        self._degrades.append(now)
        self._hold.reset(now, "degrade")
        self._last_command = now
        inputs = {**inputs, "relapse": relapse, "relapses": self._relapses,
                  "next_hold_seconds": self._hold_seconds,
                  "switches_last_hour": len(self._degrades),
                  "max_switches_per_hour": self.config.max_switches_per_hour, "size_class": cls,
                  "class_relapses": self._flap.relapses.get(cls, 0),
                  "switches_in_window": self._flap.count(now)}
        words = (f"exhaustion OOM: {inputs['requested']} requested, {inputs['free']} free "
                 f"of {format_bytes(inputs.get('total_bytes'))}")
        if relapse:
            words += (f"; relapse #{self._relapses} after a rollback, next hold "
                      f"{self._hold_seconds:g} s")
        if len(self._degrades) > self.config.max_switches_per_hour or pin_why:
            why = pin_why or (f"{len(self._degrades)} degrades in the last hour > "
                              f"{self.config.max_switches_per_hour}")
            self._pinned_by = f"flap guard: {why}"
            return self._transition(
                now, PrecisionState.PINNED_INT8, "degrade",
                f"{words}; {why}: pinned in int8 until an operator unpins",
                inputs, severity="critical", event="flap_guard")
        return self._transition(now, PrecisionState.DEGRADING, "degrade",
                                f"{words}: switch to int8", inputs, severity="warning", event="exhaustion_oom")

    # ------------------------------------------------------------------ reconcile
    def _reconcile(self, now: float, engine: EngineSnapshot) -> list[Decision]:
        if not engine.ok:
            return []
        prec = engine.precision
        st = self._state
        timed_out = (self._last_command is None
                     or now - self._last_command >= self.config.confirm_timeout_seconds)
        inputs = {"engine_precision": prec}
        if st is PrecisionState.DEGRADING:
            if prec == INT8:
                self._hold.reset(now, "int8 confirmed; hold starts with the next good sample")
                return [self._transition(now, PrecisionState.INT8, None,
                                         "engine reports int8: degrade confirmed", inputs, event="engine_int8")]
            if prec is None:
                self._hold.reset(now, "int8 assumed")
                return [self._transition(now, PrecisionState.INT8, None,
                                         "engine does not report its precision: degrade "
                                         "assumed applied", inputs, severity="warning", event="precision_unreported")]
            if timed_out:
                self._last_command = now
                return [self._note(now, "degrade", f"engine still reports {prec} "
                                   f"{self.config.confirm_timeout_seconds:g} s after the "
                                   "degrade: asking again", inputs, severity="warning")]
        elif st is PrecisionState.ROLLING_BACK:
            if prec in (FULL, None):
                self._last_rollback_done = now
                why = ("engine reports full: rollback confirmed" if prec == FULL else
                       "engine does not report its precision: rollback assumed applied")
                event = "engine_full" if prec == FULL else "precision_unreported"
                return [self._transition(now, PrecisionState.FULL, None, why, inputs, event=event)]
            if timed_out:
                self._hold.reset(now, "rollback not confirmed")
                return [self._transition(now, PrecisionState.INT8, None,
                                         f"engine still reports {prec} "
                                         f"{self.config.confirm_timeout_seconds:g} s after the "
                                         "rollback: staying in int8, hold restarts", inputs,
                                         severity="warning", event="confirm_timeout")]
        elif st is PrecisionState.INT8 and prec == FULL:
            self._last_command = now
            return [self._transition(now, PrecisionState.DEGRADING, "degrade",
                                     "engine reports full while the policy holds int8 (engine "
                                     "restarted?): re-applying int8", inputs,
                                     severity="warning", event="engine_full")]
        elif st is PrecisionState.PINNED_INT8 and prec == FULL and timed_out:
            self._last_command = now
            return [self._note(now, "degrade", "engine reports full while pinned in int8: "
                               "re-applying int8", inputs, severity="critical")]
        elif st is PrecisionState.FULL and prec == INT8:
            self._hold.reset(now, "adopted int8")
            return [self._transition(now, PrecisionState.INT8, None,
                                     "engine reports int8 without a policy degrade (operator "
                                     "or startup): adopted; rollback after the hold", inputs, event="engine_int8")]
        return []

    # ------------------------------------------------------------------ recovery
    def _track_recovery(self, now: float, engine: EngineSnapshot, gpu: GpuSnapshot | None,
                        telemetry_ok: bool) -> list[Decision]:
        sample, why = memory_sample(self.config, engine, gpu, telemetry_ok, self.counter)
        if sample is None:
            self._hold.update(now, False, why)
            return []
        self._last_threshold = sample
        ok = sample["headroom_bytes"] >= sample["threshold_bytes"]
        self._hold.update(now, ok, None if ok else
                          f"free {sample['free']} + reusable allocator cache "
                          f"{format_bytes(sample['reclaimable_bytes'])} < threshold {sample['threshold']}")
        held = self._hold.held(now)
        if not ok or held < self._hold_seconds:
            self._backlog_noted = False
            return []
        backlog = queue_backlog(engine)
        if backlog is not None:     # the hold stands; the rollback waits for the queue to empty
            first, self._backlog_noted = not self._backlog_noted, True
            why = (f"rollback deferred: {backlog} requests waiting in the engine's queue (they may be the prompts "
                   "that ran out of memory in full precision); switch back when it is empty")
            return [self._note(now, None, why, {**sample, "waiting": backlog})] if first else []
        self._backlog_noted = False
        if not self._flap.rollback_room(now):
            if self._flap.deferred_since is not None:
                return []
            self._flap.deferred_since = now
            return [self._note(now, None, f"rollback deferred: {self._flap.count(now)} automatic switches within "
                                          f"{self.config.switch_window_seconds:g} s leave no room for a relapse under "
                                          f"the cap {self.config.max_switches_per_window}", sample, "warning")]
        self._flap.deferred_since = None
        self._flap.record(now)
        self._last_command = now
        inputs = {**sample, "held_seconds": held, "hold_seconds": self._hold_seconds,
                  "relapses": self._relapses, "waiting": engine.waiting}
        return [self._transition(now, PrecisionState.ROLLING_BACK, "rollback",
                                 rollback_reason(sample, held, self._hold_seconds), inputs,
                                 event="memory_recovered")]

    # ------------------------------------------------------------------ helpers
    def _trim(self, now: float | None) -> None:
        while now is not None and self._degrades and now - self._degrades[0] >= HOUR:
            self._degrades.popleft()

    def _transition(self, now: float, to: PrecisionState, action: str | None, reason: str,
                    inputs: dict[str, Any], severity: str = "info", *, event: str) -> Decision:
        """Move to ``to`` on ``event`` (a declared transition, else :class:`TransitionError`)."""
        frm = self._state
        self.check_transition(frm, event, to)
        self._state = to
        self._since = now
        return Decision(POLICY, self.engine or "", action, frm.value, to.value, reason,
                        dict(inputs), severity)

    def _note(self, now: float, action: str | None, reason: str, inputs: dict[str, Any],
              severity: str = "info") -> Decision:
        return Decision(POLICY, self.engine or "", action, self._state.value, self._state.value, reason,
                        dict(inputs), severity)
