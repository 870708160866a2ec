"""Decision routing: every policy decision is recorded as an event of its kind, its action runs
on a small worker pool (never in a poll thread), and the action's outcome goes back to the
policy that decided it (``on_result``).

Routing is by the decision's kind and action, never by the policy's name:

* kind (``Decision.kind``): ``transition`` / ``decision`` / ``observation`` is the event kind;
  a transition into a state the policy counts (``COUNTED_ENTRIES``) bumps that counter.
* hand-off (``Decision.handoff``): the decision names the GPU policy that must hear the fault
  (its ``report_fault(now, gpu_uuid, text)``), e.g. the precision policy's hardware fault.
* action: ``isolate_gpu`` of a lost GPU also tells the reset rails (``mark_lost``); any action
  is then executed by :class:`~inferctl.controller.actions.Actions`, at most once at a time per
  (action, target).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import time
from typing import Any, Callable, Mapping

from inferctl.controller.actions import ActionResult, Actions
from inferctl.controller.events import EventLog
from inferctl.controller.exporter import Exporter
from inferctl.controller.pause import decision_scopes
from inferctl.controller.policies.base import Policy
from inferctl.controller.policies.liveness import EngineLiveness, GpuTelemetryLiveness, Liveness
from inferctl.controller.state import ControllerState
from inferctl.controller.types import Decision, GpuSnapshot

log = logging.getLogger(__name__)


class Dispatcher:
    """Records, routes and executes decisions.

    Args:
        policies: per engine name, its policies by name (the loop's mapping, shared).
        gpu_policies: the GPU policies by name (shared).
        actions: the executor.
        event_log: the event log.
        exporter: counts the entries a policy counts.
        state: the controller state (its lock guards the in-flight set and the results).
        resetter: the GPU reset rails (told about lost GPUs) or None.
        clock: time source.
    """

    def __init__(self, policies: Mapping[str, Mapping[str, Any]], gpu_policies: Mapping[str, Any],
                 actions: Actions, event_log: EventLog, exporter: Exporter, state: ControllerState, *,
                 resetter: Any = None, clock: Callable[[], float] = time.time, workers: int = 4) -> None:
        self.policies = policies
        self.gpu_policies = gpu_policies
        self.actions = actions
        self.event_log = event_log
        self.exporter = exporter
        self.state = state
        self.resetter = resetter
        #: the pause board (controller.pause.PauseBoard), set by the loop; None: never paused
        self.pause: Any = None
        #: ``held(engine)`` → the lifecycle an action holds it in (``draining``, ``restarting``…) or
        #: None; set by the loop (the fleet rail). A liveness ``down`` while held is planned.
        self.held: Callable[[str], str | None] | None = None
        #: the engine a simulated GPU source reads (its telemetry goes down with it), or None
        self.sim_engine: str | None = None
        self.clock = clock
        self.in_flight: set[tuple[str, str]] = set()
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="action")
        #: decision kind → extra steps after the event is recorded
        self._by_kind: dict[str, Callable[[Decision], None]] = {"transition": self._count_entry}
        #: action → extra steps before the action runs
        self._by_action: dict[str, Callable[[Decision], None]] = {"isolate_gpu": self._mark_lost}

    # ------------------------------------------------------------------ policies
    def safe(self, policy: str, target: str, fn: Callable[[], list[Decision]]) -> list[Decision]:
        """``fn()``'s decisions; a policy that raises is an ``error`` event (critical), never a
        dead loop."""
        try:
            return list(fn() or [])
        except Exception as exc:
            log.exception("policy %s failed for %s", policy, target)
            self.event_log.append("error", policy, f"policy {policy} failed for {target}: {exc!r}",
                                  target=target, severity="critical")
            return []

    def policy_of(self, d: Decision) -> Any:
        """The policy object that made ``d`` (a GPU policy by name, else the target engine's
        policy by name); None for an operator's or the supervisor's decision."""
        if d.policy in self.gpu_policies:
            return self.gpu_policies[d.policy]
        return self.policies.get(d.target, {}).get(d.policy)

    def hand_off(self, now: float, engine: str, gpu: GpuSnapshot | None, d: Decision) -> list[Decision]:
        """Give the fault text of ``d`` (message + hardware evidence) to the GPU policy it names
        (``report_fault``) for the engine's GPU. Without that policy or a known GPU for the
        engine, an observation event says why not."""
        receiver = self.gpu_policies.get(d.handoff or "")
        report = getattr(receiver, "report_fault", None)
        evidence = [str(x) for x in (d.inputs.get("hardware_evidence") or [])]
        text = "; ".join([str(d.inputs.get("message") or "")] + evidence).strip("; ")
        if report is None or gpu is None:
            index = self.state.engine_gpu.get(engine)
            why = (f"no {d.handoff} policy" if report is None else
                   "no GPU configured for the engine (engines[].gpu)" if index is None else
                   f"GPU {index} is not in the last good GPU reading")
            self.event_log.append("observation", "controller", f"engine {engine}: {d.handoff} fault not"
                                  f" handed to the {d.handoff} policy: {why}", target=engine,
                                  severity="warning", inputs={"text": text, "fault_id": d.inputs.get("fault_id")},
                                  time=now)
            return []
        return self.safe(d.handoff or "", gpu.uuid, lambda: report(now, gpu.uuid, text))

    # ------------------------------------------------------------------ decisions
    def handle(self, d: Decision, now: float) -> None:
        """Record ``d`` as an event of its kind, run the steps of its kind and action, and
        start its action (if any).

        The event never stands in the action's way: an event log that cannot be written keeps
        the event in memory (:class:`~inferctl.controller.events.EventLog`), and any other
        failure to record it is logged while the action still starts."""
        d = self._planned_outage(d)
        try:
            self.event_log.append(d.kind, d.policy, d.reason, target=d.target, severity=d.severity,
                                  inputs=d.inputs, outcome={"from": d.from_state, "to": d.to_state,
                                                            "action": d.action}, time=now)
        except Exception:
            log.exception("decision %s of %s on %s: its event was not recorded; acting anyway",
                          d.action or d.kind, d.policy, d.target)
        step = self._by_kind.get(d.kind)
        if step is not None:
            step(d)
        effect = self._by_action.get(d.action or "")
        if effect is not None:
            effect(d)
        if d.action:
            # --- pause gate (issue 10 item 12, controller/pause.py): a paused scope records
            # "would have acted" instead of executing; operator-driven decisions are never paused
            held = self._paused(d, now)
            if held is not None:
                self._would_have_acted(d, held, now)
                return
            self.submit(d)

    def _planned_outage(self, d: Decision) -> Decision:
        """``d`` as an ``info`` event when it is the liveness policy's ``down`` of an engine an
        action holds out of rotation (a restart the controller asked for: planned, not an
        outage) — or the GPU telemetry's ``down`` of a simulated GPU whose engine is so held;
        ``inputs`` gain ``planned: true`` and the lifecycle. Any other decision as is."""
        if self.held is None or d.to_state != Liveness.DOWN.value or d.from_state == d.to_state:
            return d
        if d.policy == EngineLiveness.NAME:
            engine: str | None = d.target
        elif d.policy == GpuTelemetryLiveness.NAME:
            engine = self.sim_engine
        else:
            return d
        lifecycle = None if engine is None else self.held(engine)
        if not lifecycle:
            return d
        whose = "it" if engine == d.target else f"engine {engine}, whose stats the simulated GPU reads,"
        return dataclasses.replace(d, severity="info", inputs={**(d.inputs or {}), "planned": True,
                                                                "lifecycle": lifecycle},
                                   reason=f"{d.reason}; planned: an action holds {whose} out of rotation "
                                          f"({lifecycle})")

    # ------------------------------------------------------------------ pause gate
    def _paused(self, d: Decision, now: float) -> Any:
        """The pause (``controller.pause.Pause``) that stops ``d``'s action, or None."""
        inputs = d.inputs or {}
        if self.pause is None or inputs.get("operator") or inputs.get("who") or d.policy.startswith("operator"):
            return None
        reading = self.state.reading
        snap = None if reading is None else reading.gpus.get(d.target)
        return self.pause.gate(decision_scopes(d.target, self.state.engine_gpu, None if snap is None else snap.index),
                               now)

    def _would_have_acted(self, d: Decision, p: Any, now: float) -> None:
        """Record ``d`` as "would have acted" (a ``refusal`` event naming the pause and who set
        it), count it, and tell the deciding policy the action did not run (a failed dry run)."""
        why = f"paused ({p.scope}, by {p.actor}: {p.reason})"
        try:
            self.event_log.append("refusal", d.policy, f"would have acted: {d.action} on {d.target}; {why}",
                                  target=d.target, severity=d.severity, time=now,
                                  inputs={**(d.inputs or {}), "would_have_acted": True, "paused_scope": p.scope,
                                          "paused_by": p.actor, "pause_reason": p.reason, "pause_source": p.source},
                                  outcome={"action": d.action, "executed": False})
        except Exception:
            log.exception("would-have-acted event of %s on %s not recorded", d.action, d.target)
        self.exporter.inc("inferctl_automation_would_have_acted_total", policy=d.policy, action=d.action or "")
        call = self._result_call(d, ActionResult(d.action or "", d.target, False, f"not executed: {why}"), now, True)
        for f in (self.safe(d.policy, d.target, call) if call is not None else []):
            self.handle(f, now)           # a follow-up with an action meets the same gate

    def _count_entry(self, d: Decision) -> None:
        self.exporter.count_entry(d, self.policy_of(d))

    def _mark_lost(self, d: Decision) -> None:
        """An isolation of a lost GPU (e.g. an engine's "fallen off the bus") is remembered by
        the reset rails."""
        inputs = d.inputs or {}
        mark = getattr(self.resetter, "mark_lost", None)
        index = inputs.get("gpu_index")
        if inputs.get("gpu_lost") and mark is not None and isinstance(index, int):
            mark(index, f"hardware policy: {d.reason}")

    def submit(self, d: Decision) -> None:
        """Run ``d``'s action on the pool, unless the same action on the same target is
        running (then a ``refusal`` event)."""
        key = (d.action or "", d.target)
        with self.state.lock:
            if key in self.in_flight:
                self.event_log.append("refusal", d.policy, f"{d.action} on {d.target} is already"
                                      " running; not started twice", target=d.target)
                return
            self.in_flight.add(key)
        try:
            fut = self._pool.submit(self.actions.execute, d)
        except RuntimeError:   # pool shut down: the controller is stopping
            with self.state.lock:
                self.in_flight.discard(key)
            return
        fut.add_done_callback(lambda f, d=d, key=key: self._action_done(d, key, f))

    def _action_done(self, d: Decision, key: tuple[str, str], fut: cf.Future) -> None:
        with self.state.lock:
            self.in_flight.discard(key)
            try:
                res: ActionResult | None = fut.result()
            except Exception as exc:
                res = ActionResult(d.action or "", d.target, False, repr(exc))
            if res is None:
                return
            now = self.clock()
            dry = (d.action == "reset_gpu" and isinstance(res.details, dict)
                   and res.details.get("outcome") == "dry_run")
            call = self._result_call(d, res, now, dry)
            if call is None:
                return
            for f in self.safe(d.policy, d.target, call):
                self.handle(f, now)

    def _result_call(self, d: Decision, res: ActionResult, now: float,
                     dry: bool) -> Callable[[], list[Decision]] | None:
        """How the deciding policy hears the result: ``on_result`` for a :class:`Policy`; for
        another object its ``record_action_result`` / ``record_dry_run`` where it has them."""
        pol = self.policy_of(d)
        action = d.action or ""
        if isinstance(pol, Policy):
            return lambda: pol.on_result(now, d, res.ok, res.message, dry)
        gpu = d.policy in self.gpu_policies
        if gpu and dry:
            hook = getattr(pol, "record_dry_run", None)
            if hook is None:
                self.event_log.append("observation", d.policy, f"{d.action} on {d.target} was a dry"
                                      " run: nothing was reset; the policy is not told it succeeded",
                                      target=d.target, inputs={"outcome": "dry_run"}, time=now)
                return None
            return lambda: hook(now, d.target, action, res.message)
        hook = getattr(pol, "record_action_result", None)
        if hook is None:
            return None
        if gpu:
            return lambda: hook(now, d.target, action, res.ok, res.message)
        return lambda: hook(now, action, res.ok, res.message)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until no action is running. True if idle within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.state.lock:
                if not self.in_flight:
                    return True
            time.sleep(0.02)
        return False

    def shutdown(self) -> None:
        """Stop taking actions; the running ones finish."""
        self._pool.shutdown(wait=True)
