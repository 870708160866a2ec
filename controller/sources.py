"""The source jobs: polling every engine and the GPU source, each with a per-call timeout and
an exponential backoff, and storing what they return in the controller's state.

Engines whose client speaks HTTP itself (``supports_async``: the bundled, vLLM, TGI and
llama.cpp clients) are polled all at once on ONE event loop and ONE aiohttp connection pool
(:class:`~inferctl.controller.scrape.aio.AsyncPoller`, :class:`AsyncSourceJob`): at most
:data:`POLL_CONCURRENCY` workers take the calls in turn, each call bounded by
``call_timeout_seconds`` from when a worker takes it (one deadline timer for the round,
:class:`~inferctl.controller.scrape.deadlines.RoundDeadlines`), and each result is stored as
soon as it arrives (:meth:`Sources.poll_engines`). Other sources (the GPU source, test doubles) run in their own
worker thread and are waited for at most ``call_timeout_seconds``
(:class:`SourceJob`). Either way the timeout is shorter than the interval, so a slow or hung
source never delays another. A failed or timed-out poll backs off exponentially (interval × 2^failures, capped at
``max_backoff_seconds``) and counts as a poll error; the first good poll clears the backoff. An engine
that an action holds out of rotation (a rolling restart: ``steady``) is polled at its normal
interval while it is down: the action expects it back, and the next rolling step must not wait on
a backoff (up to ``max_backoff_seconds``) to see it ready again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import threading
import time
from typing import Any, Awaitable, Callable

from inferctl.controller.exporter import Exporter
from inferctl.controller.reset import lost_evidence
from inferctl.controller.scrape.aio import AsyncPoller
from inferctl.controller.scrape.deadlines import DeadlineSlot, RoundDeadlines
from inferctl.controller.signals import clean_gpu_snapshot
from inferctl.controller.state import ControllerState
from inferctl.controller.types import EngineSnapshot, GpuReading, GpuSnapshot, engine_snapshot


def duration_poller(job: str) -> str:
    """The ``poller`` label of ``inferctl_poll_duration_seconds`` for a job: ``engines`` for
    every ``engine:NAME`` job (one fleet-wide histogram: per-engine buckets were 16 series per
    engine, half of /metrics at 1,024 engines; a slow engine shows in ``/status``'s
    ``last_duration_seconds`` and its poll errors), else the job's own name (``gpu``)."""
    return "engines" if job.startswith("engine:") else job


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
        self._duration: Any = None
        #: True while the source is expected down (an action holds it): failures do not back off
        self.steady: Callable[[], bool] | None = None

    def due(self, now: float) -> bool:
        """Not backing off at ``now``; a ``steady`` source (held by an action) is always due, even
        when a backoff began before the hold."""
        return now >= self.next_attempt or (self.steady is not None and self.steady())

    def run(self, now: float | None = None, force: bool = False) -> Any | None:
        """Poll once unless backing off (``force`` ignores the backoff). Returns the result
        (a failed one on error/timeout) or None when skipped."""
        now = self.clock() if now is None else now
        if not force and not self.due(now):
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
        return self._settle(now, result)

    def _settle(self, now: float, result: Any) -> Any:
        """A call that returned: clear the backoff when ``result.ok``, else back off."""
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
            if self._duration is None:   # one fleet-wide series for every engine (labels() once)
                self._duration = h.labels(poller=duration_poller(self.name))
            self._duration.observe(seconds)

    def _backoff(self, now: float, error: str) -> None:
        self.failures += 1
        self.last_error = error
        steady = self.steady is not None and self.steady()
        delay = self.interval if steady else min(self.interval * (2 ** self.failures), self.max_backoff)
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


