"""The control loop: poll engines and the GPU source, run policies, execute actions, record.

:class:`Controller` runs APScheduler (``BackgroundScheduler``) jobs:

* one poll job per engine and one for the GPU source, each on its own interval, with
  ``max_instances=1`` and ``coalesce=True``. Each call runs in the source's own worker thread
  and is waited for at most ``call_timeout_seconds`` (shorter than the interval), so a slow or
  hung source never delays another. A failed or timed-out poll backs off exponentially
  (interval × 2^failures, capped at ``max_backoff_seconds``) and counts as a poll error;
  the first good poll clears the backoff.
* a reconcile job (signals → policies → actions → events). An engine poll also reconciles
  at once, so a decision comes within the poll that saw its cause (an OOM fault → one
  ``degrade`` within one poll).
* a supervise job that restarts an engine the controller launched if its process died.

Actions run on a small worker pool, never in a poll thread; their outcomes go back to the
policy that asked (``record_action_result``) and into the event log. Every policy decision is
an event: ``transition`` when the state changed, ``decision`` when it asked for an action in
the same state, ``observation`` otherwise.

:meth:`Controller.tick` runs one poll of every source and one reconcile synchronously,
without the scheduler (tests, benchmarks).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import datetime as dt
import logging
import threading
import time
from typing import Any, Callable

from apscheduler.schedulers.background import BackgroundScheduler

from inferctl.contract.precision import INT8, MODE_FOR_ACTION, PRECISION_MODES
from inferctl.controller.actions import RESTART_REASONS, ActionResult, Actions
from inferctl.controller.config import ControllerConfig
from inferctl.controller.events import EVENT_KINDS, EventLog, json_safe
from inferctl.controller.metrics import CONTROLLER_METRICS
from inferctl.controller.reset import OUTCOMES as RESET_OUTCOMES
from inferctl.controller.types import Decision, EngineSnapshot, GpuReading, GpuSnapshot

log = logging.getLogger(__name__)

#: ``kind`` label values of ``inferctl_engine_oom_events_total`` (the engine's fault kinds;
#: ``unknown`` when it gives none).
OOM_KINDS = ("fragmentation", "exhaustion", "impossible", "hardware", "unknown")
BREAKER_STATES = ("closed", "open", "half_open")
#: engine actions an operator may run (POST /actions/<name>, inferctl <name>)
MANUAL_ACTIONS = ("degrade", "rollback", "drain", "undrain", "restart")
_LABELS = {spec["name"]: tuple(spec["labels"]) for spec in CONTROLLER_METRICS}


class ReleaseRefused(RuntimeError):
    """An operator's GPU release that is refused (nothing to release, or the GPU source does not
    show the GPU back); the message says why."""


class SourceJob:
    """One polled source (an engine or the GPU source) with a per-call timeout and backoff.

    ``fn(now)`` returns an object with ``ok`` (EngineSnapshot or GpuReading); an exception or a
    timeout is a failure too, turned into ``on_fail(now, error)``'s result.
    """

    def __init__(self, name: str, fn: Callable[[float], Any], on_fail: Callable[[float, str], Any],
                 interval: float, timeout: float, max_backoff: float, metrics: dict,
                 clock: Callable[[], float] = time.time) -> None:
        if timeout >= interval:
            raise ValueError(f"call_timeout_seconds: {timeout:g} must be shorter than the {name}"
                             f" poll interval {interval:g}")
        self.name = name
        self.fn = fn
        self.on_fail = on_fail
        self.interval = interval
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.metrics = metrics
        self.clock = clock
        self.failures = 0
        self.next_attempt = 0.0
        self.last_error: str | None = None
        self.last_ok: float | None = None
        self.last_duration: float | None = None
        self.polls = 0
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"poll-{name}")
        self._future: cf.Future | None = None
        self._run_lock = threading.Lock()

    def run(self, now: float | None = None, force: bool = False) -> Any | None:
        """Poll once unless backing off (``force`` ignores the backoff). Returns the result
        (a failed one on error/timeout) or None when skipped."""
        now = self.clock() if now is None else now
        if not force and now < self.next_attempt:
            return None
        # one caller at a time (the scheduler's job, a forced poll after an operator action):
        # a second caller waits for the first (forced) or skips (scheduled), never fails
        if not self._run_lock.acquire(timeout=2 * self.timeout if force else 0):
            return None
        try:
            return self._run_locked(now)
        finally:
            self._run_lock.release()

    def _run_locked(self, now: float) -> Any:
        if self._future is not None and not self._future.done():
            return self._fail(now, f"previous call still running (more than {self.timeout:g} s)")
        t0 = time.monotonic()
        self._future = self._pool.submit(self.fn, now)
        try:
            result = self._future.result(timeout=self.timeout)
        except cf.TimeoutError:
            self._observe(time.monotonic() - t0)
            return self._fail(now, f"timed out after {self.timeout:g} s")
        except Exception as exc:
            self._observe(time.monotonic() - t0)
            return self._fail(now, f"{type(exc).__name__}: {exc}")
        self._observe(time.monotonic() - t0)
        self.polls += 1
        if getattr(result, "ok", True):
            self.failures = 0
            self.next_attempt = 0.0
            self.last_error = None
            self.last_ok = now
            return result
        self._backoff(now, getattr(result, "error", None) or "poll not ok")
        return result

    def _observe(self, seconds: float) -> None:
        self.last_duration = seconds
        h = self.metrics.get("inferctl_poll_duration_seconds")
        if h is not None:
            h.labels(poller=self.name).observe(seconds)

    def _backoff(self, now: float, error: str) -> None:
        self.failures += 1
        self.last_error = error
        delay = min(self.interval * (2 ** self.failures), self.max_backoff)
        self.next_attempt = now + delay
        c = self.metrics.get("inferctl_poll_errors_total")
        if c is not None:
            c.labels(poller=self.name).inc()

    def _fail(self, now: float, error: str) -> Any:
        self.polls += 1
        self._backoff(now, error)
        return self.on_fail(now, error)

    def state(self) -> dict:
        return {"failures": self.failures, "last_error": self.last_error, "last_ok": self.last_ok,
                "next_attempt": self.next_attempt or None, "last_duration_seconds": self.last_duration,
                "interval_seconds": self.interval, "timeout_seconds": self.timeout, "polls": self.polls}

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Controller:
    """The control loop over engines, a GPU source, policies and actions.

    Args:
        config: the controller configuration (intervals, engines' GPU indices, rails).
        engines: engine clients by configured name.
        gpu_source: object with ``poll(now) -> GpuReading``.
        policies: per engine name, ``{"precision": PrecisionPolicy, "fragmentation": ...,
            "breaker": ...}`` (any subset).
        actions: the :class:`~controller.actions.Actions` executor.
        event_log: the event log.
        metrics: the controller metrics by name (``controller.metrics.build_registry()[1]``).
        registry: their registry (``/metrics`` serves it).
        gpu_policies: policies over GPU readings, e.g. ``{"hardware": HardwarePolicy}``.
        supervisors: engine processes the controller launched, by engine name.
        resetter: the GPU reset rails (for ``/status``).
        counter: the signals' ``InvalidSampleCounter`` (exported as invalid samples).
        clock: time source (``time.time``).
    """

    def __init__(self, config: ControllerConfig, engines: dict[str, Any], gpu_source: Any,
                 policies: dict[str, dict[str, Any]], actions: Actions, event_log: EventLog,
                 metrics: dict, *, registry: Any = None, gpu_policies: dict[str, Any] | None = None,
                 supervisors: dict[str, Any] | None = None, resetter: Any = None,
                 counter: Any = None, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.engines = engines
        self.gpu_source = gpu_source
        self.policies = policies
        self.gpu_policies = gpu_policies or {}
        self.actions = actions
        self.event_log = event_log
        self.metrics = metrics
        self.registry = registry
        self.supervisors = supervisors or {}
        self.resetter = resetter
        self.counter = counter
        self.clock = clock
        self.started_at = clock()
        self.engine_gpu = {e.name: e.gpu for e in config.engines}
        iv = config.intervals
        self._jobs: dict[str, SourceJob] = {}
        for name, client in engines.items():
            self._jobs[f"engine:{name}"] = SourceJob(
                f"engine:{name}", client.poll, self._failed_engine(name), iv.engine_poll_seconds,
                iv.call_timeout_seconds, iv.max_backoff_seconds, metrics, clock)
        self._jobs["gpu"] = SourceJob("gpu", gpu_source.poll, self._failed_gpu,
                                      iv.gpu_poll_seconds, iv.call_timeout_seconds,
                                      iv.max_backoff_seconds, metrics, clock)
        self._lock = threading.RLock()          # reconcile and shared state
        self._latest: dict[str, EngineSnapshot] = {}
        self._prev: dict[str, EngineSnapshot] = {}
        self._seq: dict[str, int] = {n: 0 for n in engines}
        self._done_seq: dict[str, int] = {n: 0 for n in engines}
        self._reading: GpuReading | None = None
        self._reading_seq = 0
        self._reading_done = 0
        self._seen_faults: dict[str, set] = {n: set() for n in engines}
        self._int8_since: dict[str, float] = {}
        self._invalid_exported: dict[str, int] = {}
        self._action_pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="action")
        self._in_flight: set[tuple[str, str]] = set()
        self._crash_restarts: dict[str, list[float]] = {}
        self._scheduler: BackgroundScheduler | None = None
        self._gpus_counted: set[str] = set()
        self.ticks = 0
        self._init_counters()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the scheduler's jobs (returns at once)."""
        iv = self.config.intervals
        sched = BackgroundScheduler(
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 30},
            executors={"default": {"type": "threadpool", "max_workers": len(self.engines) + 4}})
        now = dt.datetime.now()
        for name in self.engines:
            sched.add_job(self.poll_engine, "interval", seconds=iv.engine_poll_seconds, args=[name],
                          id=f"engine:{name}", next_run_time=now)
        sched.add_job(self.poll_gpu, "interval", seconds=iv.gpu_poll_seconds, id="gpu", next_run_time=now)
        sched.add_job(self.reconcile, "interval", seconds=iv.reconcile_seconds, id="reconcile")
        if self.supervisors:
            sched.add_job(self.supervise, "interval", seconds=iv.engine_poll_seconds, id="supervise")
        sched.start()
        self._scheduler = sched
        self.event_log.append("lifecycle", "controller", "controller started",
                              inputs={"engines": sorted(self.engines),
                                      "gpu_source": getattr(self.gpu_source, "name", None),
                                      "intervals": iv.model_dump()})

    def stop(self) -> None:
        """Stop the jobs and the action pool (running actions finish). Idempotent."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
            self.event_log.append("lifecycle", "controller", "controller stopped")
        self._action_pool.shutdown(wait=True)
        for job in self._jobs.values():
            job.shutdown()

    # ------------------------------------------------------------------ polling
    def _failed_engine(self, name: str) -> Callable[[float, str], EngineSnapshot]:
        kind = getattr(self.engines[name], "kind", "engine")
        return lambda now, error: EngineSnapshot(name=name, kind=kind, ok=False, time=now, error=error)

    def _failed_gpu(self, now: float, error: str) -> GpuReading:
        return GpuReading(source=getattr(self.gpu_source, "name", "gpu"), ok=False, error=error, time=now)

    def poll_engine(self, name: str, now: float | None = None, reconcile: bool = True,
                    force: bool = False) -> EngineSnapshot | None:
        """Poll one engine (timeout + backoff); reconcile at once when a snapshot arrived."""
        snap = self._jobs[f"engine:{name}"].run(now, force=force)
        if snap is None:
            return None
        with self._lock:
            if name in self._latest:
                self._prev[name] = self._latest[name]
            self._latest[name] = snap
            self._seq[name] += 1
            self._export_engine(name, snap)
        if reconcile:
            self.reconcile()
        return snap

    def poll_gpu(self, now: float | None = None, force: bool = False) -> GpuReading | None:
        """Poll the GPU source (timeout + backoff). Impossible values in the reading (a string
        for a number, negative memory, used above total, ...) become None — no data — before
        anything sees them (``signals.clean_gpu_snapshot``; counted as invalid samples). The Xid
        events of a previous reading that no reconcile has seen yet are carried into this one."""
        reading = self._jobs["gpu"].run(now, force=force)
        if reading is None:
            return None
        reading = self._clean_reading(reading)
        self._remember_lost(reading)
        with self._lock:
            if self._reading is not None and self._reading_seq != self._reading_done:
                reading = _carry_xids(self._reading, reading)
            self._reading = reading
            self._reading_seq += 1
            self._export_gpu(reading)
        return reading

    def _remember_lost(self, reading: Any) -> None:
        """Tell the reset rails about every GPU this reading shows lost (an Xid 79 event is
        delivered once; the rails poll the source again at reset time and must not see a GPU
        that answers again as healthy)."""
        from inferctl.controller.reset import lost_evidence

        mark = getattr(self.resetter, "mark_lost", None)
        if mark is None or not getattr(reading, "ok", False):
            return
        for snap in reading.gpus.values():
            why = lost_evidence(snap)
            if why is not None and snap.index is not None:
                mark(snap.index, why)

    def _clean_reading(self, reading: Any) -> Any:
        """A copy of ``reading`` whose snapshots carry no impossible value (the source's own
        objects are left as they are)."""
        from inferctl.controller.signals import clean_gpu_snapshot

        gpus = getattr(reading, "gpus", None)
        if not isinstance(gpus, dict) or not gpus:
            return reading
        clean: dict[str, GpuSnapshot] = {}
        for key, snap in gpus.items():
            if not isinstance(snap, GpuSnapshot):
                continue
            copy = dataclasses.replace(snap)
            clean_gpu_snapshot(copy, self.counter)
            clean[key] = copy
        return dataclasses.replace(reading, gpus=clean)

    def tick(self, now: float | None = None, poll: bool = True) -> list[Decision]:
        """One synchronous round without the scheduler: poll every source (ignoring backoff)
        when ``poll``, then reconcile. Returns the decisions made."""
        now = self.clock() if now is None else now
        if poll:
            self.poll_gpu(now, force=True)
            for name in self.engines:
                self.poll_engine(name, now, reconcile=False, force=True)
        return self.reconcile(now)

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, now: float | None = None) -> list[Decision]:
        """Feed new snapshots to the policies, record their decisions, start their actions."""
        with self._lock:
            now = self.clock() if now is None else now
            self.ticks += 1
            decisions: list[Decision] = []
            reading = self._reading
            telemetry_ok = bool(reading is not None and reading.ok)
            if reading is not None and self._reading_seq != self._reading_done:
                self._reading_done = self._reading_seq
                engines = dict(self._latest)
                for pname, pol in self.gpu_policies.items():
                    decisions += self._safe(pname, "gpu", lambda p=pol: self._observe_gpu(
                        pname, p, now, reading, engines))
            for name, snap in self._latest.items():
                if self._seq[name] == self._done_seq[name]:
                    continue
                self._done_seq[name] = self._seq[name]
                gpu = self._gpu_of(name, reading)
                for pname, pol in self.policies.get(name, {}).items():
                    made = self._safe(pname, name, lambda p=pol, k=pname: self._observe(
                        k, p, now, snap, gpu, telemetry_ok))
                    decisions += made
                    for d in made:
                        if d.policy == "precision" and (d.inputs or {}).get("handoff") == "hardware":
                            decisions += self._hand_to_hardware(now, name, gpu, d)
            for d in decisions:
                self._handle(d, now)
            self._export_policies(now)
            self._export_invalid()
            return decisions

    def _observe(self, kind: str, policy: Any, now: float, snap: EngineSnapshot,
                 gpu: GpuSnapshot | None, telemetry_ok: bool) -> list[Decision]:
        if kind == "precision":
            return policy.observe(now, snap, gpu, telemetry_ok)
        return policy.observe(now, snap)

    def _hand_to_hardware(self, now: float, engine: str, gpu: GpuSnapshot | None,
                          d: Decision) -> list[Decision]:
        """The precision policy found an engine fault that points at the hardware: give its
        text to the hardware policy (``report_fault``) for the engine's GPU. Without a
        hardware policy or a known GPU for the engine, an observation event says why not."""
        hw = self.gpu_policies.get("hardware")
        report = getattr(hw, "report_fault", None)
        evidence = [str(x) for x in (d.inputs.get("hardware_evidence") or [])]
        text = "; ".join([str(d.inputs.get("message") or "")] + evidence).strip("; ")
        if report is None or gpu is None:
            why = ("no hardware policy" if report is None else
                   "no GPU configured for the engine (engines[].gpu)"
                   if self.engine_gpu.get(engine) is None else
                   f"GPU {self.engine_gpu.get(engine)} is not in the last good GPU reading")
            self.event_log.append("observation", "controller", f"engine {engine}: hardware fault not"
                                  f" handed to the hardware policy: {why}", target=engine,
                                  severity="warning", inputs={"text": text, "fault_id": d.inputs.get("fault_id")},
                                  time=now)
            return []
        return self._safe("hardware", gpu.uuid, lambda: report(now, gpu.uuid, text))

    def _observe_gpu(self, kind: str, policy: Any, now: float, reading: GpuReading,
                     engines: dict[str, EngineSnapshot]) -> list[Decision]:
        if kind != "hardware":
            return policy.observe(now, reading)
        decisions = policy.observe(now, reading, engines)
        take = getattr(policy, "take_xid_events", None)
        counter = self.metrics.get("inferctl_gpu_xid_events_total")
        for ev in (take() if take is not None else []):
            if counter is not None:   # new Xid reports, deduplicated as the policy sees them
                counter.labels(gpu=str(ev.get("gpu_index")), xid=str(ev.get("xid")),
                               action=str(ev.get("action"))).inc()
        return decisions

    def _safe(self, policy: str, target: str, fn: Callable[[], list[Decision]]) -> list[Decision]:
        try:
            return list(fn() or [])
        except Exception as exc:   # a policy bug is an event, never a dead loop
            log.exception("policy %s failed for %s", policy, target)
            self.event_log.append("error", policy, f"policy {policy} failed for {target}: {exc!r}",
                                  target=target, severity="critical")
            return []

    def _gpu_of(self, engine: str, reading: GpuReading | None) -> GpuSnapshot | None:
        index = self.engine_gpu.get(engine)
        if index is None or reading is None or not reading.ok:
            return None
        for snap in reading.gpus.values():
            if snap.index == index:
                return snap
        return None

    def gpu_index_of(self, uuid: str) -> int | None:
        """The index of the GPU with ``uuid`` in the last reading (None if unknown)."""
        reading = self._reading
        if reading is None:
            return None
        snap = reading.gpus.get(uuid)
        return None if snap is None else snap.index

    def _handle(self, d: Decision, now: float) -> None:
        if d.from_state != d.to_state:
            kind = "transition"
        elif d.action:
            kind = "decision"
        else:
            kind = "observation"
        self.event_log.append(kind, d.policy, d.reason, target=d.target, severity=d.severity,
                              inputs=d.inputs, outcome={"from": d.from_state, "to": d.to_state,
                                                        "action": d.action}, time=now)
        if d.action == "isolate_gpu" and (d.inputs or {}).get("gpu_lost") and self.resetter is not None:
            index = (d.inputs or {}).get("gpu_index")
            mark = getattr(self.resetter, "mark_lost", None)
            if mark is not None and isinstance(index, int):   # e.g. an engine's "fallen off the bus"
                mark(index, f"hardware policy: {d.reason}")
        if d.policy == "breaker" and d.to_state == "open" and d.from_state != "open" \
                and "inferctl_breaker_trips_total" in self.metrics:
            self.metrics["inferctl_breaker_trips_total"].labels(engine=d.target).inc()
        if d.action:
            self._submit(d)

    def _submit(self, d: Decision) -> None:
        key = (d.action or "", d.target)
        with self._lock:
            if key in self._in_flight:
                self.event_log.append("refusal", d.policy, f"{d.action} on {d.target} is already"
                                      " running; not started twice", target=d.target)
                return
            self._in_flight.add(key)
        try:
            fut = self._action_pool.submit(self.actions.execute, d)
        except RuntimeError:   # pool shut down: the controller is stopping
            with self._lock:
                self._in_flight.discard(key)
            return
        fut.add_done_callback(lambda f, d=d, key=key: self._action_done(d, key, f))

    def _action_done(self, d: Decision, key: tuple[str, str], fut: cf.Future) -> None:
        with self._lock:
            self._in_flight.discard(key)
            try:
                res: ActionResult | None = fut.result()
            except Exception as exc:
                res = ActionResult(d.action or "", d.target, False, repr(exc))
            if res is None:
                return
            now = self.clock()
            dry = (d.action == "reset_gpu" and isinstance(res.details, dict)
                   and res.details.get("outcome") == "dry_run")
            if d.policy in self.gpu_policies and dry:
                # nothing was reset: the policy must not move on as if the GPU had been
                hook = getattr(self.gpu_policies[d.policy], "record_dry_run", None)
                if hook is None:
                    self.event_log.append("observation", d.policy, f"{d.action} on {d.target} was a dry"
                                          " run: nothing was reset; the policy is not told it succeeded",
                                          target=d.target, inputs={"outcome": "dry_run"}, time=now)
                    return
                call = lambda: hook(now, d.target, d.action or "", res.message)   # noqa: E731
            elif d.policy in self.gpu_policies:      # GPU policies key results by GPU uuid
                hook = getattr(self.gpu_policies[d.policy], "record_action_result", None)
                call = None if hook is None else (lambda: hook(now, d.target, d.action or "", res.ok,
                                                               res.message))
            else:
                pol = self.policies.get(d.target, {}).get(d.policy)
                hook = getattr(pol, "record_action_result", None)
                call = None if hook is None else (lambda: hook(now, d.action or "", res.ok, res.message))
            if call is None:
                return
            follow = self._safe(d.policy, d.target, call)
            for f in follow:
                self._handle(f, now)

    def wait_for_actions(self, timeout: float = 30.0) -> bool:
        """Block until no action is running (tests). True if idle within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._in_flight:
                    return True
            time.sleep(0.02)
        return False

    # ------------------------------------------------------------------ supervision
    def supervise(self) -> None:
        """Restart an engine the controller launched whose process died (at most 3 times in 10
        minutes per engine; then escalate)."""
        now = self.clock()
        for name, sup in self.supervisors.items():
            code = sup.exited_unexpectedly()
            if code is None:
                continue
            recent = [t for t in self._crash_restarts.get(name, []) if now - t < 600]
            if len(recent) >= 3:
                if len(recent) == 3:
                    self.event_log.append("escalation", "supervisor", f"engine {name} keeps exiting"
                                          f" (code {code}); 3 restarts in 10 minutes, giving up",
                                          target=name, severity="critical", inputs={"exit_code": code})
                    recent.append(now)
                    self._crash_restarts[name] = recent
                continue
            recent.append(now)
            self._crash_restarts[name] = recent
            self.event_log.append("error", "supervisor", f"engine {name} exited with code {code};"
                                  " restarting it", target=name, severity="critical",
                                  inputs={"exit_code": code})
            self._submit(Decision("supervisor", name, "restart_crashed", None, None,
                                  f"engine exited with code {code}", {"exit_code": code}, "critical"))

    # ------------------------------------------------------------------ operator entry points
    def manual(self, action: str, engine: str, actor: str = "operator") -> ActionResult:
        """Run an operator action now (synchronously). Raises ``KeyError`` for an unknown
        engine and ``ValueError`` for an unknown action.

        For ``degrade``/``rollback`` the precision policy is told first through its
        ``operator_switch(now, mode, who)`` when it has one; without it the policy sees the
        change in the next poll (it adopts a manual int8 and rolls back after its hold, and
        re-applies int8 after a manual rollback while it holds int8)."""
        if engine not in self.engines:
            raise KeyError(engine)
        if action not in MANUAL_ACTIONS:
            raise ValueError(f"action: {action!r} is not one of {', '.join(MANUAL_ACTIONS)}")
        d = Decision(actor, engine, action, None, None, f"{action} requested by {actor}", {})
        pol = self.policies.get(engine, {}).get("precision")
        hook = getattr(pol, "operator_switch", None)
        if hook is not None and action in ("degrade", "rollback"):
            # tell the precision policy first, so it does not undo the operator's switch
            mode = MODE_FOR_ACTION[action]
            with self._lock:
                now = self.clock()
                for follow in self._safe("precision", engine, lambda: hook(now, mode, actor)):
                    self._handle(follow, now)
        res = self.actions.execute(d)
        if hook is not None and action in ("degrade", "rollback") and res is not None and not res.ok:
            # the operator's switch failed: the policy returns to where it was (its own rules)
            report = getattr(pol, "record_action_result", None)
            if report is not None:
                with self._lock:
                    now = self.clock()
                    for follow in self._safe("precision", engine,
                                             lambda: report(now, action, False, res.message)):
                        self._handle(follow, now)
        self.poll_engine(engine, force=True)
        return res

    def reset_gpu(self, gpu: int, dry_run: bool | None = None, actor: str = "operator") -> ActionResult:
        """Operator GPU reset through the rails."""
        d = Decision(actor, f"gpu:{gpu}", "reset_gpu", None, None, f"GPU reset requested by {actor}",
                     {"gpu": gpu, "dry_run": dry_run})
        return self.actions.execute(d, dry_run=dry_run)

    def unpin(self, engine: str, who: str = "operator") -> list[Decision]:
        """Release the precision flap guard's pin. Raises ``KeyError`` (unknown engine or no
        precision policy) or the policy's ``PolicyError`` (not pinned)."""
        pol = self.policies.get(engine, {}).get("precision")
        if engine not in self.engines or pol is None:
            raise KeyError(engine)
        with self._lock:
            now = self.clock()
            decisions = pol.unpin(now, who)
            for d in decisions:
                self._handle(d, now)
            self._export_policies(now)
        return decisions

    def release_gpu(self, gpu_index: int, actor: str = "operator") -> dict:
        """Release GPU ``gpu_index`` after the node was rebooted or the GPU replaced: the
        hardware policy's ISOLATED entries with that index go back to HEALTHY
        (``HardwarePolicy.release``, their history cleared) and the reset rails forget their lost
        mark (``GpuResetter.forget_lost``). Recorded as one ``action`` event (source ``actor``,
        target ``gpu:N``, outcome ``{"gpu": N, "released": True}``) that a restarted controller's
        rails honour while no newer lost mark follows it.

        The GPU source is polled first: the release is refused when telemetry is down, when the
        source does not show GPU N, or when it shows GPU N lost now (``lost_evidence``: NVML
        GpuIsLost, health ``lost``, Xid 79) — a release never overrides current evidence.

        Returns ``{"ok": True, "action": "release_gpu", "target", "message", "event_id",
        "decisions"}``. Raises ``ValueError`` for a negative or non-integer ``gpu_index`` and
        :class:`ReleaseRefused` when the GPU is neither isolated nor marked lost, or when the
        GPU source does not show it present and not lost."""
        from inferctl.controller.reset import RELEASE_ACTION, lost_evidence

        if isinstance(gpu_index, bool) or not isinstance(gpu_index, int) or gpu_index < 0:
            raise ValueError(f"gpu: must be a non-negative integer, got {gpu_index!r}")
        n = gpu_index
        hw = self.gpu_policies.get("hardware")
        is_lost = getattr(self.resetter, "is_lost", None)
        if not self._isolated_uuids(hw, n) and not (is_lost is not None and is_lost(n)):
            raise ReleaseRefused(f"GPU {n} is neither isolated by the hardware policy nor marked lost"
                                 " by the reset rails: nothing to release")
        reading = self.poll_gpu(force=True)
        if reading is None or not getattr(reading, "ok", False):
            why = "no reading" if reading is None else (reading.error or "no detail")
            raise ReleaseRefused(f"GPU telemetry is down ({why}): cannot check that GPU {n} is back;"
                                 " nothing released")
        snap = next((s for s in reading.gpus.values() if s.index == n), None)
        if snap is None:
            raise ReleaseRefused(f"GPU {n} is not in the GPU source's reading ({reading.source}): it"
                                 " is not back; nothing released")
        evidence = lost_evidence(snap)
        if evidence is not None:
            raise ReleaseRefused(f"GPU {n} ({snap.uuid}) is lost now ({evidence}): a release does not"
                                 " override current evidence; drain the node and reboot it")
        with self._lock:
            now = self.clock()
            decisions: list[Decision] = []
            for uuid in self._isolated_uuids(hw, n):
                decisions += hw.release(now, uuid, actor)
            rails = bool(is_lost is not None and is_lost(n) and self.resetter.forget_lost(n))
            if not decisions and not rails:
                raise ReleaseRefused(f"GPU {n} is neither isolated by the hardware policy nor marked"
                                     " lost by the reset rails: nothing to release")
            for d in decisions:
                self._handle(d, now)
            done = ([f"hardware policy: {len(decisions)} isolated entr{'y' if len(decisions) == 1 else 'ies'}"
                     " -> healthy"] if decisions else []) + (["reset rails: lost mark cleared"] if rails else [])
            message = (f"GPU {n} ({snap.uuid}) released by {actor} ({'; '.join(done)}): the source shows"
                       " it present and not lost")
            event_id = self.event_log.append(
                "action", actor, message, target=f"gpu:{n}", severity="warning", time=now,
                inputs={"gpu": n, "uuid": snap.uuid, "action": RELEASE_ACTION, "actor": actor,
                        "hardware_released": [d.target for d in decisions], "rails_lost_cleared": rails},
                outcome={"gpu": n, "released": True})
            self._export_policies(now)
        return {"ok": True, "action": RELEASE_ACTION, "target": f"gpu:{n}", "message": message,
                "event_id": event_id, "decisions": [json_safe(d) for d in decisions]}

    def _isolated_uuids(self, hw: Any, index: int) -> list[str]:
        """UUIDs of the hardware policy's GPUs with ``index`` (its own or, for a GPU it knows only
        by UUID, the last reading's) that are ISOLATED."""
        state = getattr(hw, "state", None)
        if state is None:
            return []
        gpus = (state(self.clock()) or {}).get("gpus") or {}
        return [u for u, g in gpus.items() if g.get("policy_state") == "isolated"
                and (g.get("index") if g.get("index") is not None else self.gpu_index_of(u)) == index]

    # ------------------------------------------------------------------ status
    def status(self) -> dict:
        """The ``/status`` document (strict JSON data)."""
        now = self.clock()
        with self._lock:
            engines = {}
            for name, client in self.engines.items():
                snap = self._latest.get(name)
                sup = self.supervisors.get(name)
                engines[name] = {
                    "url": getattr(client, "base_url", None), "kind": getattr(client, "kind", None),
                    "up": None if snap is None else bool(snap.ok),
                    "error": None if snap is None else snap.error,
                    "last_poll": None if snap is None else snap.time,
                    "model": None if snap is None else snap.model,
                    "precision": None if snap is None else snap.precision,
                    "draining": None if snap is None else snap.draining,
                    "running": None if snap is None else snap.running,
                    "waiting": None if snap is None else snap.waiting,
                    "kv_usage_ratio": None if snap is None else snap.kv_usage_ratio,
                    "memory": None if snap is None else {
                        "budget_bytes": snap.memory_budget_bytes,
                        "allocated_bytes": snap.memory_allocated_bytes,
                        "reserved_bytes": snap.memory_reserved_bytes,
                        "free_bytes": snap.memory_free_bytes},
                    "oom_total": None if snap is None else snap.oom_total,
                    "gpu": self.engine_gpu.get(name),
                    "supervised": sup is not None,
                    "pid": None if sup is None else sup.pid,
                    "restarts": None if sup is None else sup.restarts,
                    "poll": self._jobs[f"engine:{name}"].state(),
                    "policies": {k: self._policy_state(p, now) for k, p in self.policies.get(name, {}).items()},
                }
            reading = self._reading
            gpus = {
                "source": getattr(self.gpu_source, "name", None),
                "simulated": bool(getattr(self.gpu_source, "simulated", False)),
                "ok": None if reading is None else reading.ok,
                "error": None if reading is None else reading.error,
                "poll": self._jobs["gpu"].state(),
                "devices": [] if reading is None else [
                    {"index": g.index, "uuid": g.uuid, "name": g.name, "lost": g.lost,
                     "memory_total_bytes": g.memory_total_bytes, "memory_used_bytes": g.memory_used_bytes,
                     "memory_free_bytes": g.memory_free_bytes, "utilization_ratio": g.utilization_ratio,
                     "temperature_celsius": g.temperature_celsius, "health": g.health}
                    for g in sorted(reading.gpus.values(), key=lambda s: (s.index is None, s.index or 0))],
                "policies": {k: self._policy_state(p, now) for k, p in self.gpu_policies.items()},
            }
            doc = {
                "controller": {"time": now, "started": self.started_at, "uptime_seconds": now - self.started_at,
                               "ticks": self.ticks, "last_event_id": self.event_log.last_id(),
                               "actions_in_flight": sorted(f"{a}:{t}" for a, t in self._in_flight),
                               "running": self._scheduler is not None},
                "engines": engines, "gpus": gpus,
                "rails": None if self.resetter is None else self.resetter.state(),
                "invalid_samples": None if self.counter is None else self.counter.snapshot(),
            }
        return json_safe(doc)

    @staticmethod
    def _policy_state(policy: Any, now: float) -> Any:
        try:
            return policy.state(now)
        except TypeError:
            return policy.state()
        except Exception as exc:
            return {"error": repr(exc)}

    # ------------------------------------------------------------------ metrics
    def _zero(self, name: str, **labels: str) -> None:
        """Create a counter's series at 0 (no-op when it exists or the metric is absent)."""
        c = self.metrics.get(name)
        if c is not None:
            c.labels(**labels)

    def _init_counters(self) -> None:
        """Create the labelled counters' known series at 0 when the controller starts, so that
        PromQL ``increase()``/``rate()`` see their first event (a series born by its first
        increment has no earlier sample to compare with). GPU reset counters follow once the
        GPUs are known (:meth:`_export_gpu`)."""
        kinds = {e.name: e.kind for e in self.config.engines}
        for kind in EVENT_KINDS:
            self._zero("inferctl_events_total", kind=kind)
        for job in self._jobs:
            self._zero("inferctl_poll_errors_total", poller=job)
        for name in self.engines:
            bundled = kinds.get(name, getattr(self.engines[name], "kind", None)) == "bundled"
            if bundled:
                for mode in PRECISION_MODES:
                    self._zero("inferctl_precision_switches_total", engine=name, to=mode)
                self._zero("inferctl_engine_drains_total", engine=name)
                for kind in OOM_KINDS:
                    self._zero("inferctl_engine_oom_events_total", engine=name, kind=kind)
            if name in self.supervisors:
                for reason in RESTART_REASONS:
                    self._zero("inferctl_engine_restarts_total", engine=name, reason=reason)
            if "breaker" in self.policies.get(name, {}):
                self._zero("inferctl_breaker_trips_total", engine=name)

    def _gauge(self, name: str, value: float | None, **labels: str) -> None:
        """Set a gauge; None (no data) removes the series rather than reading as 0."""
        g = self.metrics.get(name)
        if g is None:
            return
        if value is None:
            try:
                g.remove(*[labels[k] for k in _LABELS[name]])
            except KeyError:
                pass
            return
        g.labels(**labels).set(float(value))

    def _export_engine(self, name: str, snap: EngineSnapshot) -> None:
        from inferctl.controller import signals as sig   # pure functions; imported here to keep startup light

        m = self.metrics
        self._gauge("inferctl_engine_up", 1.0 if snap.ok else 0.0, engine=name)
        if snap.ok and snap.precision in PRECISION_MODES:
            for mode in PRECISION_MODES:
                self._gauge("inferctl_precision_mode", 1.0 if mode == snap.precision else 0.0,
                            engine=name, mode=mode)
            if snap.precision == INT8:
                self._int8_since.setdefault(name, snap.time or self.clock())
            else:
                self._int8_since.pop(name, None)
            since = self._int8_since.get(name)
            self._gauge("inferctl_degraded_seconds",
                        0.0 if since is None else max(0.0, (snap.time or self.clock()) - since), engine=name)
        if not snap.ok:
            return
        c = self.counter
        self._gauge("inferctl_kv_cache_usage_ratio", sig.validate_ratio(snap.kv_usage_ratio, "kv_cache_usage_ratio", c).value, engine=name)
        self._gauge("inferctl_kv_cache_waste_ratio", sig.validate_ratio(snap.kv_waste_ratio, "kv_cache_waste_ratio", c).value, engine=name)
        self._gauge("inferctl_fragmentation_ratio",
                    sig.fragmentation_ratio(snap.memory_reserved_bytes, snap.memory_allocated_bytes, c).value,
                    engine=name)
        window = sig.batch_window(self._prev.get(name), snap, c)
        self._gauge("inferctl_padding_ratio", window["padding_ratio"].value, engine=name)
        self._gauge("inferctl_effective_batch_size", window["effective_batch_size"].value, engine=name)
        rep = sig.repetition_summary(snap.recent_requests, counter=c)
        self._gauge("inferctl_repetition_ratio", rep.mean_seq_rep.value, engine=name)
        for bucket, rate in rep.by_bucket.items():
            self._gauge("inferctl_degenerate_ratio", rate.rate, engine=name, prompt_len_bucket=bucket)
        self._gauge("inferctl_perplexity", sig.perplexity_summary(snap.recent_requests, counter=c).value,
                    engine=name)
        seen = self._seen_faults.setdefault(name, set())
        current = set()
        for fault in snap.faults:
            if not isinstance(fault, dict):
                continue
            key = _hashable((fault.get("time"), fault.get("id")))
            current.add(key)
            if key in seen:
                continue
            seen.add(key)
            kind = fault.get("kind") if fault.get("kind") in ("fragmentation", "exhaustion", "impossible",
                                                               "hardware") else "unknown"
            if "inferctl_engine_oom_events_total" in m:
                m["inferctl_engine_oom_events_total"].labels(engine=name, kind=kind).inc()
        if len(seen) > 10_000:      # bounded memory; the faults still reported stay known
            seen.intersection_update(current)

    def _export_gpu(self, reading: GpuReading) -> None:
        self._gauge("inferctl_gpu_telemetry_up", 1.0 if reading.ok else 0.0, source=reading.source)
        if not reading.ok:
            return
        for g in reading.gpus.values():
            lab = {"gpu": str(g.index), "uuid": g.uuid}
            if g.index is not None and lab["gpu"] not in self._gpus_counted:
                self._gpus_counted.add(lab["gpu"])
                for outcome in RESET_OUTCOMES:
                    self._zero("inferctl_gpu_resets_total", gpu=lab["gpu"], outcome=outcome)
            self._gauge("inferctl_gpu_lost", 1.0 if g.lost else 0.0, **lab)
            for metric, value in (("inferctl_gpu_memory_total_bytes", g.memory_total_bytes),
                                  ("inferctl_gpu_memory_used_bytes", g.memory_used_bytes),
                                  ("inferctl_gpu_memory_free_bytes", g.memory_free_bytes),
                                  ("inferctl_gpu_memory_reserved_bytes", g.memory_reserved_bytes),
                                  ("inferctl_gpu_utilization_ratio", g.utilization_ratio),
                                  ("inferctl_gpu_memory_bandwidth_utilization_ratio",
                                   g.memory_bandwidth_utilization_ratio),
                                  ("inferctl_gpu_temperature_celsius", g.temperature_celsius),
                                  ("inferctl_gpu_power_watts", g.power_watts)):
                self._gauge(metric, None if g.lost else value, **lab)
            self._gauge("inferctl_gpu_ecc_errors", g.ecc_corrected, type="corrected", **lab)
            self._gauge("inferctl_gpu_ecc_errors", g.ecc_uncorrected, type="uncorrected", **lab)

    def _export_policies(self, now: float) -> None:
        reading = self._reading
        if reading is not None and reading.ok:
            hw = self.gpu_policies.get("hardware")
            for g in reading.gpus.values():
                state = hw.gpu_state(g.uuid) if hw is not None and hasattr(hw, "gpu_state") else None
                healthy = (state == "healthy") if state is not None else not g.lost
                self._gauge("inferctl_gpu_healthy", 1.0 if healthy else 0.0, gpu=str(g.index), uuid=g.uuid)
        for name, pols in self.policies.items():
            prec = pols.get("precision")
            if prec is not None:
                st = self._policy_state(prec, now)
                if isinstance(st, dict):
                    self._gauge("inferctl_precision_pinned", 1.0 if st.get("pinned") else 0.0, engine=name)
                    self._gauge("inferctl_rollback_hold_seconds", st.get("hold_seconds"), engine=name)
            brk = pols.get("breaker")
            if brk is not None:
                st = self._policy_state(brk, now)
                state = st.get("state") if isinstance(st, dict) else None
                if state in BREAKER_STATES:
                    for s in BREAKER_STATES:
                        self._gauge("inferctl_breaker_state", 1.0 if s == state else 0.0, engine=name, state=s)
                if isinstance(st, dict) and "ttft_p99_seconds" in st:
                    p99 = st.get("ttft_p99_seconds")
                    self._gauge("inferctl_ttft_p99_seconds", p99, engine=name)
                    # "≥ bound": the p99 fell in the +Inf bucket, the value is a lower bound
                    self._gauge("inferctl_ttft_p99_saturated", None if p99 is None else
                                (1.0 if st.get("ttft_p99_at_least") else 0.0), engine=name)

    def _export_invalid(self) -> None:
        if self.counter is None or "inferctl_invalid_samples_total" not in self.metrics:
            return
        for signal, count in self.counter.by_signal().items():
            done = self._invalid_exported.get(signal, 0)
            if count > done:
                self.metrics["inferctl_invalid_samples_total"].labels(signal=signal).inc(count - done)
                self._invalid_exported[signal] = count


def _carry_xids(unseen: Any, reading: Any) -> Any:
    """``reading`` with the Xid events of ``unseen`` — the previous reading, which no reconcile
    has looked at — put before its own, per GPU uuid. A source delivers an Xid event once
    (NVML's event set is drained by the poll), so a reading replaced before the policies saw
    it must not take its Xids with it. The policies' deduplication drops repeats. Readings
    that are not ok carry nothing (telemetry down decides nothing)."""
    if not (getattr(unseen, "ok", False) and getattr(reading, "ok", False)):
        return reading
    old = getattr(unseen, "gpus", None)
    new = getattr(reading, "gpus", None)
    if not isinstance(old, dict) or not isinstance(new, dict):
        return reading
    gpus = dict(new)
    for uuid, snap in new.items():
        before = getattr(old.get(uuid), "xid_events", None) or []
        if before and isinstance(snap, GpuSnapshot):
            gpus[uuid] = dataclasses.replace(
                snap, xid_events=list(before) + [x for x in snap.xid_events if x not in before])
    return dataclasses.replace(reading, gpus=gpus)


def _hashable(value: Any) -> Any:
    """``value`` itself when it can be a set member or dict key, else its ``repr`` (a client
    that passed a list or a dict through must not break deduplication)."""
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value
