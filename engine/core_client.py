"""The API process's side of an engine core in its own process (``--core-process``).

:class:`CoreClient` is an :class:`~inferctl.engine.entrypoints.state.AsyncEngineHandle`, like
:class:`~inferctl.engine.async_engine.AsyncLLMEngine`, so the server uses either unchanged. It
starts the child (:func:`inferctl.engine.core_boot.boot`, then ``core_main``; ``multiprocessing``'s spawn
context: the child never inherits the parent's threads), waits until the model is loaded, and
then relays requests, aborts and commands to it over one pipe (the wire is in
:mod:`inferctl.engine.core_process`). A reader thread blocks in ``recv`` (no GIL while it
waits), unpickles each step's outputs and posts them to each request's event loop with one
``call_soon_threadsafe`` per loop per step, as the stepping thread does in one process.

What the server reads synchronously is kept here: the precision (updated by the core's
``state`` messages), the model's numbers and tokenizer (sent once), and the engine's metric
families (fetched by :meth:`refresh_metrics` before each ``/metrics`` render). ``/stats`` and
``set_draining`` are answered by the core between steps, as in one process.

Messages to the core are pickled by the caller and written by a writer thread, so the event
loop never blocks on a full pipe (a stopped core reads nothing): a request is refused with
:class:`~inferctl.engine.async_engine.EngineOverloadedError` (503) once the bytes waiting for
the core pass :attr:`CoreClient.MAX_PENDING_BYTES`; aborts, counts and calls are always queued.

When the core process dies (killed, crashed), every open request fails with
:class:`~inferctl.engine.async_engine.EngineDeadError`, :attr:`is_running` turns False (the
server's readiness answers 503), new requests are refused and :attr:`CoreClient.fatal` says why:
the server then exits 1 so its supervisor restarts both (vLLM's API server does the same when
its engine core dies). A watchdog pings a core that has been silent for
:attr:`CoreClient.PING_SECONDS`; while a ping waits :attr:`CoreClient.UNRESPONSIVE_SECONDS` the server's
readiness answers 503 ``unresponsive``; a core that leaves it unanswered for :attr:`CoreClient.STALL_SECONDS`
(stopped, wedged, swapped out) is killed, which is the same death.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import pickle
import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from inferctl.engine import commands
from inferctl.engine.async_engine import (EngineDeadError, EngineOverloadedError, OutputQueue, OutputStreams,
                                          post_by_loop)
from inferctl.engine.core_boot import boot
from inferctl.engine.core_process import CoreSpec, PackedError
from inferctl.engine.metrics import ENGINE_METRICS
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.scheduler import AdmissionError

log = logging.getLogger(__name__)


class CoreStartError(RuntimeError):
    """The core process did not start: ``exit_code`` is the CLI's (2: a bad flag or model,
    printed by the child), 1 otherwise."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Waiter:
    """One ``("call", …)`` awaiting its reply: a thread waits on ``event``, a coroutine on
    ``future`` (resolved on its loop)."""

    __slots__ = ("event", "ok", "value", "future")

    def __init__(self, future: asyncio.Future | None = None) -> None:
        self.event = threading.Event()
        self.ok, self.value, self.future = False, None, future

    def resolve(self, ok: bool, value) -> None:  # noqa: ANN001
        self.ok, self.value = ok, value
        self.event.set()
        fut = self.future
        if fut is not None:
            try:
                fut.get_loop().call_soon_threadsafe(_settle, fut, ok, value)
            except RuntimeError:   # that loop is closed
                pass

    def result(self):  # noqa: ANN201
        if self.ok:
            return self.value
        raise self.value.unpack() if isinstance(self.value, PackedError) else self.value


def _settle(fut: asyncio.Future, ok: bool, value) -> None:  # noqa: ANN001
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value.unpack() if isinstance(value, PackedError) else value)


#: ``inferctl_engine_core_process_up`` (engine/metrics.py's catalog), set here, in the API process.
UP_METRIC = "inferctl_engine_core_process_up"
UP_HELP = next(spec["help"] for spec in ENGINE_METRICS if spec["name"] == UP_METRIC)


