"""Actions: what the controller does to engines and GPUs, each outcome recorded as an event.

:class:`Actions` executes a :class:`~controller.types.Decision` (from a policy or an operator):

* ``degrade`` / ``rollback`` — engine admin precision call (``int8`` / ``full``), then
  confirmed through the engine's next polls (``precision`` in ``/stats``); a call that got no
  answer (timeout) may have been applied, so it succeeds if the polls confirm the mode.
* ``drain`` / ``undrain`` — stop / resume admitting (the engine finishes in-flight work).
* ``drain_restart`` (and ``restart``) — a rolling step (controller/fleet.py): take the replica
  out of rotation when the rails allow it (at most ``rails.max_unavailable`` replicas of a
  model out at once; never the last ready replica while it has work: wait up to
  ``quiet_wait_seconds`` for a quiet moment; ``force`` skips both), drain, wait until the
  engine has no running or waiting requests (``drain_timeout_seconds``), restart the engine
  process the controller launched (:class:`EngineSupervisor`), wait for its ``/ready``, undrain
  and put it back; done only if a NEW process answers (controller/restart_proof.py). If in-flight
  work does not finish in time, the restart is postponed, the engine undrained: nothing is
  dropped. Each step is a ``step`` event (who, which replica, why).
* ``route_light`` / ``route_main`` / ``probe`` — send a model's traffic to the lightweight
  model and back (engine ``/admin/route``; ``to: null`` clears the route). The engine routes
  whole models, so a half-open ``probe`` sends all new requests to the main model.
* ``restart_engine`` (hardware policy, sticky CUDA errors) — like ``drain_restart`` but
  restarts even when in-flight work does not finish (the engine is broken).
* ``restart_crashed`` — restart a launched engine whose process exited.
* ``compact`` — release the engine's allocator cache, where its client has ``compact()``.
* ``reset_gpu`` — the rails of :class:`~controller.reset.GpuResetter`; engines the controller
  launched on that GPU are drained and stopped first and started again after, under the fleet
  rails (a reset that would take more than ``max_unavailable`` replicas of a model out is deferred).
* ``isolate_gpu`` / ``reboot_node`` — drain the engines on the GPU and escalate to a person
  (a lost GPU is never reset).

:class:`EngineSupervisor` runs one ``inferctl engine serve`` process the controller launched:
start, wait for ``/health``, restart, stop (SIGTERM, then SIGKILL after a timeout).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from inferctl.contract.precision import MODE_FOR_ACTION
from inferctl.controller.engines.base import outcome_unknown
from inferctl.controller.events import EventLog, json_safe
from inferctl.controller.fleet import FleetRail
from inferctl.controller.reset import GpuResetter
from inferctl.controller.restart_proof import good_poll, prove_restart
from inferctl.controller.state import ControllerState
from inferctl.controller.supervisor import EngineSupervisor, engine_serve_argv
from inferctl.controller.types import Decision

__all__ = ["ACTIONS", "ActionResult", "Actions", "EngineSupervisor", "engine_serve_argv", "event_note",
           "restart_reason"]

PRECISION_FOR = MODE_FOR_ACTION
#: ``reason`` label values of ``inferctl_engine_restarts_total``: the policy that asked
#: (fragmentation: allocator fragmentation or recurring fragmentation OOMs; hardware: a sticky
#: CUDA error / Xid), ``operator`` for every manual restart (whoever the operator is — a label
#: value never comes from a request), ``crash`` for a launched engine that exited on its own.
RESTART_REASONS = ("fragmentation", "hardware", "operator", "crash", "liveness")


def restart_reason(policy: str) -> str:
    """The ``reason`` label for a restart decided by ``policy`` (a policy name or an operator)."""
    return policy if policy in RESTART_REASONS else "operator"


ACTIONS = ("degrade", "rollback", "drain", "undrain", "drain_restart", "restart", "restart_engine",
           "restart_crashed", "compact", "route_light", "route_main", "probe", "reset_gpu",
           "isolate_gpu", "reboot_node")


@dataclass
class ActionResult:
    """The outcome of one action: ``ok`` and a one-line ``message``; ``details`` are JSON data.
    ``refused`` is True when a rail or precondition stopped it before it touched anything."""

    action: str
    target: str
    ok: bool
    message: str
    details: dict = field(default_factory=dict)
    event_id: int | None = None
    refused: bool = False
    #: None when the action's event is in the event log (``event_id``); else why it is not
    #: (the file cannot be written now: the event waits in memory, :class:`EventLog`)
    event_note: str | None = None


class Actions:
    """Executes decisions against engines and GPUs and records every outcome.

    Args:
        engines: engine clients by configured name (``set_precision``, ``drain``, ``route``,
            ``poll``; controller/engines).
        supervisors: the engines the controller launched, by name (restart needs one).
        resetter: the GPU reset rails (None: resets are refused).
        event_log: where outcomes go.
        metrics: controller metrics (switches, drains, restarts are counted).
        gpu_index_of: maps a GPU uuid (a decision's target) to its index (default: the
            ``state``'s last reading, else unknown).
        engine_gpus: configured GPU index per engine name (which engines a reset touches).
        drain_timeout_seconds: wait for in-flight work before a restart.
        confirm_timeout_seconds: wait for a precision switch to show in the engine's polls.
        state: the controller's last readings (:class:`~inferctl.controller.state.ControllerState`,
            the same object the :class:`~inferctl.controller.loop.Controller` is given).
        max_unavailable: ``rails.max_unavailable`` (replicas of one model out at once).
        quiet_wait_seconds: ``rails.quiet_wait_seconds``: how long a restart waits for the rails
            (a free slot, a quiet moment) before it is postponed.
        ready_timeout_seconds: how long a restarted engine may take to answer ``/ready`` 200.
        rail: the fleet rails (default: over ``state``'s snapshots; without ``state`` there is
            no fleet view and the rails let every action through).
    """

    def __init__(self, engines: dict[str, Any], supervisors: dict[str, EngineSupervisor] | None = None,
                 resetter: GpuResetter | None = None, event_log: EventLog | None = None,
                 metrics: dict | None = None, gpu_index_of: Callable[[str], int | None] | None = None,
                 engine_gpus: dict[str, int | None] | None = None, drain_timeout_seconds: float = 60.0,
                 confirm_timeout_seconds: float = 5.0, poll_interval_seconds: float = 0.1,
                 light_models: dict[str, str | None] | None = None,
                 state: ControllerState | None = None, max_unavailable: int = 1,
                 quiet_wait_seconds: float = 60.0, ready_timeout_seconds: float = 60.0,
                 rail: FleetRail | None = None) -> None:
        self.engines = engines
        self.supervisors = supervisors or {}
        self.resetter = resetter
        self.event_log = event_log
        self.metrics = metrics or {}
        self.state = state
        self.gpu_index_of = gpu_index_of or (state.gpu_index_of if state is not None else (lambda uuid: None))
        self.engine_gpus = engine_gpus or {}
        self.drain_timeout_seconds = drain_timeout_seconds
        self.confirm_timeout_seconds = confirm_timeout_seconds
        self.poll_interval_seconds = poll_interval_seconds
        self.light_models = light_models or {}
        self._engine_locks = {name: threading.Lock() for name in engines}
        self.quiet_wait_seconds = quiet_wait_seconds
        self.ready_timeout_seconds = ready_timeout_seconds
        self.rail = rail or FleetRail(None if state is None else state.latest, max_unavailable=max_unavailable,
                                      supervisors=self.supervisors, lock=None if state is None else state.lock)

    # ------------------------------------------------------------------ entry point
    def execute(self, decision: Decision, *, dry_run: bool | None = None) -> ActionResult | None:
        """Run ``decision.action`` on ``decision.target``; None when the decision has no action.

        Never raises for engine or device trouble: failures are results (and events).
        """
        action = decision.action
        if action is None:
            return None
        actor = decision.policy
        try:
            if action in PRECISION_FOR:
                res = self._precision(decision.target, PRECISION_FOR[action], action, decision)
            elif action in ("drain", "undrain"):
                res = self._drain(decision.target, action == "drain", decision)
            elif action in ("drain_restart", "restart"):
                res = self._drain_restart(decision.target, decision)
            elif action == "restart_engine":      # hardware policy: a sticky CUDA error
                res = self._drain_restart(decision.target, decision, force=True)
            elif action == "restart_crashed":
                res = self._restart_crashed(decision.target, decision)
            elif action == "compact":
                res = self._compact(decision.target, decision)
            elif action in ("route_light", "route_main", "probe"):
                res = self._route(decision.target, action == "route_light", decision)
            elif action == "reset_gpu":
                res = self._reset_gpu(decision.target, decision, dry_run)
            elif action in ("isolate_gpu", "reboot_node"):
                res = self._isolate(decision.target, action, decision)
            else:
                res = ActionResult(action, decision.target, False, f"unknown action {action!r}")
        except Exception as exc:  # a bug in one action must not stop the loop
            res = ActionResult(action, decision.target, False, f"{action} failed: {exc!r}")
        return self._record(res, decision, actor)

    # ------------------------------------------------------------------ engines
    def _client(self, name: str) -> Any:
        client = self.engines.get(name)
        if client is None:
            raise KeyError(f"unknown engine {name!r}")
        return client

    def _precision(self, name: str, mode: str, action: str, decision: Decision) -> ActionResult:
        client = self._client(name)
        try:
            reply = client.set_precision(mode)
        except Exception as exc:
            if not outcome_unknown(exc):
                return ActionResult(action, name, False, f"engine {name}: precision {mode} call failed: {exc}")
            # no answer (a timeout on a busy engine): the switch may have been delivered, so the
            # engine's polls decide; a "failed" degrade that did apply sent the policy back to
            # full, and the same OOM episode's next fault switched a second time
            confirmed, seen = self._confirm(client, lambda s: s.precision == mode)
            if not confirmed:
                return ActionResult(action, name, False, f"engine {name}: precision {mode} call got no answer "
                                    f"({exc}) and the engine still reports {seen} after "
                                    f"{self.confirm_timeout_seconds:g} s", {"mode": mode, "engine_precision": seen})
            reply = {"no_answer": str(exc)}
        else:
            confirmed, seen = self._confirm(client, lambda s: s.precision == mode)
        self._inc("inferctl_precision_switches_total", engine=name, to=mode)
        msg = (f"engine {name} switched to {mode}" + (" (confirmed by poll)" if confirmed else
               f" requested; not confirmed within {self.confirm_timeout_seconds:g} s (engine reports {seen})"))
        return ActionResult(action, name, True, msg,
                            {"mode": mode, "reply": json_safe(reply), "confirmed": confirmed,
                             "engine_precision": seen})

    def _confirm(self, client: Any, predicate: Callable[[Any], bool]) -> tuple[bool, Any]:
        deadline = time.monotonic() + self.confirm_timeout_seconds
        seen = None
        while True:
            try:
                snap = client.poll(time.time())
                seen = getattr(snap, "precision", None)
                if getattr(snap, "ok", False) and predicate(snap):
                    return True, seen
            except Exception:
                pass
            if time.monotonic() >= deadline:
                return False, seen
            time.sleep(self.poll_interval_seconds)

    def _drain(self, name: str, draining: bool, decision: Decision) -> ActionResult:
        client = self._client(name)
        action = "drain" if draining else "undrain"
        try:
            reply = client.drain(draining)
        except Exception as exc:
            return ActionResult(action, name, False, f"engine {name}: {action} call failed: {exc}")
        if draining:
            self._inc("inferctl_engine_drains_total", engine=name)
        return ActionResult(action, name, True, f"engine {name} {'draining' if draining else 'admitting again'}",
                            {"reply": json_safe(reply)})

    def _wait_idle(self, client: Any, timeout: float) -> tuple[bool, dict]:
        deadline = time.monotonic() + timeout
        last: dict = {}
        while True:
            try:
                snap = client.poll(time.time())
                last = {"running": snap.running, "waiting": snap.waiting, "ok": snap.ok}
                # running/waiting None is no data, never an empty queue
                if snap.ok and snap.running == 0 and snap.waiting == 0:
                    return True, last
            except Exception as exc:
                last = {"error": repr(exc)}
            if time.monotonic() >= deadline:
                return False, last
            time.sleep(self.poll_interval_seconds)

    def _busy(self, client: Any) -> bool | None:
        """A fresh reading: running + waiting > 0 (None: no answer or no queue reported)."""
        try:
            snap = client.poll(time.time())
        except Exception:
            return None
        if not snap.ok or snap.running is None or snap.waiting is None:
            return None
        return (snap.running + snap.waiting) > 0

    def _wait_ready(self, sup: Any) -> bool:
        """The supervisor's ``wait_ready`` (a supervisor without one counts as ready)."""
        wait = getattr(sup, "wait_ready", None)
        return True if wait is None else bool(wait(self.ready_timeout_seconds))

    def _step(self, decision: Decision, name: str, step: str, message: str, **outcome: Any) -> None:
        """One step of a rolling action as a ``step`` event: who (the decision's policy or
        operator), which replica, why (the decision's reason)."""
        if self.event_log is None:
            return
        try:
            self.event_log.append("step", decision.policy, f"engine {name}: {message}", target=name,
                                  inputs={"action": decision.action, "step": step, "reason": decision.reason},
                                  outcome=json_safe(outcome))
        except Exception:   # a step's event never stops the action
            pass

    def _drain_restart(self, name: str, decision: Decision, force: bool = False) -> ActionResult:
        """A rolling step (module docstring). ``force`` (a broken engine: restart_engine, or an
        operator's ``force``) skips the fleet rails and restarts even when in-flight work did not
        finish in time only for restart_engine."""
        action = decision.action or "drain_restart"
        client = self._client(name)
        sup = self.supervisors.get(name)
        if sup is None:
            return ActionResult(action, name, False, f"engine {name} was not launched by the controller:"
                                " it cannot be restarted from here (restart it where it runs)", refused=True)
        lock = self._engine_locks.setdefault(name, threading.Lock())
        if not lock.acquire(blocking=False):
            return ActionResult(action, name, False, f"engine {name}: another restart is in progress",
                                refused=True)
        try:
            if not sup.running:     # exited (e.g. the crash-loop guard gave up): nothing to drain
                return self._start_dead(name, sup, decision)
            forced = force or decision.inputs.get("force") is True
            verdict = self.rail.wait_hold(name, "draining", self.quiet_wait_seconds, force=forced,
                                          busy=lambda: self._busy(client), poll_seconds=self.poll_interval_seconds)
            if not verdict.ok:
                hint = "" if verdict.rail == "held" else " (an operator can force it: inferctl restart --force)"
                self._step(decision, name, "postponed", f"not taken out of rotation: {verdict.reason}",
                           rail=verdict.rail)
                return ActionResult(action, name, False, f"engine {name}: restart postponed, the replica stays in"
                                    f" rotation: {verdict.reason}{hint}", {"rail": verdict.rail}, refused=True)
            self._step(decision, name, "out_of_rotation", f"out of rotation ({verdict.reason})", forced=forced)
            try:
                return self._rolled_restart(name, client, sup, decision, action, force)
            finally:
                self.rail.release(name)
        finally:
            lock.release()

    def _rolled_restart(self, name: str, client: Any, sup: EngineSupervisor, decision: Decision, action: str,
                        force: bool) -> ActionResult:
        """Drain → in-flight work finishes → restart → ``/ready`` → undrain, the replica held."""
        try:
            client.drain(True)
        except Exception as exc:
            return ActionResult(action, name, False, f"engine {name}: drain before restart failed: {exc}")
        self._inc("inferctl_engine_drains_total", engine=name)
        # a hung engine never finishes its in-flight work: waiting for it only prolongs the outage
        wait = 0.0 if decision.inputs.get("skip_drain_wait") is True else self.drain_timeout_seconds
        idle, seen = self._wait_idle(client, wait)
        if not idle and not force:
            try:
                client.drain(False)
            except Exception:
                pass
            self._step(decision, name, "postponed", "in-flight work did not finish; undrained, back in rotation",
                       last_poll=seen)
            return ActionResult(action, name, False,
                                f"engine {name}: in-flight requests did not finish within"
                                f" {self.drain_timeout_seconds:g} s; restart postponed, engine undrained",
                                {"last_poll": seen}, refused=True)
        self._step(decision, name, "drained", "drained" + ("" if idle else " (in-flight work left: forced)"),
                   idle=idle, last_poll=seen)
        old_pid, before = sup.pid, good_poll(client)    # the process to be replaced (restart_proof.py)
        self.rail.set(name, "restarting")
        try:
            sup.restart()
        except RuntimeError as exc:
            return ActionResult(action, name, False, f"engine {name}: restart failed: {exc}",
                                {"old_pid": old_pid})
        self._inc("inferctl_engine_restarts_total", engine=name, reason=restart_reason(decision.policy))
        if decision.policy.startswith("operator"):
            sup.reset_crash_guard()
        self.rail.set(name, "starting")
        self._step(decision, name, "restarted", f"restarted (pid {old_pid} → {sup.pid}); waiting for /ready",
                   old_pid=old_pid, new_pid=sup.pid)
        ready = self._wait_ready(sup)
        proof = prove_restart(before, good_poll(client, self.confirm_timeout_seconds, self.poll_interval_seconds)
                              if ready else None, old_pid, sup.pid)
        undrained = True
        try:
            client.drain(False)   # a fresh engine admits already; make sure
        except Exception:
            undrained = False
        done = ready and proof.ok
        self._step(decision, name, "in_rotation" if done else "not_restarted" if ready else "not_ready",
                   f"ready, back in rotation: {proof.message}" if done else proof.message if ready
                   else f"not ready within {self.ready_timeout_seconds:g} s", ready=ready,
                   verified_by=proof.verified_by)
        return ActionResult(action, name, done, f"engine {name} drained, restarted (pid {old_pid} → {sup.pid})"
                            + ((" and ready: " if done else "; ") + proof.message if ready else "; not ready yet"),
                            {"old_pid": old_pid, "new_pid": sup.pid, "undrained": undrained, "ready": ready,
                             "restart_verified_by": proof.verified_by, "evidence": proof.evidence})

    def _start_dead(self, name: str, sup: EngineSupervisor, decision: Decision) -> ActionResult:
        """Restart a launched engine whose process is not running, without a drain (there is no
        process to drain). An operator's restart also clears the crash-loop guard, so the
        supervisor restarts the engine again if it crashes later."""
        action = decision.action or "restart"
        code = sup.exited_unexpectedly()
        operator = decision.policy.startswith("operator")
        cleared = sup.reset_crash_guard() if operator else 0
        try:
            sup.restart()
        except RuntimeError as exc:
            return ActionResult(action, name, False, f"engine {name} was not running (exit code {code});"
                                f" restart without a drain failed: {exc}",
                                {"exit_code": code, "drained": False, "crash_guard_reset": operator,
                                 "crash_restarts_cleared": cleared})
        self._inc("inferctl_engine_restarts_total", engine=name, reason=restart_reason(decision.policy))
        guard = (f"; crash-loop guard reset ({cleared} crash restart(s) forgotten)" if operator else "")
        return ActionResult(action, name, True, f"engine {name} was not running (exit code {code}):"
                            f" started again without a drain (pid {sup.pid}){guard}",
                            {"exit_code": code, "new_pid": sup.pid, "drained": False,
                             "crash_guard_reset": operator, "crash_restarts_cleared": cleared})

    def _restart_crashed(self, name: str, decision: Decision) -> ActionResult:
        sup = self.supervisors.get(name)
        if sup is None:
            return ActionResult("restart_crashed", name, False, f"engine {name} is not supervised")
        try:
            sup.restart()
        except RuntimeError as exc:
            return ActionResult("restart_crashed", name, False, f"engine {name}: restart failed: {exc}")
        self._inc("inferctl_engine_restarts_total", engine=name, reason="crash")
        return ActionResult("restart_crashed", name, True, f"engine {name} restarted after it exited"
                            f" (pid {sup.pid})", {"new_pid": sup.pid})

    def _compact(self, name: str, decision: Decision) -> ActionResult:
        client = self._client(name)
        fn = getattr(client, "compact", None)
        if fn is None:
            return ActionResult("compact", name, False, f"engine {name}: its client has no cache"
                                " compaction call; nothing done (a recurrence asks for a restart)")
        try:
            reply = fn()
        except Exception as exc:
            return ActionResult("compact", name, False, f"engine {name}: compact failed: {exc}")
        return ActionResult("compact", name, True, f"engine {name}: allocator cache released",
                            {"reply": json_safe(reply)})

    def _route(self, name: str, to_light: bool, decision: Decision) -> ActionResult:
        client = self._client(name)
        action = decision.action or ("route_light" if to_light else "route_main")
        model = decision.inputs.get("main_model") or decision.inputs.get("model") or name
        light = decision.inputs.get("light_model") or self.light_models.get(name)
        if to_light and not light:
            return ActionResult(action, name, False, f"engine {name}: no light model configured"
                                " (policies.breaker.light_model)", refused=True)
        to = light if to_light else None      # None clears the route (the engine's contract)
        try:
            reply = client.route(model, to)
        except Exception as exc:
            return ActionResult(action, name, False, f"engine {name}: route {model} → {to} failed: {exc}")
        msg = f"engine {name}: model {model} now served by {to or model}"
        if action == "probe":
            msg += (" (half-open probe: the engine routes whole models, so every new request"
                    " probes the main model until the breaker decides)")
        return ActionResult(action, name, True, msg, {"model": model, "to": to, "reply": json_safe(reply)})

    # ------------------------------------------------------------------ GPUs
    def _gpu_index(self, target: str) -> int | None:
        text = str(target)
        if text.startswith("gpu:"):
            text = text[4:]
        if text.isdigit():
            return int(text)
        return self.gpu_index_of(text)

    def _reset_gpu(self, target: str, decision: Decision, dry_run: bool | None) -> ActionResult:
        index = self._gpu_index(target)
        if index is None:
            return ActionResult("reset_gpu", target, False, f"GPU {target} has no known index: reset refused",
                                {"outcome": "refused"}, refused=True)
        if self.resetter is None:
            return ActionResult("reset_gpu", target, False, "no GPU resetter configured: reset refused",
                                {"outcome": "refused"}, refused=True)
        dry = self.resetter.dry_run if dry_run is None else dry_run
        if dry:
            return self._reset_result(self.resetter.reset(index, reason=decision.reason, dry_run=True,
                                                          actor=decision.policy), [], [])
        # the whole drain → reset → restart holds the one-reset-at-a-time rail: a concurrent
        # reset is refused here, before it drains, stops or restarts any engine
        with self.resetter.reserve(index) as held:
            if not held:
                out = self.resetter.refuse(index, reason=decision.reason, actor=decision.policy)
                return self._reset_result(out, [], [])
            return self._reset_reserved(index, decision)

    def _reset_result(self, out: Any, stopped: list[str], restarted: list[str]) -> ActionResult:
        details = json_safe(out)
        details.update({"stopped_engines": stopped, "restarted_engines": restarted})
        return ActionResult("reset_gpu", f"gpu:{out.gpu}", out.outcome in ("success", "dry_run"),
                            out.message, details, refused=out.outcome == "refused")

    def _reset_reserved(self, index: int, decision: Decision) -> ActionResult:
        """A real reset of GPU ``index`` while holding the reset rail (``self.resetter`` is
        set): precheck, drain and stop the launched engines on it, reset, start them again."""
        resetter = self.resetter
        why = resetter.precheck(index)
        if why is not None:   # let the resetter record the refusal with its reason
            out = resetter.reset(index, reason=decision.reason, actor=decision.policy)
            return self._reset_result(out, [], [])
        on_gpu = [n for n, sup in self.supervisors.items() if self.engine_gpus.get(n) == index and sup.running]
        deferred = self._hold_for_reset(index, on_gpu, decision)
        if deferred is not None:
            return deferred
        stopped: list[str] = []
        for name, sup in self.supervisors.items():
            if name in on_gpu:
                self._step(decision, name, "out_of_rotation", f"out of rotation for the reset of GPU {index}")
                client = self.engines.get(name)
                if client is not None:
                    try:
                        client.drain(True)
                        self._wait_idle(client, self.drain_timeout_seconds)
                    except Exception:
                        pass
                sup.stop()
                stopped.append(name)
        out = resetter.reset(index, reason=decision.reason, dry_run=False, actor=decision.policy)
        restarted = []
        try:
            if stopped and not out.escalated:
                for name in stopped:
                    try:
                        self.supervisors[name].restart()
                        restarted.append(name)
                    except RuntimeError:
                        continue
                    ready = self._wait_ready(self.supervisors[name])
                    self._step(decision, name, "in_rotation" if ready else "not_ready",
                               "restarted after the GPU reset" + (", ready" if ready else ", not ready"), ready=ready)
        finally:
            for name in stopped:
                self.rail.release(name)
        return self._reset_result(out, stopped, restarted)

    def _hold_for_reset(self, index: int, names: list[str], decision: Decision) -> ActionResult | None:
        """Take the engines of GPU ``index`` out of rotation under the fleet rails, as a drain
        does (at most ``rails.max_unavailable`` replicas of a model out; never the last ready
        one with work; waiting up to ``quiet_wait_seconds`` for the rails). An engine already
        out of rotation (down, draining) costs no availability and is held without a check; an
        operator's ``force`` skips the rails. None when every engine is held; else the
        engines held so far are released, a ``postponed`` step is recorded per engine refused,
        and the refused result says why (the GPU is not reset, nothing was stopped)."""
        forced = decision.inputs.get("force") is True
        views = self.rail.views()
        held: list[str] = []
        deadline = time.monotonic() + self.quiet_wait_seconds
        for name in names:
            view = views.get(name)
            if forced or view is None or not view.ready:
                self.rail.set(name, "resetting")
                held.append(name)
                continue
            verdict = self.rail.wait_hold(name, "resetting", max(0.0, deadline - time.monotonic()),
                                          busy=lambda c=self.engines.get(name): None if c is None else self._busy(c),
                                          poll_seconds=self.poll_interval_seconds)
            if verdict.ok:
                held.append(name)
                continue
            for h in held:
                self.rail.release(h)
            self._step(decision, name, "postponed", f"the reset of GPU {index} is deferred, {name} stays in"
                       f" rotation: {verdict.reason}", rail=verdict.rail, gpu=index)
            return ActionResult("reset_gpu", f"gpu:{index}", False,
                                f"GPU {index}: reset deferred, engine {name} stays in rotation: {verdict.reason}"
                                + ("" if verdict.rail == "held" else " (an operator can force it)"),
                                {"outcome": "deferred", "rail": verdict.rail, "engine": name, "gpu": index,
                                 "stopped_engines": [], "restarted_engines": []}, refused=True)
        return None

    def _isolate(self, target: str, action: str, decision: Decision) -> ActionResult:
        index = self._gpu_index(target)
        drained = []
        for name, gpu in self.engine_gpus.items():
            if index is not None and gpu == index and name in self.engines:
                try:
                    self.engines[name].drain(True)
                    drained.append(name)
                except Exception:
                    pass
        if self.event_log is not None:
            self.event_log.append("escalation", decision.policy,
                                  f"GPU {target}: {decision.reason}; a person must act"
                                  + (" (reboot the node)" if action == "reboot_node" else " (GPU isolated)"),
                                  target=str(target), severity="critical",
                                  inputs=decision.inputs, outcome={"action": action, "drained": drained})
        return ActionResult(action, str(target), True, f"GPU {target} isolated; engines drained: "
                            f"{', '.join(drained) or 'none'}; escalated", {"drained": drained})

    # ------------------------------------------------------------------ bookkeeping
    def _inc(self, metric: str, **labels: str) -> None:
        m = self.metrics.get(metric)
        if m is not None:
            m.labels(**labels).inc()

    def _record(self, res: ActionResult, decision: Decision, actor: str) -> ActionResult:
        """Append the action's event (source = who asked: a policy or ``operator``). The action
        has run already; an event that cannot be written now is said so in ``event_note``."""
        if self.event_log is None:
            return res
        try:
            res.event_id = self.event_log.append(
                "action", actor, res.message, target=res.target,
                severity="info" if res.ok else "warning",
                inputs={"action": res.action, "reason": decision.reason, "decision_inputs": decision.inputs},
                outcome={"ok": res.ok, **json_safe(res.details)})
        except Exception as exc:   # a bug in recording must not hide the action's outcome
            res.event_note = f"the event was not recorded: {exc!r}"
            return res
        if res.event_id is None:
            res.event_note = event_note(self.event_log)
        return res


def event_note(event_log: Any) -> str:
    """What an operator is told when an action's event is not in the log yet."""
    if getattr(event_log, "outage", None) is not None and getattr(event_log, "buffered", 0) >= getattr(
            event_log, "buffer_max", 1):
        return ("the event log cannot be written and its in-memory buffer is full: this action's event"
                " was dropped (inferctl_event_log_dropped_events_total)")
    return ("the event log cannot be written now (" + str(getattr(event_log, "last_write_error", None))
            + "): this action's event is kept in memory and written with its original time when the"
            " file is writable again")