class AsyncSourceJob(SourceJob):
    """A :class:`SourceJob` whose call is a coroutine ``afn(now)`` run on ``poller``'s loop,
    bounded by ``timeout`` from its start (the timed-out call is cancelled, not left running): by
    ``asyncio.timeout(timeout)``, or in a round of :meth:`Sources.poll_engines` by the round's one
    deadline timer (:class:`~inferctl.controller.scrape.deadlines.RoundDeadlines`; the same
    deadline and the same failure).

    :meth:`arun` is the loop-side entry (one call at a time: a scheduled caller skips while a
    call is in flight, a forced one waits for it, at most ``2 × timeout``); :meth:`run` is the
    same from any other thread. Backoff, errors, metrics and :meth:`state` are SourceJob's.
    """

    def __init__(self, name: str, afn: Callable[[float], Awaitable[Any]], on_fail: Callable[[float, str], Any],
                 interval: float, timeout: float, max_backoff: float, metrics: dict, poller: AsyncPoller,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(name, afn, on_fail, interval, timeout, max_backoff, metrics, clock)
        self.afn = afn
        self.poller = poller
        self._busy = False
        self._idle: asyncio.Event | None = None

    def run(self, now: float | None = None, force: bool = False) -> Any | None:
        now = self.clock() if now is None else now
        if not force and not self.due(now):
            return None
        fut = self.poller.submit(self.arun(now, force))
        try:   # arun ends within 2 × timeout (waiting its turn) + timeout (the call)
            return fut.result(timeout=3 * self.timeout + 1.0)
        except (cf.TimeoutError, cf.CancelledError):
            fut.cancel()
            return None

    async def arun(self, now: float, force: bool = False, slot: DeadlineSlot | None = None) -> Any | None:
        """Poll once on the loop unless backing off; the result, a failed one, or None (skipped).
        ``slot``: the calling worker's slot in the round's deadline timer
        (:class:`~inferctl.controller.scrape.deadlines.RoundDeadlines`), which bounds the call
        instead of an ``asyncio.timeout`` of its own (same deadline, same failure)."""
        if not force and not self.due(now):
            return None
        if self._idle is None:
            self._idle = asyncio.Event()
            self._idle.set()
        if self._busy:
            if not force:
                return None
            try:
                await asyncio.wait_for(self._idle.wait(), 2 * self.timeout)
            except asyncio.TimeoutError:
                return None
            if self._busy:
                return None
        self._busy = True
        self._idle.clear()
        t0 = time.monotonic()
        try:
            if slot is not None:        # the round's one timer bounds the call (RoundDeadlines)
                slot.arm(self.timeout)
                try:
                    result = await self.afn(now)
                except asyncio.CancelledError as exc:
                    if slot.ours():
                        raise TimeoutError from exc
                    raise
                finally:
                    slot.disarm()
            else:
                # asyncio.timeout, not wait_for: no extra task per call (measurable at 1,024 engines)
                async with asyncio.timeout(self.timeout):
                    result = await self.afn(now)
        except TimeoutError:
            self._observe(time.monotonic() - t0)
            return self._fail(now, f"timed out after {self.timeout:g} s")
        except Exception as exc:
            self._observe(time.monotonic() - t0)
            return self._fail(now, f"{type(exc).__name__}: {exc}")
        finally:
            self._busy = False
            self._idle.set()
        self._observe(time.monotonic() - t0)
        return self._settle(now, result)


async def _round(jobs: list[tuple[str, "AsyncSourceJob"]], now: float, force: bool, settle_s: float | None,
                 first: cf.Future, out: list[tuple[str, Any]], concurrency: int) -> None:
    """Run every job's :meth:`AsyncSourceJob.arun` on the loop, at most ``concurrency`` at once,
    appending each ``(name, result)`` to ``out`` as it ends (None for a job that raised;
    ``list.append`` is atomic, the caller reads ``out`` from its thread). ``first`` is set after
    ``settle_s`` (or at once without).

    ``concurrency`` workers take the jobs in turn from one queue, each job's deadline starting
    when a worker takes it (1,024 polls started together on one loop all passed their deadline
    waiting for each other). A worker per slot, not a task per job behind an
    ``asyncio.Semaphore`` (a task, a waiter future and a wake-up per engine): the round's own
    machinery over 1,024 trivial jobs costs 11–16 ms of CPU against 29–42 ms (uvloop, this
    host, loaded). A slow job holds one worker for at most its timeout; the others go on with
    the queue."""
    queue = iter(jobs)      # shared by the workers: each ``next`` hands out one job (one loop thread)
    deadlines = RoundDeadlines(asyncio.get_running_loop())

    async def worker() -> None:
        slot = deadlines.slot(asyncio.current_task())
        for name, job in queue:
            try:
                result = await job.arun(now, force, slot)
            except Exception:
                result = None
            out.append((name, result))

    tasks = [asyncio.ensure_future(worker()) for _ in range(min(len(jobs), max(1, concurrency)))]
    try:
        if not tasks:
            return
        if settle_s is not None:
            await asyncio.wait(tasks, timeout=settle_s)
        if not first.done():
            first.set_result(None)
        await asyncio.wait(tasks)
    finally:
        if all(t.done() for t in tasks):   # else (the round cancelled) its workers' calls stay bounded
            deadlines.close()
        if not first.done():
            first.set_result(None)


#: At most this many engine polls in flight at once on the loop (each one's deadline starts
#: with its slot). Measured with ``python -m bench.controller_tick``: unbounded, 1,024 polls all
#: started together passed their 0.8 s deadline waiting for each other on one loop.
POLL_CONCURRENCY = 64

#: How long a scheduled round of engine polls waits for its answers before it reconciles the
#: ones in (seconds); the stragglers are stored as they come and reconciled after them, so one
#: hanging engine never delays the others' decisions by more than this.
SETTLE_SECONDS = 0.1


class Sources:
    """The poll jobs of every engine (``engine:NAME``) and of the GPU source (``gpu``).

    Args:
        engines: engine clients by configured name (``poll(now) -> EngineSnapshot``).
        gpu_source: object with ``poll(now) -> GpuReading``.
        intervals: the configuration's ``intervals`` (engine/GPU poll, call timeout, backoff).
        state: where the results go (:class:`~inferctl.controller.state.ControllerState`).
        exporter: sets the gauges of every result.
        metrics: the controller metrics by name (poll durations and errors).
        resetter: the GPU reset rails, told about every GPU a reading shows lost (or None).
        counter: the signals' ``InvalidSampleCounter`` (impossible GPU values are counted).
        clock: time source.
        poller: the event loop and connection pool of the engines' HTTP polls (built on first
            need, closed by :meth:`shutdown`, when not given).
        steady: ``steady(name)`` is True while an action holds engine ``name`` out of rotation
            (its failed polls keep the normal interval, no backoff); None: always back off.
    """

    def __init__(self, engines: dict[str, Any], gpu_source: Any, intervals: Any, state: ControllerState,
                 exporter: Exporter, metrics: dict, *, resetter: Any = None, counter: Any = None,
                 clock: Callable[[], float] = time.time, poller: AsyncPoller | None = None,
                 steady: Callable[[str], bool] | None = None) -> None:
        self.engines = engines
        self.gpu_source = gpu_source
        self.state = state
        self.exporter = exporter
        self.resetter = resetter
        self.counter = counter
        self.clock = clock
        iv = intervals
        self._own_poller = poller is None
        self.poller = poller
        self._sync_pool: cf.ThreadPoolExecutor | None = None
        self._sync_lock = threading.Lock()
        self.concurrency = POLL_CONCURRENCY
        self.jobs: dict[str, SourceJob] = {}
        for name, client in engines.items():
            if getattr(client, "supports_async", False) and hasattr(client, "poll_async"):
                if self.poller is None:
                    self.poller = AsyncPoller("inferctl-poller")
                self.jobs[f"engine:{name}"] = AsyncSourceJob(
                    f"engine:{name}", lambda now, c=client: c.poll_async(self.poller, now), self._failed_engine(name),
                    iv.engine_poll_seconds, iv.call_timeout_seconds, iv.max_backoff_seconds, metrics, self.poller,
                    clock)
                continue
            self.jobs[f"engine:{name}"] = SourceJob(
                f"engine:{name}", client.poll, self._failed_engine(name), iv.engine_poll_seconds,
                iv.call_timeout_seconds, iv.max_backoff_seconds, metrics, clock)
        if steady is not None:
            for name in engines:
                self.jobs[f"engine:{name}"].steady = lambda n=name: steady(n)
        self.jobs["gpu"] = SourceJob("gpu", gpu_source.poll, self._failed_gpu, iv.gpu_poll_seconds,
                                     iv.call_timeout_seconds, iv.max_backoff_seconds, metrics, clock)

    def _failed_engine(self, name: str) -> Callable[[float, str], EngineSnapshot]:
        kind = getattr(self.engines[name], "kind", "engine")
        return lambda now, error: engine_snapshot(name, kind, False, now, error=error)

    def _failed_gpu(self, now: float, error: str) -> GpuReading:
        return GpuReading(source=getattr(self.gpu_source, "name", "gpu"), ok=False, error=error, time=now)

    def poll_engine(self, name: str, now: float | None = None, force: bool = False) -> EngineSnapshot | None:
        """Poll one engine (timeout + backoff; ``force`` ignores the backoff), store the
        snapshot and export its gauges. None when skipped."""
        snap = self.jobs[f"engine:{name}"].run(now, force=force)
        if snap is not None:
            self._record_engine(name, snap)
        return snap

    def _record_engine(self, name: str, snap: EngineSnapshot) -> None:
        with self.state.lock:
            prev = self.state.record_engine(name, snap)
            self.exporter.export_engine(name, snap, prev)

    def poll_engines(self, now: float | None = None, force: bool = False, *, settle_s: float | None = None,
                     on_settle: Callable[[], Any] | None = None) -> int:
        """Poll every engine at once (those backing off are skipped unless ``force``) and store
        each snapshot. Returns how many were stored.

        HTTP clients run as tasks of ONE round coroutine on the poller's loop (two hand-offs
        between threads per round, not one per engine: at 1,024 engines the per-engine hand-offs
        and the GIL they contend for cost more than the polls), others in worker threads; every
        call is bounded by its job's timeout, so this returns within about
        ``call_timeout_seconds``. With ``on_settle``, the answers in after ``settle_s`` seconds
        are stored and ``on_settle`` is called once if answers are still outstanding (the caller
        reconciles what came in; the stragglers follow).
        """
        now = self.clock() if now is None else now
        async_jobs: list[tuple[str, AsyncSourceJob]] = []
        futs: dict[cf.Future, str] = {}
        for name in self.engines:
            job = self.jobs[f"engine:{name}"]
            if not force and not job.due(now):
                continue
            if isinstance(job, AsyncSourceJob):
                async_jobs.append((name, job))
            else:
                futs[self._threads().submit(job.run, now, force)] = name
        if not async_jobs and not futs:
            return 0
        longest = max([j.timeout for _, j in async_jobs] + [self.jobs[f"engine:{n}"].timeout for n in futs.values()])
        bound = 3 * longest + 1.0
        settle = settle_s if on_settle is not None else None
        first: cf.Future = cf.Future()
        arrived: list[tuple[str, Any]] = []
        rest = (self.poller.submit(_round(async_jobs, now, force, settle, first, arrived, self.concurrency))
                if async_jobs else None)
        pending = set(futs)
        stored = 0
        taken = 0

        def store(results: list[tuple[str, Any]]) -> None:
            nonlocal stored
            for name, snap in results:
                if snap is not None:
                    self._record_engine(name, snap)
                    stored += 1

        def take() -> None:
            nonlocal taken
            n = len(arrived)
            store(arrived[taken:n])
            taken = n

        def collect(timeout: float) -> None:
            try:
                for fut in cf.as_completed(list(pending), timeout=timeout):
                    pending.discard(fut)
                    try:
                        snap = fut.result()
                    except (cf.CancelledError, RuntimeError):
                        continue
                    store([(futs[fut], snap)])
            except cf.TimeoutError:
                pass

        if settle is not None:
            if rest is not None:
                try:
                    first.result(timeout=settle + 1.0)
                except (cf.TimeoutError, cf.CancelledError):
                    pass
                take()
            collect(settle if rest is None else 0)
            if pending or (rest is not None and not rest.done()):
                on_settle()
        if rest is not None:
            # every job ends within its slot's wait + 3 × timeout; the slots run in turn
            waves = -(-len(async_jobs) // max(1, self.concurrency))
            try:
                rest.result(timeout=waves * bound)
            except (cf.TimeoutError, cf.CancelledError, RuntimeError):
                rest.cancel()
            take()
        collect(bound)
        return stored

    def _threads(self) -> cf.ThreadPoolExecutor:
        """The pool that runs the thread-model jobs of :meth:`poll_engines` side by side."""
        with self._sync_lock:
            if self._sync_pool is None:
                n = sum(1 for j in self.jobs.values() if not isinstance(j, AsyncSourceJob))
                self._sync_pool = cf.ThreadPoolExecutor(max_workers=max(1, min(32, n)),
                                                        thread_name_prefix="poll-batch")
            return self._sync_pool

    def poll_gpu(self, now: float | None = None, force: bool = False) -> GpuReading | None:
        """Poll the GPU source (timeout + backoff). Impossible values in the reading (a string
        for a number, negative memory, used above total, ...) become None — no data — before
        anything sees them (``signals.clean_gpu_snapshot``; counted as invalid samples). The Xid
        events of a previous reading that no reconcile has seen yet are carried into this one."""
        reading = self.jobs["gpu"].run(now, force=force)
        if reading is None:
            return None
        reading = self._clean_reading(reading)
        self._remember_lost(reading)
        with self.state.lock:
            reading = self.state.record_reading(reading)
            self.exporter.export_gpu(reading)
        return reading

    def _remember_lost(self, reading: Any) -> None:
        """Tell the reset rails about every GPU this reading shows lost (an Xid 79 event is
        delivered once; the rails poll the source again at reset time and must not see a GPU
        that answers again as healthy)."""
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
        gpus = getattr(reading, "gpus", None)
        if not isinstance(gpus, dict) or not gpus:
            return reading
        clean: dict[str, GpuSnapshot] = {}
        for key, snap in gpus.items():
            if not isinstance(snap, GpuSnapshot):
                continue
            copy = object.__new__(type(snap))          # dataclasses.replace(snap) without the __init__ call
            copy.__dict__.update(snap.__dict__)
            clean_gpu_snapshot(copy, self.counter)
            clean[key] = copy
        return dataclasses.replace(reading, gpus=clean)

    def shutdown(self) -> None:
        """Stop every job's worker thread and the poller's loop (a running call is abandoned)."""
        for job in self.jobs.values():
            job.shutdown()
        if self._sync_pool is not None:
            self._sync_pool.shutdown(wait=False, cancel_futures=True)
        if self.poller is not None and self._own_poller:
            self.poller.close()