class _Snapshot:
    """The core's metric families as last fetched (a collector of the server's registry), and
    ``inferctl_engine_core_process_up{model}``: 1 when the last fetch succeeded, 0 when it failed
    (the core's families are then left out: no data, never a dead core's last values)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.families: list[Metric] = []
        self.up = 1

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(UP_METRIC, UP_HELP, labels=["model"])
        up.add_metric([self.model], self.up)
        # the core's own registry has the (catalog) family with no sample: ours replaces it
        return iter([*(f for f in self.families if f.name != UP_METRIC), up])


class _RemoteCounter:
    """A counter of the core's registry the HTTP layer increments (``labels(...).inc()``)."""

    def __init__(self, client: CoreClient, name: str) -> None:
        self._client, self._name, self._labels = client, name, {}

    def labels(self, **labels: str) -> _RemoteCounter:
        child = _RemoteCounter(self._client, self._name)
        child._labels = labels
        return child

    def inc(self, amount: float = 1) -> None:
        """Counted in the core (lost, without error, when the core is gone: its registry is too)."""
        try:
            self._client.send(("count", self._name, self._labels, amount))
        except EngineDeadError:
            pass


class CoreClient(OutputStreams):
    """An engine core in a child process, built from ``spec`` (module docstring).

    The constructor starts the child and blocks until its model is loaded; call it on a thread
    that lives as long as the client (the main thread: the child is killed when the thread that
    started it ends, :func:`~inferctl.engine.core_boot.die_with_parent`). Raises
    :class:`CoreStartError` when the child could not build its engine (the child printed why).
    ``model_info``: what :func:`inferctl.engine.core_process.model_info` sent."""

    #: Seconds a call (``stats``, ``set_draining``, ``latency_histograms``) waits for the core's reply.
    CALL_TIMEOUT = 10.0
    #: Seconds ``/metrics`` waits for the core's families (a scrape must not hang).
    METRICS_TIMEOUT = 3.0
    #: Bytes of messages waiting for the core above which a new request is refused (503).
    MAX_PENDING_BYTES = 64 * 1024 * 1024
    #: Seconds of silence from the core after which the watchdog pings it.
    PING_SECONDS = 1.0
    #: Seconds a ping may wait for the core's answer before it is killed (stopped, wedged).
    STALL_SECONDS = 30.0
    #: Seconds a ping may wait before readiness turns 503 (``unresponsive``).
    UNRESPONSIVE_SECONDS = 3.0
    #: Seconds ``/admin/drain`` waits for the core's confirmation: under the controller's call
    #: timeout (0.8 s by default), so an operator reads the server's answer, not a timeout.
    DRAIN_CONFIRM_SECONDS = 0.5

    def __init__(self, spec: CoreSpec) -> None:
        #: every ``waitpid`` on the core (:meth:`_exit_code`) under one lock: a join, ``exitcode`` or
        #: ``is_alive`` racing another thread's in ``waitpid`` read ECHILD as "still running" and the
        #: exit code was lost (reported as ``None``); the blocking waits are on the process's sentinel
        #: outside the lock (:meth:`_join`), so no reader waits behind a join
        self._join_lock = threading.Lock()
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_end = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=boot, args=(child_end, pickle.dumps(spec)), name="inferctl-engine-core",
                                 daemon=True)
        self._proc.start()
        child_end.close()
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            self._join(5)
            raise CoreStartError(1, f"the engine core process exited while starting (exit code "
                                    f"{self._exit_code()})") from None
        if message[0] != "ready":
            self._join(5)
            raise CoreStartError(int(message[1]), "the engine core process could not build its engine")
        self.model_info: dict = message[1]
        self._precision = self.model_info["precision"]
        self._requested = self.model_info["requested_precision"]
        self._lock = threading.Lock()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, OutputQueue]] = {}
        self._queues: dict[str, OutputQueue] = {}
        self._waiters: dict[int, _Waiter] = {}
        self._ids = itertools.count()
        self._dead = False
        self._closing = False
        #: why the core is gone when it died on its own (None: alive, or stopped by :meth:`shutdown`)
        self.fatal: str | None = None
        self._last_heard = time.monotonic()
        #: when the oldest ping the core has not answered was sent (None: none outstanding)
        self._ping_since: float | None = None
        self._outbox: collections.deque[bytes] = collections.deque()
        self._pending_bytes = 0
        self._out_cv = threading.Condition()
        self._snapshot = _Snapshot(self.model_info["name"])
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self._snapshot)
        self.metrics = {name: _RemoteCounter(self, name) for name in
                        ("inferctl_engine_request_errors_total", "inferctl_engine_request_aborts_total")}
        self._reader = threading.Thread(target=self._read, name="inferctl-core-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name="inferctl-core-writer", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="inferctl-core-watchdog", daemon=True)
        self._reader.start()
        self._writer.start()
        self._watchdog.start()

    # ------------------------------------------------------------------ lifecycle
    @property
    def pid(self) -> int | None:
        """The core process's pid."""
        return self._proc.pid

    def start(self) -> None:
        """Nothing to do: the core's stepping thread runs since the constructor (the protocol's
        ``start``). Raises ``RuntimeError`` when the core process is gone."""
        if not self.is_running:
            raise RuntimeError(f"the engine core process is not running (exit code {self._exit_code()})")

    @property
    def is_running(self) -> bool:
        return not self._dead and self._exit_code() is None

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the core (its stepping thread ends; then the process) and fail every open
        stream with :class:`EngineDeadError`. Kills the process if it has not exited within
        ``timeout`` seconds — within 1 s when a ping has waited over half a second already (a
        stopped or wedged core reads no ``shutdown``)."""
        self._closing = True
        if self.unanswered_seconds > 0.5:
            timeout = min(timeout, 1.0)
        try:
            self.send(("shutdown",))
        except EngineDeadError:   # already gone
            pass
        self._join(timeout)
        if self._exit_code() is None:
            log.warning("the engine core process did not stop within %.0f s: killing it", timeout)
            self._proc.kill()
            self._join(5)
        self._mark_dead()
        self._fail_all(EngineDeadError("the engine was shut down"))
        try:
            self._conn.close()
        except OSError:
            pass

    def _join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the core to exit (on its sentinel, no lock held); once it
        has, reap it under ``_join_lock`` (``Process.join``: a blocking ``waitpid`` of a process that is
        already exiting, so the exit code is set when this returns)."""
        if multiprocessing.connection.wait([self._proc.sentinel], timeout):
            with self._join_lock:
                self._proc.join()

    def _exit_code(self) -> int | None:
        """The core's exit code (negative: the signal that ended it), None while it runs; the one
        ``waitpid`` on it, under ``_join_lock`` (see ``__init__``)."""
        with self._join_lock:
            return self._proc.exitcode

    def send(self, message: tuple, *, bounded: bool = False) -> None:
        """Queue one message for the core (any thread; never blocks on the pipe: the writer
        thread writes it). Raises :class:`EngineDeadError` when the core is gone and, with
        ``bounded`` (a new request), :class:`EngineOverloadedError` when more than
        :attr:`MAX_PENDING_BYTES` wait for the core already."""
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._out_cv:
            if self._dead:
                raise EngineDeadError(f"the engine core process is gone ({self.fatal or 'shut down'})")
            if bounded and self._outbox and self._pending_bytes + len(payload) > self.MAX_PENDING_BYTES:
                raise EngineOverloadedError(
                    f"the engine core is not reading its input ({self._pending_bytes} bytes wait for it, "
                    f"bound {self.MAX_PENDING_BYTES}); retry later")
            self._outbox.append(payload)
            self._pending_bytes += len(payload)
            self._out_cv.notify()

    @property
    def pending_bytes(self) -> int:
        """Bytes of messages queued for the core and not yet written to the pipe."""
        return self._pending_bytes

    def _write(self) -> None:
        """The writer thread: writes the queued messages in order until the core is gone."""
        while True:
            with self._out_cv:
                while not self._outbox and not self._dead:
                    self._out_cv.wait()
                if self._dead:
                    return
                payload = self._outbox[0]
            try:
                self._conn.send_bytes(payload)
            except (OSError, ValueError):   # the pipe closed: the reader sees EOF and fails the streams
                return
            with self._out_cv:
                if self._outbox and self._outbox[0] is payload:
                    self._outbox.popleft()
                    self._pending_bytes -= len(payload)

    def _mark_dead(self) -> None:
        with self._out_cv:
            self._dead = True
            self._outbox.clear()
            self._pending_bytes = 0
            self._out_cv.notify_all()

    @property
    def unanswered_seconds(self) -> float:
        """Seconds the oldest ping the core has not answered has waited (0.0: none outstanding)."""
        since = self._ping_since
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    @property
    def responsive(self) -> bool:
        """False while a ping has waited :attr:`UNRESPONSIVE_SECONDS` or more: the core reads
        nothing (readiness turns 503 ``unresponsive`` before the watchdog's kill)."""
        return self.unanswered_seconds < self.UNRESPONSIVE_SECONDS

    def _watch(self) -> None:
        """The watchdog thread: ping a core silent for :attr:`PING_SECONDS`; kill one that has
        left a ping unanswered for :attr:`STALL_SECONDS`. Silence is counted from the ping, never
        from the last message: a core with nothing to say is not stalled. A wake-up far later
        than asked (this process itself was stopped, frozen or swapped out) starts the count
        again, so a paused server never kills its healthy core."""
        last = time.monotonic()
        while not self._dead:
            nap = min(self.PING_SECONDS, self.STALL_SECONDS) / 2
            time.sleep(nap)
            if self._dead or self._closing:
                return
            now = time.monotonic()
            overslept = now - last > max(4 * nap, 2.0)
            last = now
            if overslept:           # our own pause, not the core's: ask again
                self._ping_since = None
            waited = self.unanswered_seconds
            if waited >= self.STALL_SECONDS:
                self.fatal = (f"the engine core process (pid {self._proc.pid}) answered nothing for {waited:.0f} s "
                              f"(stopped or wedged; bound {self.STALL_SECONDS:g} s): killed")
                log.error("%s", self.fatal)
                self._proc.kill()
                return
            if self._ping_since is None and now - self._last_heard >= self.PING_SECONDS:
                self._ping_since = now       # before the send: the answer may come at once
                try:
                    self.send(("ping",))
                except EngineDeadError:
                    return

    # ------------------------------------------------------------------ requests
    def _submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                arrival_time: float | None, x_request_id: str | None) -> OutputQueue:
        if not self.is_running:
            raise EngineDeadError(f"the engine core process is not running (exit code {self._exit_code()})")
        queue = OutputQueue()
        with self._lock:
            if request_id in self._streams:
                raise AdmissionError(400, "request_id", f"request {request_id!r} is already running")
            self._streams[request_id] = (asyncio.get_running_loop(), queue)
        try:
            self.send(("add", request_id, list(prompt_token_ids), params,
                       time.time() if arrival_time is None else arrival_time, x_request_id), bounded=True)
        except (EngineDeadError, EngineOverloadedError):
            with self._lock:
                self._streams.pop(request_id, None)
            raise
        return queue

    def abort(self, request_id: str) -> None:
        """Abort a request (its stream is dropped; the core frees its blocks at a step boundary)."""
        with self._lock:
            self._streams.pop(request_id, None)
        try:
            self.send(("abort", request_id))
        except EngineDeadError:
            pass

    def abort_all(self, message: str) -> int:
        """Fail every open request with ``EngineDeadError(message)`` and abort them in the core.
        Returns how many were open."""
        n = self._fail_all(EngineDeadError(message))
        try:
            self.send(("abort_all", message))
        except EngineDeadError:
            pass
        return n

    # ------------------------------------------------------------------ admin
    def request_precision(self, mode: str) -> None:
        """Switch precision before the core's next step. Raises ``ValueError`` for a bad mode."""
        self._post(commands.SwitchPrecision(mode=mode), mode=mode)

    def inject_fault(self, kind: str = "oom", count: int = 1) -> None:
        """See :meth:`LLMEngine.inject_fault`. Raises ``ValueError`` for a bad kind/count."""
        self._post(commands.InjectFault(kind=kind, count=count), kind=kind, count=count)

    def _post(self, command: commands.Command, **fields) -> None:
        # validated here (the constructor raises), rebuilt and applied in the core
        self.send(("post", type(command).__name__, fields))

    def set_draining(self, draining: bool) -> None:
        """Returns once the core applied it (at most one step)."""
        self._call("set_draining", bool(draining))

    async def set_draining_async(self, draining: bool) -> None:
        """:meth:`set_draining` without blocking the event loop. Raises ``TimeoutError`` after
        :attr:`DRAIN_CONFIRM_SECONDS` s (the drain is still applied when the core reads it) and
        :class:`EngineDeadError` when the core is gone."""
        await self._acall("set_draining", bool(draining), timeout=self.DRAIN_CONFIRM_SECONDS)

    @property
    def precision(self) -> str:
        return self._precision

    @property
    def requested_precision(self) -> str:
        return self._requested

    def stats(self) -> dict:
        """The core's ``/stats`` document (blocks until the core answers, between steps)."""
        return self._with_process(self._call("stats"))

    async def get_stats(self) -> dict:
        """:meth:`stats` without blocking the event loop. A dead core gives the document of what
        is known here: ``engine.step_thread_alive`` false and ``engine.core_process`` (``alive``
        false, ``exit_code``, ``error``), nothing the core counted (no data). Raises
        ``TimeoutError`` when a live core does not answer within :attr:`CALL_TIMEOUT` s."""
        try:
            return self._with_process(await self._acall("stats"))
        except EngineDeadError:
            return self._with_process({"engine": {"step_thread_alive": False}})

    def latency_histograms(self) -> dict:
        """The engine's cumulative latency histograms (``requests.latency_histograms``)."""
        return self._call("latency_histograms")

    async def get_latency_histograms(self) -> dict:
        """:meth:`latency_histograms` without blocking the event loop (same errors as :meth:`get_stats`)."""
        return await self._acall("latency_histograms")

    async def refresh_metrics(self) -> None:
        """Fetch the core's metric families for the next collection of :attr:`registry`, within
        :attr:`METRICS_TIMEOUT` s. On failure (dead, or too slow) the core's families are dropped
        and ``inferctl_engine_core_process_up`` is 0; the error is raised again."""
        try:
            families = await self._acall("metrics", timeout=self.METRICS_TIMEOUT)
        except BaseException:
            self._snapshot.families, self._snapshot.up = [], 0
            raise
        self._snapshot.families, self._snapshot.up = families, 1

    def _with_process(self, doc: dict) -> dict:
        doc.setdefault("engine", {})["core_process"] = {
            "pid": self._proc.pid, "alive": self.is_running, "exit_code": self._exit_code(),
            "error": self.fatal, "pending_bytes": self._pending_bytes}
        return doc

    # ------------------------------------------------------------------ calls
    def _call(self, name: str, *args):  # noqa: ANN202
        """Ask the core and wait for its answer (this thread blocks). Raises ``TimeoutError``
        after :attr:`CALL_TIMEOUT` s, :class:`EngineDeadError` when the core is gone, or what the
        call raised in the core."""
        call_id, waiter = self._register(_Waiter(), name, args)
        try:
            if not waiter.event.wait(self.CALL_TIMEOUT):
                raise TimeoutError(f"the engine core did not answer {name!r} within {self.CALL_TIMEOUT:.0f} s")
        finally:
            with self._lock:
                self._waiters.pop(call_id, None)
        return waiter.result()

    async def _acall(self, name: str, *args, timeout: float | None = None):  # noqa: ANN202
        """:meth:`_call` without blocking the event loop (``timeout``: seconds, default
        :attr:`CALL_TIMEOUT`)."""
        wait = self.CALL_TIMEOUT if timeout is None else timeout
        future = asyncio.get_running_loop().create_future()
        call_id, _ = self._register(_Waiter(future), name, args)
        try:
            return await asyncio.wait_for(future, wait)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the engine core did not answer {name!r} within {wait:g} s") from None
        finally:
            with self._lock:
                self._waiters.pop(call_id, None)

    def _register(self, waiter: _Waiter, name: str, args: tuple) -> tuple[int, _Waiter]:
        call_id = next(self._ids)
        with self._lock:
            if self._dead:
                raise EngineDeadError("the engine core process is not running")
            self._waiters[call_id] = waiter
        try:
            self.send(("call", call_id, name, args))
        except EngineDeadError:
            with self._lock:
                self._waiters.pop(call_id, None)
            raise
        return call_id, waiter

    # ------------------------------------------------------------------ the reader thread
    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            self._last_heard = time.monotonic()
            self._ping_since = None
            kind = message[0]
            if kind == "out":
                self._dispatch(message[1])
            elif kind == "reply":
                with self._lock:
                    waiter = self._waiters.pop(message[1], None)
                if waiter is not None:
                    waiter.resolve(message[2], message[3])
            elif kind == "state":
                self._precision, self._requested = message[1], message[2]
        self._mark_dead()
        self._join(1)
        if not self._closing:
            if self.fatal is None:
                self.fatal = f"the engine core process exited (exit code {self._exit_code()})"
            log.error("the engine core process died (exit code %s): failing its open requests", self._exit_code())
        self._fail_all(EngineDeadError(self.fatal or f"the engine core process exited (exit code "
                                                     f"{self._exit_code()})"))

    def _dispatch(self, batch: list) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        with self._lock:
            streams = self._streams
            for request_id, item in batch:
                entry = streams.get(request_id)
                if entry is None:
                    continue
                if isinstance(item, PackedError):
                    item = item.unpack()
                    del streams[request_id]
                elif item.finished:
                    del streams[request_id]
                by_loop.setdefault(entry[0], []).append((entry[1], item))
        post_by_loop(by_loop)

    def _fail_all(self, err: BaseException) -> int:
        with self._lock:
            streams, self._streams = self._streams, {}
            waiters, self._waiters = (self._waiters, {}) if self._dead else ({}, self._waiters)
        for loop, queue in streams.values():
            try:
                loop.call_soon_threadsafe(queue.deliver, err)
            except RuntimeError:
                pass
        for waiter in waiters.values():
            waiter.resolve(False, err)
        return len(streams)
