"""Actions: what the controller does to engines and GPUs, each outcome recorded as an event.

:class:`Actions` executes a :class:`~controller.types.Decision` (from a policy or an operator):

* ``degrade`` / ``rollback`` — engine admin precision call (``int8`` / ``full``), then
  confirmed through the engine's next polls (``precision`` in ``/stats``).
* ``drain`` / ``undrain`` — stop / resume admitting (the engine finishes in-flight work).
* ``drain_restart`` (and ``restart``) — drain, wait until the engine has no running or
  waiting requests (``drain_timeout_seconds``), restart the engine process the controller
  launched (:class:`EngineSupervisor`), and undrain. If in-flight work does not finish in
  time, the restart is postponed and the engine undrained: nothing is dropped.
* ``route_light`` / ``route_main`` / ``probe`` — send a model's traffic to the lightweight
  model and back (engine ``/admin/route``; ``to: null`` clears the route). The engine routes
  whole models, so a half-open ``probe`` sends all new requests to the main model.
* ``restart_engine`` (hardware policy, sticky CUDA errors) — like ``drain_restart`` but
  restarts even when in-flight work does not finish (the engine is broken).
* ``restart_crashed`` — restart a launched engine whose process exited.
* ``compact`` — release the engine's allocator cache, where its client has ``compact()``.
* ``reset_gpu`` — the rails of :class:`~controller.reset.GpuResetter`; engines the controller
  launched on that GPU are drained and stopped first and started again after.
* ``isolate_gpu`` / ``reboot_node`` — drain the engines on the GPU and escalate to a person
  (a lost GPU is never reset).

:class:`EngineSupervisor` runs one ``inferctl engine serve`` process the controller launched:
start, wait for ``/health``, restart, stop (SIGTERM, then SIGKILL after a timeout).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from inferctl.contract.precision import MODE_FOR_ACTION
from inferctl.controller.events import EventLog, json_safe
from inferctl.controller.reset import GpuResetter
from inferctl.controller.state import ControllerState
from inferctl.controller.types import Decision

PRECISION_FOR = MODE_FOR_ACTION
#: ``reason`` label values of ``inferctl_engine_restarts_total``: the policy that asked
#: (fragmentation: allocator fragmentation or recurring fragmentation OOMs; hardware: a sticky
#: CUDA error / Xid), ``operator`` for every manual restart (whoever the operator is — a label
#: value never comes from a request), ``crash`` for a launched engine that exited on its own.
RESTART_REASONS = ("fragmentation", "hardware", "operator", "crash")


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


class EngineSupervisor:
    """Starts, watches, restarts and stops one engine process the controller launched.

    Args:
        name: the engine's configured name.
        argv: the command (an argv list, run without a shell), e.g.
            ``[sys.executable, "-m", "inferctl", "engine", "serve", "--port", "8000"]``.
        base_url: where the engine listens (``/health`` is polled there).
        env: extra environment variables (the admin token travels here, not on argv).
        health_timeout_seconds: how long :meth:`start` waits for ``/health`` 200.
        stop_timeout_seconds: SIGTERM grace before SIGKILL.
        log_path: file for the engine's stdout/stderr (None: inherit ours).
    """

    def __init__(self, name: str, argv: list[str], base_url: str, env: dict[str, str] | None = None,
                 health_timeout_seconds: float = 60.0, stop_timeout_seconds: float = 10.0,
                 log_path: str | Path | None = None) -> None:
        if not argv:
            raise ValueError("argv: must not be empty")
        self.name = name
        self.argv = list(argv)
        self.base_url = base_url.rstrip("/")
        self.env = dict(env or {})
        self.health_timeout_seconds = health_timeout_seconds
        self.stop_timeout_seconds = stop_timeout_seconds
        self.log_path = Path(log_path) if log_path else None
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._log_file: Any = None
        self._lock = threading.RLock()
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exited_unexpectedly(self) -> int | None:
        """The exit code if the process died on its own (not stopped by us), else None."""
        with self._lock:
            if self._proc is None or self._stopping:
                return None
            return self._proc.poll()

    def start(self) -> None:
        """Start the process and wait for ``/health`` 200.

        Raises:
            RuntimeError: the process exited, or was not healthy within the timeout (it is
                stopped then); the message carries the exit code / the last health error.
        """
        with self._lock:
            if self.running:
                return
            env = {**os.environ, **self.env}
            out = None
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
                out = self._log_file
            self._stopping = False
            # a session of its own: a Ctrl-C on the terminal reaches the controller, which
            # then stops the engine in order (drain → SIGTERM → SIGKILL)
            self._proc = subprocess.Popen(self.argv, env=env, stdout=out, stderr=out,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait_healthy(self.health_timeout_seconds)

    def wait_healthy(self, timeout: float) -> None:
        """Poll ``GET /health`` until 200; raises ``RuntimeError`` on exit or timeout."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                proc = self._proc
                if proc is None or proc.poll() is not None:
                    code = None if proc is None else proc.returncode
                    raise RuntimeError(f"engine {self.name!r} exited with code {code} before it was"
                                       " healthy" + (f" (log: {self.log_path})" if self.log_path else ""))
                try:
                    r = client.get(f"{self.base_url}/health")
                    if r.status_code == 200:
                        return
                    last = f"HTTP {r.status_code}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"engine {self.name!r} not healthy at {self.base_url}/health within"
                           f" {timeout:g} s (last: {last})")

    def stop(self) -> int | None:
        """Stop the process: SIGTERM, then SIGKILL after ``stop_timeout_seconds``. Returns its
        exit code (None if it was not started). Idempotent."""
        with self._lock:
            self._stopping = True
            proc = self._proc
            if proc is None:
                return None
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=self.stop_timeout_seconds)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
                except ProcessLookupError:
                    pass
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            return proc.returncode

    def restart(self) -> None:
        """Stop, then start again (waits for health). Raises ``RuntimeError`` like :meth:`start`."""
        with self._lock:
            self.stop()
            self._proc = None
            self.restarts += 1
            self.start()


