"""Hardware health policy: Xid / ECC / lost GPU → restart, drain + reset, or isolate + reboot.

Hardware faults are never an int8 trigger. Xid → action is NVIDIA's catalogue
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): a mapping or callable
(``XidCatalog.action``), else ``hardware_config.DEFAULT_XID_ACTIONS``.

Per-GPU states: :data:`TRANSITIONS` (docs/policies.md). A restart-class Xid degrades a GPU; a
reset-class fault (Xid, uncorrectable ECC standing at first sight or growing — a counter: a
decrease is a reset —, recovery action 1/4, pending row remap or page retirement) drains,
resets and verifies it; a lost GPU (GpuIsLost, Xid 79), a reboot-class Xid, recovery action 2,
a failed row remap, a failed or timed-out reset, a fault while verifying or a second reset
within ``reset_min_interval_seconds`` isolates it (a lost GPU is never reset: reboot). An engine
fault handed over on a GPU with a standing fault (``hardware_state``) is a hardware fault. A
correctable-ECC storm is a warning with its rate, nothing more. ``state()`` says per GPU whether
it is fit for routing. Telemetry down decides nothing (every timer waits). Decides only.
"""

from __future__ import annotations

import enum
import re
from collections import deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from inferctl.controller.policies.base import GpuPolicy
from inferctl.controller.policies.common import PolicyError, config_from_mapping
from inferctl.controller.policies.hardware_state import (CounterRate, blocking, counter_increase,
                                                         standing_faults, storm_change)
from inferctl.controller.types import Decision, EngineSnapshot, GpuReading, GpuSnapshot, XidEvent
from inferctl.controller.policies.hardware_config import (  # noqa: F401  (re-exported)
    _ALIASES, _KNOWN, DEFAULT_XID_ACTIONS, IGNORE, REBOOT_NODE, RESET_GPU, RESTART_ENGINE, SEEN_RETENTION_SECONDS,
    UNKNOWN, HardwareConfig, normalize_action)

POLICY = "hardware"

_LOST_TEXT = re.compile(r"fallen off the bus|gpu ?is ?lost|gpuislost", re.IGNORECASE)
_XID_TEXT = re.compile(r"\bxid\b\D{0,40}?(\d{1,3})\b", re.IGNORECASE)
_ECC_TEXT = re.compile(r"uncorrectable ecc|double bit ecc|uncorrectable error", re.IGNORECASE)


