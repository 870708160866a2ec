"""The control loop: poll engines and the GPU source, run policies, execute actions, record.

:class:`Controller` runs APScheduler (``BackgroundScheduler``) jobs:

* one job polling every engine at once and one for the GPU source, each on its own interval,
  with ``max_instances=1`` and ``coalesce=True``. The engines' HTTP polls are tasks on one
  event loop (``controller/sources.py``), the GPU source's call runs in its own worker thread;
  each call is bounded by ``call_timeout_seconds`` (shorter than the interval), so a slow or
  hung source never delays another. A failed or timed-out poll backs off exponentially
  (interval × 2^failures, capped at ``max_backoff_seconds``) and counts as a poll error;
  the first good poll clears the backoff.
* a reconcile job (signals → policies → actions → events). An engine poll also reconciles
  at once, so a decision comes within the poll that saw its cause (an OOM fault → one
  ``degrade`` within one poll).
* a supervise job that restarts an engine the controller launched if its process died.

The loop keeps the scheduling and the reconcile; the other jobs have their own modules, all
built here at construction over ONE :class:`~inferctl.controller.state.ControllerState` (the
last readings, which the actions read too):

* ``controller/sources.py`` — the source jobs (:class:`SourceJob`, :class:`Sources`);
* ``controller/dispatch.py`` — decisions routed by kind: events, actions on a worker pool,
  results back to the deciding policy (``on_result``), hand-offs between policies;
* ``controller/exporter.py`` — the Prometheus gauges and counters;
* ``controller/status.py`` — the ``/status`` document;
* ``controller/operator.py`` — the operator actions (manual switches, GPU reset, unpin,
  release).

Policies share one interface (``controller/policies/base.py``: observe / on_result / state /
gauges); the loop never asks a policy's name.

:meth:`Controller.tick` runs one poll of every source and one reconcile synchronously,
without the scheduler (tests, benchmarks).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any, Callable

from apscheduler.schedulers.background import BackgroundScheduler

from inferctl.controller.actions import ActionResult, Actions
from inferctl.controller.config import ControllerConfig
from inferctl.controller.dispatch import Dispatcher
from inferctl.controller.events import EventLog
from inferctl.controller.exporter import Exporter
from inferctl.controller import pause_actions
from inferctl.controller.operator import OperatorActions
from inferctl.controller.pause import PauseBoard
from inferctl.controller.policies.base import observe_engine, observe_gpu
from inferctl.controller.sources import SETTLE_SECONDS, SourceJob, Sources
from inferctl.controller.state import ControllerState
from inferctl.controller.status import StatusBuilder
from inferctl.controller.types import Decision, EngineSnapshot, GpuReading

log = logging.getLogger(__name__)

# names that moved to their own modules, importable from here as before
__all__ = ["Controller"]

#: crashed-engine restarts allowed per engine within the window, then escalate
CRASH_RESTARTS = 3
CRASH_WINDOW_SECONDS = 600.0


def sim_engine_of(gpu_source: Any, config: ControllerConfig) -> str | None:
    """The configured engine a simulated GPU source reads (its ``/stats`` URL is the engine's
    ``url`` + ``/stats``), None for any other source or when no engine matches."""
    url = getattr(gpu_source, "engine_stats_url", None)
    if not getattr(gpu_source, "simulated", False) or not isinstance(url, str):
        return None
    for e in config.engines:
        if e.url and f"{e.url.rstrip('/')}/stats" == url:
            return e.name
    return None


class Controller:
    """The control loop over engines, a GPU source, policies and actions.

    Args:
        config: the controller configuration (intervals, engines' GPU indices, rails).
        engines: engine clients by configured name.
        gpu_source: object with ``poll(now) -> GpuReading``.
        policies: per engine name, its engine policies by name, e.g. ``{"precision":
            PrecisionPolicy, "fragmentation": ..., "breaker": ...}`` (any subset).
        actions: the :class:`~controller.actions.Actions` executor.
        event_log: the event log.
        metrics: the controller metrics by name (``controller.metrics.build_registry()[1]``).
        registry: their registry (``/metrics`` serves it).
        gpu_policies: policies over GPU readings, e.g. ``{"hardware": HardwarePolicy}``.
        supervisors: engine processes the controller launched, by engine name.
        resetter: the GPU reset rails (for ``/status``).
        counter: the signals' ``InvalidSampleCounter`` (exported as invalid samples).
        state: the last readings (:class:`ControllerState`), shared with ``actions``; built
            from ``config`` when not given.
        clock: time source (``time.time``).
    """

    def __init__(self, config: ControllerConfig, engines: dict[str, Any], gpu_source: Any,
                 policies: dict[str, dict[str, Any]], actions: Actions, event_log: EventLog,
                 metrics: dict, *, registry: Any = None, gpu_policies: dict[str, Any] | None = None,
                 supervisors: dict[str, Any] | None = None, resetter: Any = None,
                 counter: Any = None, state: ControllerState | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.engines = engines
        self.gpu_source = gpu_source
        self.policies = policies
        self.gpu_policies = {} if gpu_policies is None else gpu_policies
        self.actions = actions
        self.event_log = event_log
        self.metrics = metrics
        self.registry = registry
        self.supervisors = {} if supervisors is None else supervisors
        self.resetter = resetter
        self.counter = counter
        self.clock = clock
        self.started_at = clock()
        self.state = state if state is not None else ControllerState.for_config(config)
        self.exporter = Exporter(metrics, counter, clock)
        self.sources = Sources(engines, gpu_source, config.intervals, self.state, self.exporter, metrics,
                               resetter=resetter, counter=counter, clock=clock, steady=self._held_by_action)
        self.dispatcher = Dispatcher(policies, self.gpu_policies, actions, event_log, self.exporter,
                                     self.state, resetter=resetter, clock=clock)
        # operator pause and maintenance windows (controller/pause.py): the dispatcher's gate
        self.pause_board = self.dispatcher.pause = PauseBoard(config.maintenance, clock=clock, metrics=metrics)
        self.dispatcher.held = self._held_lifecycle
        self.dispatcher.sim_engine = sim_engine_of(gpu_source, config)
        self._restore_pauses()
        self.status_builder = StatusBuilder(
            state=self.state, sources=self.sources, engines=engines, policies=policies,
            gpu_policies=self.gpu_policies, supervisors=self.supervisors, event_log=event_log,
            resetter=resetter, counter=counter, clock=clock, started_at=self.started_at)
        self.status_builder.pause = self.pause_board
        self.operator = OperatorActions(
            engines=engines, policies=policies, gpu_policies=self.gpu_policies, actions=actions,
            dispatcher=self.dispatcher, state=self.state, exporter=self.exporter, event_log=event_log,
            resetter=resetter, poll_engine=self.poll_engine, poll_gpu=self.poll_gpu,
            export_policies=self._export_policies, clock=clock)
        self._scheduler: BackgroundScheduler | None = None
        self.ticks = 0
        kinds = {e.name: e.kind for e in config.engines}
        self.exporter.init_counters(
            self.sources.jobs, {n: kinds.get(n, getattr(c, "kind", None)) for n, c in engines.items()},
            self.supervisors, policies)

    def _held_by_action(self, name: str) -> bool:
        """True while an action holds engine ``name`` out of rotation (a rolling restart), or its
        supervisor is (re)starting its process (a crashed engine relaunched): its polls keep the
        normal interval while it is down (controller/sources.py ``steady``), so the engine is seen
        up one interval after it is, not after a backoff begun during the outage."""
        sup = self.supervisors.get(name)
        if sup is not None and getattr(sup, "process_state", None) == "starting":
            return True
        return self._held_lifecycle(name) is not None

    def _held_lifecycle(self, name: str) -> str | None:
        """The lifecycle an action holds engine ``name`` in (the fleet rail), None when not held."""
        rail = getattr(self.actions, "rail", None)
        return None if rail is None else rail.held().get(name)

    def _restore_pauses(self) -> None:
        """Operator pauses survive a restart: rebuilt from the event log (controller/pause.py)."""
        try:
            restored = self.pause_board.restore(self.event_log.scan(kind="action"))
        except Exception as exc:   # an unreadable log must not stop the controller; say so loudly
            log.warning("could not restore operator pauses from the event log: %s", exc)
            return
        for p in restored:
            log.warning("automation still paused for %s by %s since %.0f: %s (inferctl resume %s to end it)",
                        p.scope, p.actor, p.since, p.reason, p.scope)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the scheduler's jobs (returns at once)."""
        iv = self.config.intervals
        sched = BackgroundScheduler(
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 30},
            executors={"default": {"type": "threadpool", "max_workers": 8}})
        now = dt.datetime.now()
        # one job polls every engine at once (Sources.poll_engines: one event loop, per-call deadlines)
        sched.add_job(self.poll_engines, "interval", seconds=iv.engine_poll_seconds, id="engines",
                      next_run_time=now)
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
        self.dispatcher.shutdown()
        self.sources.shutdown()

    # ------------------------------------------------------------------ polling
    def poll_engine(self, name: str, now: float | None = None, reconcile: bool = True,
                    force: bool = False) -> EngineSnapshot | None:
        """Poll one engine (timeout + backoff); reconcile at once when a snapshot arrived."""
        snap = self.sources.poll_engine(name, now, force=force)
        if snap is not None and reconcile:
            self.reconcile()
        return snap

    def poll_engines(self, now: float | None = None, force: bool = False) -> int:
        """Poll every engine at once (:meth:`Sources.poll_engines`), reconciling what came in
        within ``SETTLE_SECONDS`` and again when the stragglers are in. Returns snapshots stored."""
        stored = self.sources.poll_engines(now, force, settle_s=SETTLE_SECONDS, on_settle=self.reconcile)
        if stored:
            self.reconcile()
        return stored

    def poll_gpu(self, now: float | None = None, force: bool = False) -> GpuReading | None:
        """Poll the GPU source (timeout + backoff; see :meth:`Sources.poll_gpu`)."""
        return self.sources.poll_gpu(now, force=force)

    def tick(self, now: float | None = None, poll: bool = True) -> list[Decision]:
        """One synchronous round without the scheduler: poll every source (ignoring backoff)
        when ``poll``, then reconcile. Returns the decisions made."""
        now = self.clock() if now is None else now
        if poll:
            self.poll_gpu(now, force=True)
            self.sources.poll_engines(now, force=True)
        return self.reconcile(now)

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, now: float | None = None) -> list[Decision]:
        """Feed new snapshots to the policies, record their decisions, start their actions."""
        st = self.state
        with st.lock:
            now = self.clock() if now is None else now
            self.ticks += 1
            reading = st.reading
            telemetry_ok = st.telemetry_ok()
            decisions: list[Decision] = []
            fresh = st.take_reading()
            if fresh is not None:
                engines = dict(st.latest)
                for pname, pol in self.gpu_policies.items():
                    decisions += self.dispatcher.safe(pname, "gpu", lambda p=pol: self._observe_gpu(
                        p, now, fresh, engines))
            for name, snap in st.take_engines():
                gpu = st.gpu_of(name, reading)
                for pname, pol in self.policies.get(name, {}).items():
                    made = self.dispatcher.safe(pname, name, lambda p=pol: observe_engine(
                        p, now, snap, gpu, telemetry_ok))
                    decisions += made
                    for d in made:
                        if d.handoff:
                            decisions += self.dispatcher.hand_off(now, name, gpu, d)
            for d in decisions:
                self.dispatcher.handle(d, now)
            self._export_policies(now)
            self.exporter.export_invalid()
            return decisions

    def _observe_gpu(self, policy: Any, now: float, reading: GpuReading,
                     engines: dict[str, EngineSnapshot]) -> list[Decision]:
        decisions = observe_gpu(policy, now, reading, engines)
        take = getattr(policy, "take_xid_events", None)
        if take is not None:   # new Xid reports, deduplicated as the policy sees them
            self.exporter.count_xids(take())
        return decisions

    def _export_policies(self, now: float) -> None:
        self.exporter.export_policies(now, self.policies, self.gpu_policies, self.state.reading)

    def wait_for_actions(self, timeout: float = 30.0) -> bool:
        """Block until no action is running (tests). True if idle within ``timeout``."""
        return self.dispatcher.wait_idle(timeout)

    # ------------------------------------------------------------------ supervision
    def supervise(self) -> None:
        """Restart an engine the controller launched whose process died (at most 3 times in 10
        minutes per engine; then escalate)."""
        now = self.clock()
        for name, sup in self.supervisors.items():
            code = sup.exited_unexpectedly()
            if code is None:
                continue
            # the guard lives on the supervisor: an operator restart clears it (actions.py)
            recent = [t for t in sup.crash_restarts if now - t < CRASH_WINDOW_SECONDS]
            if len(recent) >= CRASH_RESTARTS:
                if len(recent) == CRASH_RESTARTS:
                    self.event_log.append("escalation", "supervisor", f"engine {name} keeps exiting"
                                          f" (code {code}); 3 restarts in 10 minutes, giving up"
                                          " (`inferctl restart` starts it again and resets this guard)",
                                          target=name, severity="critical", inputs={"exit_code": code})
                    recent.append(now)
                    sup.crash_restarts = recent
                continue
            recent.append(now)
            sup.crash_restarts = recent
            self.event_log.append("error", "supervisor", f"engine {name} exited with code {code};"
                                  " restarting it", target=name, severity="critical",
                                  inputs={"exit_code": code})
            self.dispatcher.submit(Decision("supervisor", name, "restart_crashed", None, None,
                                            f"engine exited with code {code}", {"exit_code": code},
                                            "critical"))

    # ------------------------------------------------------------------ the other jobs' entry points
    def status(self) -> dict:
        """The ``/status`` document (strict JSON data; :class:`StatusBuilder`)."""
        with self.state.lock:
            in_flight = set(self.dispatcher.in_flight)
        return self.status_builder.build(ticks=self.ticks, running=self._scheduler is not None,
                                         in_flight=in_flight)

    def pause(self, scope: str, reason: str, actor: str = "operator") -> dict:
        """Pause automatic actions for ``scope`` (:func:`inferctl.controller.pause_actions.pause`)."""
        return pause_actions.pause(self, scope, reason, actor)

    def resume(self, scope: str, actor: str = "operator") -> dict:
        """Resume automatic actions for ``scope`` (:func:`inferctl.controller.pause_actions.resume`)."""
        return pause_actions.resume(self, scope, actor)

    def manual(self, action: str, engine: str, actor: str = "operator", force: bool = False) -> ActionResult:
        """An operator's engine action (:meth:`OperatorActions.manual`; ``force``: a restart skips the fleet rails)."""
        return self.operator.manual(action, engine, actor, force=force)

    def reset_gpu(self, gpu: int, dry_run: bool | None = None, actor: str = "operator") -> ActionResult:
        """An operator's GPU reset through the rails (:meth:`OperatorActions.reset_gpu`)."""
        return self.operator.reset_gpu(gpu, dry_run, actor)

    def unpin(self, engine: str, who: str = "operator") -> list[Decision]:
        """Release the precision pin (:meth:`OperatorActions.unpin`)."""
        return self.operator.unpin(engine, who)

    def release_gpu(self, gpu_index: int, actor: str = "operator") -> dict:
        """Release an isolated or lost GPU (:meth:`OperatorActions.release_gpu`)."""
        return self.operator.release_gpu(gpu_index, actor)

    def gpu_index_of(self, uuid: str) -> int | None:
        """The index of the GPU with ``uuid`` in the last reading (None if unknown)."""
        return self.state.gpu_index_of(uuid)

    # the parts' internals under their old names (tests and tools read them)
    @property
    def engine_gpu(self) -> dict[str, int | None]:
        return self.state.engine_gpu

    @property
    def _jobs(self) -> dict[str, SourceJob]:
        return self.sources.jobs

    @property
    def _seen_faults(self) -> dict[str, set]:
        return self.exporter.seen_faults

    def _handle(self, d: Decision, now: float) -> None:
        self.dispatcher.handle(d, now)