def engine_serve_argv(port: int, host: str = "127.0.0.1", model: str | None = None,
                      memory_budget: str | None = None, extra: list[str] | None = None) -> list[str]:
    """The argv that runs ``inferctl engine serve`` with this interpreter (no shell, no PATH).

    The supervised engine runs without uvicorn's access log: the controller polls it every
    second, and those lines would bury everything else in ``inferctl up``'s terminal."""
    argv = [sys.executable, "-m", "inferctl", "engine", "serve", "--host", host, "--port", str(port),
            "--no-access-log"]
    if model:
        argv += ["--model", str(model)]
    if memory_budget:
        argv += ["--memory-budget", str(memory_budget)]
    return argv + list(extra or [])


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
    """

    def __init__(self, engines: dict[str, Any], supervisors: dict[str, EngineSupervisor] | None = None,
                 resetter: GpuResetter | None = None, event_log: EventLog | None = None,
                 metrics: dict | None = None, gpu_index_of: Callable[[str], int | None] | None = None,
                 engine_gpus: dict[str, int | None] | None = None, drain_timeout_seconds: float = 60.0,
                 confirm_timeout_seconds: float = 5.0, poll_interval_seconds: float = 0.1,
                 light_models: dict[str, str | None] | None = None,
                 state: ControllerState | None = None) -> None:
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
            return ActionResult(action, name, False, f"engine {name}: precision {mode} call failed: {exc}")
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

    def _drain_restart(self, name: str, decision: Decision, force: bool = False) -> ActionResult:
        """Drain, wait for in-flight work, restart, undrain. ``force`` (a broken engine:
        restart_engine) restarts even when in-flight work did not finish in time."""
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
            try:
                client.drain(True)
            except Exception as exc:
                return ActionResult(action, name, False, f"engine {name}: drain before restart failed: {exc}")
            self._inc("inferctl_engine_drains_total", engine=name)
            idle, seen = self._wait_idle(client, self.drain_timeout_seconds)
            if not idle and not force:
                try:
                    client.drain(False)
                except Exception:
                    pass
                return ActionResult(action, name, False,
                                    f"engine {name}: in-flight requests did not finish within"
                                    f" {self.drain_timeout_seconds:g} s; restart postponed, engine undrained",
                                    {"last_poll": seen}, refused=True)
            old_pid = sup.pid
            try:
                sup.restart()
            except RuntimeError as exc:
                return ActionResult(action, name, False, f"engine {name}: restart failed: {exc}",
                                    {"old_pid": old_pid})
            self._inc("inferctl_engine_restarts_total", engine=name, reason=restart_reason(decision.policy))
            undrained = True
            try:
                client.drain(False)   # a fresh engine admits already; make sure
            except Exception:
                undrained = False
            return ActionResult(action, name, True, f"engine {name} drained, restarted (pid {old_pid} →"
                                f" {sup.pid}) and admitting", {"old_pid": old_pid, "new_pid": sup.pid,
                                                               "undrained": undrained})
        finally:
            lock.release()

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
        stopped: list[str] = []
        for name, sup in self.supervisors.items():
            if self.engine_gpus.get(name) == index and sup.running:
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
        if stopped and not out.escalated:
            for name in stopped:
                try:
                    self.supervisors[name].restart()
                    restarted.append(name)
                except RuntimeError:
                    pass
        return self._reset_result(out, stopped, restarted)

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
        """Append the action's event (source = who asked: a policy or ``operator``)."""
        if self.event_log is None:
            return res
        res.event_id = self.event_log.append(
            "action", actor, res.message, target=res.target,
            severity="info" if res.ok else "warning",
            inputs={"action": res.action, "reason": decision.reason, "decision_inputs": decision.inputs},
            outcome={"ok": res.ok, **json_safe(res.details)})
        return res