class GpuHealth(str, enum.Enum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    DRAINING = "draining"
    RESETTING = "resetting"
    VERIFYING = "verifying"
    ISOLATED = "isolated"


_H = GpuHealth
#: (state, event) → state: every state change of a GPU (docs/policies.md).
TRANSITIONS: Mapping[tuple[GpuHealth, str], GpuHealth] = {
    (_H.HEALTHY, "restart_fault"): _H.DEGRADED,
    (_H.HEALTHY, "unknown_fault"): _H.DEGRADED,
    (_H.DEGRADED, "quiet"): _H.HEALTHY,
    (_H.HEALTHY, "reset_fault"): _H.DRAINING,
    (_H.DEGRADED, "reset_fault"): _H.DRAINING,
    (_H.DRAINING, "drained"): _H.RESETTING,
    (_H.RESETTING, "reset_ok"): _H.VERIFYING,
    (_H.VERIFYING, "verified"): _H.HEALTHY,
    **{(s, "isolate"): _H.ISOLATED for s in _H if s is not _H.ISOLATED},
    (_H.ISOLATED, "release"): _H.HEALTHY,
}


@dataclass
class _Gpu:
    uuid: str
    index: int | None = None
    pci: str | None = None
    state: GpuHealth = GpuHealth.HEALTHY
    since: float = 0.0
    reason: str = ""
    ecc_uncorrected: int | None = None
    recovery_action: int | None = None
    remap_pending: bool | None = None
    retire_pending: bool | None = None
    standing: dict = field(default_factory=dict)      # kind -> words (hardware_state.standing_faults)
    ecc_rate: CounterRate | None = None               # correctable errors per second
    storm: bool = False                               # a correctable-error storm is being reported
    ecc_corrected_rate: float | None = None
    last_fault: float | None = None
    last_reset: float | None = None
    phase_started: float | None = None
    dry_run_at: float | None = None      # the decided reset ran as a dry run (nothing was reset)
    restart_faults: deque = field(default_factory=deque)
    seen_events: dict = field(default_factory=dict)   # dedupe key -> time


@dataclass
class _Finding:
    """One new fault on one GPU: what it asks for and why."""

    action: str              # lost, isolate, reboot_node, reset_gpu, restart_engine, unknown, ignore
    reason: str
    inputs: dict[str, Any]


_RANK = MappingProxyType({"lost": 6, REBOOT_NODE: 5, "isolate": 4, RESET_GPU: 3,
                          RESTART_ENGINE: 2, UNKNOWN: 1, IGNORE: 0})


class HardwarePolicy(GpuPolicy):
    """Hardware health of every GPU. Pure: ``now`` comes from the caller. Its state changes
    are :data:`TRANSITIONS`.

    ``xid_actions``: mapping Xid → action or a callable ``(xid) -> action`` (None: the
    built-in table). ``gpu_engines``: which engines run on which GPU, keyed by GPU UUID or
    index (int or str); their names are the targets of drain/restart/undrain decisions.
    """

    NAME = POLICY
    TRANSITIONS = TRANSITIONS

    def __init__(self, xid_actions: Mapping[int, Any] | Callable[[int], Any] | None = None,
                 config: HardwareConfig | Mapping[str, Any] | None = None, *,
                 gpu_engines: Mapping[Any, Sequence[str]] | None = None) -> None:
        if xid_actions is None:
            xid_actions = DEFAULT_XID_ACTIONS
        if not callable(xid_actions) and not isinstance(xid_actions, Mapping):
            raise ValueError("xid_actions: expected a mapping Xid -> action or a callable")
        self._xid_actions = xid_actions
        self.config = config_from_mapping(HardwareConfig, config)
        self._gpu_engines = {str(k): list(v) for k, v in (gpu_engines or {}).items()}
        self._gpus: dict[str, _Gpu] = {}
        self._telemetry_down_since: float | None = None
        self._telemetry_error: str | None = None
        self._new_xids: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ public
    def take_xid_events(self) -> list[dict[str, Any]]:
        """The Xid reports from GPU readings that this policy counted as new since the last
        call — after its deduplication (the same report polled again, one fault reported by
        two sources within ``xid_duplicate_seconds``, the two kernel "fallen off the bus" lines
        of docs/field-cases.md within ``xid_dedupe_seconds``) — each ``{"gpu_index", "uuid",
        "xid", "action"}`` with ``xid`` 79 for a lost GPU whose report has no code and ``action`` the catalogue's
        (``reboot_node`` for a lost GPU). The list is emptied (for
        ``inferctl_gpu_xid_events_total``)."""
        out, self._new_xids = self._new_xids, []
        return out

    def xid_action(self, xid: int | None) -> str:
        """The action for an Xid code (``unknown`` when the catalogue has none); 79 is always
        a lost GPU, whatever the catalogue says."""
        if xid is None:
            return UNKNOWN
        if xid == 79:
            return REBOOT_NODE
        if callable(self._xid_actions) and not isinstance(self._xid_actions, Mapping):
            return normalize_action(self._xid_actions(xid))
        m = self._xid_actions
        return normalize_action(m.get(xid, m.get(str(xid))))

    def observe(self, now: float, reading: GpuReading,
                engines: Mapping[str, EngineSnapshot] | None = None) -> list[Decision]:
        """One GPU poll (all GPUs) → decisions. ``engines`` (latest snapshots by name) tells
        whether a draining GPU's engines are drained. Telemetry down → no decision."""
        if not reading.ok:
            if self._telemetry_down_since is None:
                self._telemetry_down_since = now
            self._telemetry_error = reading.error
            return []
        self._telemetry_down_since = None
        self._telemetry_error = None
        out: list[Decision] = []
        for uuid, snap in reading.gpus.items():
            g = self._gpu(uuid, snap)
            out += self._apply(now, g, self._findings(now, g, snap), engines or {})
            out += self._storm(now, g, snap)
        return out

    def report_fault(self, now: float, gpu_uuid: str, text: str) -> list[Decision]:
        """An engine-reported fault whose text points at the hardware (e.g. handed over by
        the precision policy): the Xid number, "fallen off the bus"/"GPU is lost" or
        "uncorrectable ECC" in ``text`` are treated like the GPU's own reports."""
        g = self._gpu(gpu_uuid, None)
        xid = None
        m = _XID_TEXT.search(text or "")
        if m:
            xid = int(m.group(1))
        lost = bool(_LOST_TEXT.search(text or ""))
        findings: list[_Finding] = []
        if lost or xid is not None:
            ev = XidEvent(xid=79 if lost and xid is None else xid, pci_bus_id=g.pci,
                          message=text, time=now, source="engine", lost=lost)
            f = self._xid_finding(now, g, ev)
            if f is not None:
                findings.append(f)
        elif _ECC_TEXT.search(text or ""):
            findings.append(_Finding(RESET_GPU, f"engine reported an uncorrectable ECC error: "
                                                f"{text}", {"text": text}))
        if not findings and g.standing:
            worst = "isolate" if "row_remap_failure" in g.standing else RESET_GPU
            findings.append(_Finding(worst, "engine fault on a GPU with a standing fault ("
                                            + "; ".join(g.standing.values()) + f"): {text}",
                                     {"text": text, "standing_faults": sorted(g.standing)}))
        if not findings:
            return []
        return self._apply(now, g, findings, {})

    def record_action_result(self, now: float, gpu_uuid: str, action: str, ok: bool,
                             detail: str = "") -> list[Decision]:
        """Result of a decided ``reset_gpu``: success → VERIFYING; failure (or refused by
        the rails) → ISOLATED with a node-reboot escalation."""
        g = self._gpus.get(gpu_uuid)
        if g is None or action != RESET_GPU or g.state is not GpuHealth.RESETTING:
            return []
        if ok:
            g.last_reset = now
            # reports after a reset are new faults, whatever their code
            g.seen_events = {k: v for k, v in g.seen_events.items() if k[0] == "exact"}
            return [self._move(now, g, GpuHealth.VERIFYING, None,
                               f"reset succeeded ({detail or 'no detail'}): verifying for "
                               f"{self.config.verify_seconds:g} s", {"detail": detail}, event="reset_ok")]
        return self._isolate(now, g, f"GPU reset failed: {detail or 'no detail'}",
                             {"detail": detail}, reboot=True)

    def record_dry_run(self, now: float, gpu_uuid: str, action: str,
                       detail: str = "") -> list[Decision]:
        """A decided ``reset_gpu`` ran as a dry run (``rails.dry_run``): nothing was reset, so
        nothing moves — no VERIFYING, no ``last_reset``, no undrain. The GPU stays in RESETTING
        (its engines drained) without the reset timeout's isolation (a dry run is an answer,
        not a missing one) until a new finding moves it or a person acts; the decision
        (action None, warning, ``inputs.outcome = "dry_run"``) records it."""
        g = self._gpus.get(gpu_uuid)
        if g is None or action != RESET_GPU or g.state is not GpuHealth.RESETTING:
            return []
        g.dry_run_at = now
        g.reason = (f"dry run (rails.dry_run): the reset was not performed; stays {g.state.value}"
                    " until a real reset or a person acts")
        return [self._note(g, None, f"reset_gpu of GPU {self._label(g)} was a dry run (rails.dry_run): "
                                    f"nothing was reset ({detail or 'no detail'}); the hardware state stays "
                                    f"{g.state.value}", {"outcome": "dry_run", "detail": detail}, "warning")]

    def release(self, now: float, gpu_uuid: str, who: str) -> list[Decision]:
        """Operator action after repair/reboot: ISOLATED → HEALTHY, with the GPU's history
        cleared — the last reset (so the next reset-worthy fault drains and resets instead of
        isolating for ``reset_min_interval_seconds``), the restart-class fault count, the
        last fault, the phase timer and the ECC baseline. Reports already seen stay seen (a
        source re-sending an old Xid 79 does not isolate it again). Raises
        :class:`PolicyError` when the GPU is not isolated or ``who`` is empty."""
        g = self._gpus.get(gpu_uuid)
        if g is None or g.state is not GpuHealth.ISOLATED:
            raise PolicyError(f"gpu {gpu_uuid}: not isolated")
        if not who:
            raise PolicyError("who: the operator's name is required")
        g.ecc_uncorrected = None
        g.last_reset = None
        g.last_fault = None
        g.phase_started = None
        g.restart_faults.clear()
        return [self._move(now, g, GpuHealth.HEALTHY, None, f"released by {who}",
                           {"who": who}, event="release")]

    def gpu_state(self, gpu_uuid: str) -> str | None:
        """The GPU's state name, ``telemetry_down`` while the source is down, None if unknown."""
        g = self._gpus.get(gpu_uuid)
        return "telemetry_down" if self._telemetry_down_since is not None else None if g is None else g.state.value

    def _routing(self, g: _Gpu) -> dict[str, Any]:
        """``{"routable", "routing_reason"}``: a GPU is fit for routing in HEALTHY or DEGRADED
        (a restart-class fault) with no blocking standing fault (hardware_state.BLOCKING_KINDS)."""
        block = blocking(g.standing)
        if g.state not in (GpuHealth.HEALTHY, GpuHealth.DEGRADED):
            return {"routable": False, "routing_reason": f"GPU {g.state.value}: {g.reason}"}
        if block:
            return {"routable": False, "routing_reason": "standing fault: " + "; ".join(block.values())}
        return {"routable": True, "routing_reason": None}

    def engine_routing(self) -> dict[str, dict[str, Any]]:
        """Per engine mapped to a known GPU: ``{"routable", "reason", "gpu"}`` (an engine on
        several GPUs is routable only if all are). Telemetry down keeps the last verdict."""
        out: dict[str, dict[str, Any]] = {}
        for g in self._gpus.values():
            r = self._routing(g)
            for e in self._engines_of(g):
                if e not in out or out[e]["routable"]:
                    out[e] = {"routable": r["routable"], "reason": r["routing_reason"], "gpu": g.uuid}
        return out

    def state(self, now: float | None = None) -> dict[str, Any]:
        """A plain dict for ``/status``: telemetry and every GPU's state (``now`` unused; every
        policy's ``state`` takes it)."""
        down = self._telemetry_down_since is not None
        return {
            "policy": POLICY,
            "telemetry": {"up": not down, "down_since": self._telemetry_down_since,
                          "error": self._telemetry_error},
            "gpus": {u: {"index": g.index, "pci_bus_id": g.pci,
                         "state": "telemetry_down" if down else g.state.value,
                         "policy_state": g.state.value, "since": g.since, "reason": g.reason,
                         "last_reset": g.last_reset, "engines": self._engines_of(g),
                         "standing_faults": dict(g.standing), "ecc_corrected_per_second": g.ecc_corrected_rate,
                         "correctable_storm": g.storm, **self._routing(g)}
                     for u, g in self._gpus.items()},
        }

    # ------------------------------------------------------------------ findings
    def _gpu(self, uuid: str, snap: GpuSnapshot | None) -> _Gpu:
        g = self._gpus.get(uuid)
        if g is None:
            g = self._gpus[uuid] = _Gpu(uuid)
        if snap is not None:
            g.index = snap.index if snap.index is not None else g.index
            g.pci = snap.pci_bus_id or g.pci
        return g

    def _engines_of(self, g: _Gpu) -> list[str]:
        for key in (g.uuid, None if g.index is None else str(g.index)):
            if key is not None and key in self._gpu_engines:
                return list(self._gpu_engines[key])
        return []

    def _xid_finding(self, now: float, g: _Gpu, ev: XidEvent) -> _Finding | None:
        lost = bool(getattr(ev, "lost", False)) or ev.xid == 79 or \
            bool(_LOST_TEXT.search(ev.message or ""))
        pci = ev.pci_bus_id or g.pci
        key = (pci, "lost") if lost else (pci, ev.xid)
        t = ev.time or now
        prev = g.seen_events.get(key)
        exact = ("exact", ev.xid, ev.time, ev.message, ev.pci_bus_id)
        if exact in g.seen_events:
            return None
        g.seen_events[exact] = t
        window = self.config.xid_dedupe_seconds if lost else self.config.xid_duplicate_seconds
        if prev is not None and abs(t - prev) <= window:
            return None           # the same fault reported again (another line / source)
        g.seen_events[key] = t
        inputs = {"xid": ev.xid, "message": ev.message, "pci_bus_id": pci,
                  "xid_source": getattr(ev, "source", None), "xid_time": ev.time}
        if lost:
            return _Finding("lost", f"GPU fell off the bus / is lost (Xid {ev.xid}: "
                                    f"{ev.message})", inputs)
        action = self.xid_action(ev.xid)
        inputs["catalogue_action"] = action
        return _Finding(action, f"Xid {ev.xid} ({ev.message}): catalogue action {action}",
                        inputs)

    def _findings(self, now: float, g: _Gpu, snap: GpuSnapshot) -> list[_Finding]:
        out: list[_Finding] = []
        horizon = now - max(self.config.xid_dedupe_seconds, SEEN_RETENTION_SECONDS)
        for k in [k for k, t in g.seen_events.items() if t < horizon]:
            del g.seen_events[k]
        if snap.lost or (snap.health or "").lower() == "lost":
            key = (g.pci, "lost")
            prev = g.seen_events.get(key)
            if prev is None or now - prev > self.config.xid_dedupe_seconds:
                g.seen_events[key] = now
                out.append(_Finding("lost", "the GPU source reports the GPU lost "
                                            "(NVML GpuIsLost)", {"source_health": snap.health}))
            elif g.state is not GpuHealth.ISOLATED:
                out.append(_Finding("lost", "the GPU source reports the GPU lost",
                                    {"source_health": snap.health}))
        for ev in snap.xid_events:
            f = self._xid_finding(now, g, ev)
            if f is not None:
                out.append(f)
                lost = f.action == "lost"
                code = ev.xid if ev.xid is not None else (79 if lost else None)
                self._new_xids.append({"gpu_index": g.index, "uuid": g.uuid, "xid": code,
                                       "action": REBOOT_NODE if lost else f.action})
        out += self._ecc_findings(g, snap)
        ra = snap.recovery_action
        if ra != g.recovery_action:
            if ra in (1, 4):
                out.append(_Finding(RESET_GPU, f"NVML recovery action {ra} "
                                               f"({'reset' if ra == 1 else 'drain and reset'})",
                                    {"recovery_action": ra}))
            elif ra == 2:
                out.append(_Finding(REBOOT_NODE, "NVML recovery action 2 (node reboot)",
                                    {"recovery_action": ra}))
            elif ra == 3:
                out.append(_Finding(UNKNOWN, "NVML recovery action 3 (drain peer-to-peer)",
                                    {"recovery_action": ra}))
            g.recovery_action = ra
        if snap.remapped_rows_failure and g.state is not GpuHealth.ISOLATED:
            out.append(_Finding("isolate", "row remapping failed: the GPU needs service",
                                {"remapped_rows_failure": True}))
        if snap.remapped_rows_pending and not g.remap_pending:
            out.append(_Finding(RESET_GPU, "row remapping pending: applied at the next reset",
                                {"remapped_rows_pending": True}))
        g.remap_pending = snap.remapped_rows_pending
        if snap.retired_pages_pending and not g.retire_pending:
            out.append(_Finding(RESET_GPU, "pages pending retirement: applied at the next reset",
                                {"retired_pages_pending": True}))
        g.retire_pending = snap.retired_pages_pending
        g.standing = standing_faults(snap)
        return out

    def _ecc_findings(self, g: _Gpu, snap: GpuSnapshot) -> list[_Finding]:
        """Uncorrectable ECC as a counter: standing errors at first sight (volatile > 0: not
        reset since they happened) and any increase ask for a reset; a decrease is a counter
        reset (driver reload, GPU reset), noted, never negative errors."""
        ecc = snap.ecc_uncorrected
        if not isinstance(ecc, int) or isinstance(ecc, bool) or ecc < 0:
            return []
        prev, g.ecc_uncorrected = g.ecc_uncorrected, ecc
        info = {"ecc_uncorrected_before": prev, "ecc_uncorrected": ecc}
        if prev is None:
            return [_Finding(RESET_GPU, f"standing fault: {ecc} uncorrectable ECC error(s) since the last "
                                        "driver load", info)] if ecc > 0 else []
        inc, reset = counter_increase(prev, ecc)
        out = []
        if reset:
            out.append(_Finding(IGNORE, f"volatile uncorrectable ECC counter went {prev} -> {ecc}: a counter "
                                        "reset (driver reload or GPU reset), not negative errors", info))
        if inc:
            out.append(_Finding(RESET_GPU, f"uncorrectable ECC errors grew {prev} -> {ecc}"
                                + (" after a counter reset" if reset else ""), info))
        return out

    def _storm(self, now: float, g: _Gpu, snap: GpuSnapshot) -> list[Decision]:
        """Correctable-error storm: a warning with the rate (errors/s over the window) when the
        rate first reaches the threshold, an info note when it falls back; never a state
        change, never a reset."""
        cfg = self.config
        if g.ecc_rate is None:
            g.ecc_rate = CounterRate(cfg.ecc_correctable_window_seconds)
        rate = g.ecc_rate.update(now, snap.ecc_corrected)
        if rate is None:
            return []
        g.ecc_corrected_rate = rate
        change = storm_change(rate, g.storm, cfg.ecc_correctable_storm_per_second,
                              cfg.ecc_correctable_window_seconds)
        if change is None:
            return []
        g.storm, severity, words = change
        return [self._note(g, None, words, {"ecc_corrected_per_second": rate, "ecc_corrected": snap.ecc_corrected,
                                            "window_seconds": cfg.ecc_correctable_window_seconds}, severity)]

    # ------------------------------------------------------------------ transitions
    def _apply(self, now: float, g: _Gpu, findings: list[_Finding],
               engines: Mapping[str, EngineSnapshot]) -> list[Decision]:
        out: list[Decision] = []
        if g.state is GpuHealth.ISOLATED:
            return out
        for f in findings:
            if f.action == IGNORE:
                out.append(self._note(g, None, f"{f.reason}: no action", f.inputs))
        serious = [f for f in findings if f.action != IGNORE]
        if serious:
            g.last_fault = now
            worst = max(serious, key=lambda f: _RANK[f.action])
            inputs = {**worst.inputs, "findings": [f.reason for f in serious]}
            out += self._on_fault(now, g, worst, inputs)
        out += self._timers(now, g, engines, bool(serious))
        return out

    def _on_fault(self, now: float, g: _Gpu, f: _Finding, inputs: dict) -> list[Decision]:
        st = g.state
        if f.action == "lost":
            return self._isolate(now, g, f.reason + "; never reset a lost GPU",
                                 {**inputs, "gpu_lost": True}, reboot=True)
        if f.action == REBOOT_NODE:
            return self._isolate(now, g, f.reason, inputs, reboot=True)
        if f.action == "isolate":
            return self._isolate(now, g, f.reason, inputs, reboot=False)
        if st is GpuHealth.VERIFYING:
            return self._isolate(now, g, f"{f.reason} while verifying a reset: the reset did "
                                         "not help", inputs, reboot=True)
        if st in (GpuHealth.DRAINING, GpuHealth.RESETTING):
            return [self._note(g, None, f"{f.reason} (reset already in progress)", inputs,
                               "warning")]
        if f.action == RESET_GPU:
            return self._start_reset(now, g, f.reason, inputs)
        if f.action == RESTART_ENGINE:
            g.restart_faults.append(now)
            while g.restart_faults and now - g.restart_faults[0] > self.config.degraded_clear_seconds:
                g.restart_faults.popleft()
            if len(g.restart_faults) >= self.config.restart_escalate_count:
                return self._start_reset(
                    now, g, f"{f.reason}; {len(g.restart_faults)} restart-class faults within "
                            f"{self.config.degraded_clear_seconds:g} s: escalate to a GPU reset",
                    inputs)
            engines = self._engines_of(g)
            out = [self._move(now, g, GpuHealth.DEGRADED, None,
                              f"{f.reason}: restart the engine(s) on this GPU", inputs,
                              "warning", event="restart_fault")] if st is not GpuHealth.DEGRADED else \
                [self._note(g, None, f"{f.reason}: restart the engine(s) on this GPU", inputs,
                            "warning")]
            if not engines:
                out.append(self._note(g, None, "no engine is mapped to this GPU: nothing to "
                                               "restart", inputs, "warning"))
            out += [Decision(POLICY, e, RESTART_ENGINE, None, None,
                             f"GPU {self._label(g)}: {f.reason}", dict(inputs), "warning")
                    for e in engines]
            return out
        # unknown: a person has to look (NVIDIA: contact support / investigate)
        if st is GpuHealth.HEALTHY:
            return [self._move(now, g, GpuHealth.DEGRADED, None,
                               f"{f.reason}: no automatic action; investigate", inputs,
                               "warning", event="unknown_fault")]
        return [self._note(g, None, f"{f.reason}: no automatic action; investigate", inputs,
                           "warning")]

    def _start_reset(self, now: float, g: _Gpu, reason: str, inputs: dict) -> list[Decision]:
        if g.last_reset is not None and now - g.last_reset < self.config.reset_min_interval_seconds:
            return self._isolate(now, g, f"{reason}; the last reset was only "
                                         f"{now - g.last_reset:g} s ago (< "
                                         f"{self.config.reset_min_interval_seconds:g} s): a "
                                         "reset does not hold", inputs, reboot=True)
        engines = self._engines_of(g)
        g.phase_started = now
        out = [self._move(now, g, GpuHealth.DRAINING, None,
                          f"{reason}: drain the engine(s) on this GPU, then reset it",
                          {**inputs, "engines": engines}, "warning", event="reset_fault")]
        out += [Decision(POLICY, e, "drain", None, None,
                         f"GPU {self._label(g)} needs a reset: {reason}", dict(inputs), "warning")
                for e in engines]
        return out

    def _isolate(self, now: float, g: _Gpu, reason: str, inputs: dict,
                 reboot: bool) -> list[Decision]:
        engines = self._engines_of(g)
        full = {**inputs, "engines": engines, "gpu_index": g.index, "pci_bus_id": g.pci}
        out = [self._move(now, g, GpuHealth.ISOLATED, "isolate_gpu",
                          f"{reason}: isolate the GPU (no reset)", full, "critical", event="isolate")]
        out += [Decision(POLICY, e, "drain", None, None,
                         f"GPU {self._label(g)} isolated: {reason}", dict(full), "critical")
                for e in engines]
        if reboot:
            out.append(Decision(POLICY, g.uuid, REBOOT_NODE, None, None,
                                f"GPU {self._label(g)}: {reason}; escalate: the node needs a "
                                "reboot (a reset cannot fix this)", dict(full), "critical"))
        return out

    def _timers(self, now: float, g: _Gpu, engines: Mapping[str, EngineSnapshot],
                fault_now: bool) -> list[Decision]:
        st = g.state
        started = g.phase_started if g.phase_started is not None else g.since
        if st is GpuHealth.DEGRADED and not fault_now and g.last_fault is not None \
                and now - g.last_fault >= self.config.degraded_clear_seconds:
            return [self._move(now, g, GpuHealth.HEALTHY, None,
                               f"no fault for {now - g.last_fault:g} s: healthy", {}, event="quiet")]
        if st is GpuHealth.DRAINING:
            names = self._engines_of(g)
            waiting = [n for n in names if not _drained(engines.get(n))]
            elapsed = now - started
            if waiting and elapsed < self.config.drain_timeout_seconds:
                return []
            why = ("engines drained" if not waiting else
                   f"drain timeout {self.config.drain_timeout_seconds:g} s; still busy: "
                   f"{', '.join(waiting)} (their in-flight work is re-queued)")
            g.phase_started = now
            return [self._move(now, g, GpuHealth.RESETTING, RESET_GPU,
                               f"{why}: reset GPU {self._label(g)}",
                               {"gpu_index": g.index, "pci_bus_id": g.pci, "engines": names,
                                "drained": not waiting, "elapsed_seconds": elapsed},
                               "warning", event="drained")]
        if st is GpuHealth.RESETTING and g.dry_run_at is None and \
                now - started >= self.config.reset_timeout_seconds:
            return self._isolate(now, g, f"no reset result after {now - started:g} s", {},
                                 reboot=True)
        if st is GpuHealth.VERIFYING and not fault_now and \
                now - started >= self.config.verify_seconds:
            names = self._engines_of(g)
            out = [self._move(now, g, GpuHealth.HEALTHY, None,
                              f"no fault for {now - started:g} s after the reset: healthy",
                              {"engines": names}, event="verified")]
            out += [Decision(POLICY, e, "undrain", None, None,
                             f"GPU {self._label(g)} verified healthy after its reset", {})
                    for e in names]
            return out
        return []

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _label(g: _Gpu) -> str:
        return f"{g.index} ({g.uuid})" if g.index is not None else g.uuid

    def _move(self, now: float, g: _Gpu, to: GpuHealth, action: str | None, reason: str,
              inputs: dict, severity: str = "info", *, event: str) -> Decision:
        frm = g.state
        self.check_transition(frm, event, to)
        g.state = to
        g.since = now
        g.reason = reason
        g.dry_run_at = None
        if to in (GpuHealth.RESETTING, GpuHealth.VERIFYING, GpuHealth.DRAINING):
            g.phase_started = now
        return Decision(POLICY, g.uuid, action, frm.value, to.value, reason,
                        {"gpu_index": g.index, "pci_bus_id": g.pci, **inputs}, severity)

    @staticmethod
    def _note(g: _Gpu, action: str | None, reason: str, inputs: dict,
              severity: str = "info") -> Decision:
        return Decision(POLICY, g.uuid, action, g.state.value, g.state.value, reason,
                        {"gpu_index": g.index, "pci_bus_id": g.pci, **inputs}, severity)


def _drained(snap: EngineSnapshot | None) -> bool:
    """An engine is drained when it is down, or draining with no running request."""
    if snap is None:
        return False
    if not snap.ok:
        return True
    return bool(snap.draining) and snap.running == 0
