"""The source jobs: polling every engine and the GPU source, each with a per-call timeout and
an exponential backoff, and storing what they return in the controller's state.

Each call runs in the source's own worker thread and is waited for at most
``call_timeout_seconds`` (shorter than the interval), so a slow or hung source never delays
another. A failed or timed-out poll backs off exponentially (interval × 2^failures, capped at
``max_backoff_seconds``) and counts as a poll error; the first good poll clears the backoff.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import threading
import time
from typing import Any, Callable

from inferctl.controller.exporter import Exporter
from inferctl.controller.reset import lost_evidence
from inferctl.controller.signals import clean_gpu_snapshot
from inferctl.controller.state import ControllerState
from inferctl.controller.types import EngineSnapshot, GpuReading, GpuSnapshot


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
    """

    def __init__(self, engines: dict[str, Any], gpu_source: Any, intervals: Any, state: ControllerState,
                 exporter: Exporter, metrics: dict, *, resetter: Any = None, counter: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.engines = engines
        self.gpu_source = gpu_source
        self.state = state
        self.exporter = exporter
        self.resetter = resetter
        self.counter = counter
        iv = intervals
        self.jobs: dict[str, SourceJob] = {}
        for name, client in engines.items():
            self.jobs[f"engine:{name}"] = SourceJob(
                f"engine:{name}", client.poll, self._failed_engine(name), iv.engine_poll_seconds,
                iv.call_timeout_seconds, iv.max_backoff_seconds, metrics, clock)
        self.jobs["gpu"] = SourceJob("gpu", gpu_source.poll, self._failed_gpu, iv.gpu_poll_seconds,
                                     iv.call_timeout_seconds, iv.max_backoff_seconds, metrics, clock)

    def _failed_engine(self, name: str) -> Callable[[float, str], EngineSnapshot]:
        kind = getattr(self.engines[name], "kind", "engine")
        return lambda now, error: EngineSnapshot(name=name, kind=kind, ok=False, time=now, error=error)

    def _failed_gpu(self, now: float, error: str) -> GpuReading:
        return GpuReading(source=getattr(self.gpu_source, "name", "gpu"), ok=False, error=error, time=now)

    def poll_engine(self, name: str, now: float | None = None, force: bool = False) -> EngineSnapshot | None:
        """Poll one engine (timeout + backoff; ``force`` ignores the backoff), store the
        snapshot and export its gauges. None when skipped."""
        snap = self.jobs[f"engine:{name}"].run(now, force=force)
        if snap is None:
            return None
        with self.state.lock:
            prev = self.state.record_engine(name, snap)
            self.exporter.export_engine(name, snap, prev)
        return snap

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
            copy = dataclasses.replace(snap)
            clean_gpu_snapshot(copy, self.counter)
            clean[key] = copy
        return dataclasses.replace(reading, gpus=clean)

    def shutdown(self) -> None:
        """Stop every job's worker thread (a running call is abandoned)."""
        for job in self.jobs.values():
            job.shutdown()
