"""AsyncLLMEngine: a background stepping thread plus one asyncio queue per request.

The stepping thread owns the :class:`~inferctl.engine.engine.LLMEngine` (attached as its
stepping thread): it enqueues new requests and applies the engine's command mailbox (aborts,
precision switches, drains, injected faults; :mod:`inferctl.engine.commands`) between steps,
calls ``step()`` while there is work and sleeps on a condition variable otherwise. Requests
come in through :meth:`AsyncLLMEngine.generate`, an async generator: validation
(``LLMEngine.make_sequence``) runs in the caller, so an
:class:`~inferctl.engine.scheduler.AdmissionError` is raised before the first item is yielded.
Outputs are handed to the caller's event loop with one ``call_soon_threadsafe`` per loop per step.
Closing or cancelling the generator (client disconnect) aborts the request at the next step
boundary, which frees its KV blocks. :meth:`AsyncLLMEngine.redirect` hands a started request's
further outputs to a plain callback on the loop instead (no coroutine resumed per output: the
streaming fast path of :mod:`inferctl.engine.entrypoints.push_stream`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

from inferctl.engine.commands import AbortRequest, InjectFault, SetDraining, SwitchPrecision
from inferctl.engine.engine import LLMEngine, RequestOutput
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.scheduler import AdmissionError
from inferctl.engine.sequence import Sequence

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine was shut down while a request was in flight."""


class EngineOverloadedError(RuntimeError):
    """The engine cannot take a request now (its core process does not read its input: the
    bytes waiting for it passed their bound); the server answers 503 with ``Retry-After``."""


class OutputStreams:
    """The caller's side of a request's outputs, shared by :class:`AsyncLLMEngine` and the
    engine core process's client (:class:`inferctl.engine.core_client.CoreClient`): each
    :meth:`generate` has an :class:`OutputQueue` on its event loop, filled by the subclass's
    ``_submit`` (which validates and queues the request) and drained here."""

    _queues: dict[str, OutputQueue]

    def _submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                arrival_time: float | None, x_request_id: str | None) -> OutputQueue:
        raise NotImplementedError

    def abort(self, request_id: str) -> None:
        raise NotImplementedError

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       arrival_time: float | None = None,
                       x_request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; the last one has ``finished=True``. ``x_request_id``:
        the HTTP request's ``X-Request-Id``, kept with the request (``/stats``, OOM faults).
        ``arrival_time``: epoch seconds (``time.time()``), None = now.

        Raises :class:`AdmissionError` (before the first yield) when the engine will not take
        the request, ``RuntimeError`` when the engine is not started, and
        :class:`EngineDeadError` if it shuts down meanwhile.
        """
        queue = self._submit(request_id, prompt_token_ids, params, arrival_time, x_request_id)
        self._queues[request_id] = queue
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if self._queues.get(request_id) is queue:
                del self._queues[request_id]
            if not finished and not queue.ended:
                self.abort(request_id)

    def redirect(self, request_id: str, sink: Callable[[RequestOutput | BaseException], None]) -> None:
        """Deliver the rest of ``request_id``'s outputs to ``sink`` instead of its
        :meth:`generate` iterator: ``sink(item)`` is called on the request's event loop, once per
        item, in order — each a :class:`RequestOutput` (the last ``finished``) or the exception
        the iterator would have raised. Items already queued are delivered first, now.

        Call it on that loop while the iterator is suspended after an output (e.g. the first, from
        ``start``), then close the iterator (``aclose``) once ``sink`` saw the end: that aborts
        the request only if it has not ended. The sink must not raise and must not block.
        Raises ``KeyError`` when no :meth:`generate` of ``request_id`` is open.
        """
        self._queues[request_id].redirect(sink)


class AsyncLLMEngine(OutputStreams):
    """Runs ``engine`` on a background thread. Call :meth:`start` before :meth:`generate`.

    ``stats()``, ``request_precision()``, ``inject_fault()`` and ``set_draining()`` may be called
    from any thread: they post commands to the engine's mailbox. ``stats()`` and
    ``set_draining()`` wait for the current step to end (at most one step).
    """

    #: Seconds ``set_draining`` waits for the stepping thread to apply the drain.
    DRAIN_APPLY_TIMEOUT = 30.0

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._cv = threading.Condition()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, OutputQueue]] = {}
        self._queues: dict[str, OutputQueue] = {}   # open generate() calls; touched on their loops only
        self._pending_adds: list[Sequence] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.step_errors_total = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the stepping thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="inferctl-engine-step", daemon=True)
        self.engine.mailbox.on_post = self._wake
        self.engine.attach_stepping_thread(self._thread)
        self._thread.start()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the thread; every open stream ends with an :class:`EngineDeadError`."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self.engine.attach_stepping_thread(None)
                self.engine.mailbox.on_post = None
        with self._cv:
            streams, self._streams = self._streams, {}
            self._pending_adds.clear()
        err = EngineDeadError("the engine was shut down")
        for loop, queue in streams.values():
            try:
                loop.call_soon_threadsafe(queue.deliver, err)
            except RuntimeError:   # loop already closed
                pass

    # ------------------------------------------------------------------ requests
    def _submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                arrival_time: float | None, x_request_id: str | None) -> OutputQueue:
        """Validate and queue one request (:meth:`OutputStreams.generate`); its queue."""
        if not self.is_running:
            raise RuntimeError("AsyncLLMEngine is not started (call start())")
        seq = self.engine.make_sequence(request_id, prompt_token_ids, params, arrival_time)
        seq.x_request_id = x_request_id
        queue = OutputQueue()
        self.register(seq, asyncio.get_running_loop(), queue)
        return queue

    def register(self, seq: Sequence, loop, queue) -> None:
        """Queue ``seq`` for the stepping thread; its outputs go to ``queue.deliver`` through
        ``loop.call_soon_threadsafe`` (one :func:`_put_all` per loop per step; an error as
        ``queue.deliver(exc)``). :meth:`generate` passes its event loop and an
        :class:`OutputQueue`; the engine core process (:mod:`inferctl.engine.core_process`)
        passes objects that send them to the API process.

        Raises :class:`AdmissionError` (400, ``request_id``) when a request of that id is running."""
        with self._cv:
            if seq.request_id in self._streams:
                raise AdmissionError(400, "request_id", f"request {seq.request_id!r} is already running")
            self._streams[seq.request_id] = (loop, queue)
            self._pending_adds.append(seq)
            self._cv.notify()

    def abort(self, request_id: str) -> None:
        """Abort a request (its stream is dropped; blocks are freed at the step boundary)."""
        with self._cv:
            self._streams.pop(request_id, None)
            before = len(self._pending_adds)
            self._pending_adds = [s for s in self._pending_adds if s.request_id != request_id]
            queued = len(self._pending_adds) != before
        if not queued:
            self.engine.post(AbortRequest(request_id=request_id))

    def abort_all(self, message: str) -> int:
        """Fail every open request with ``EngineDeadError(message)`` and abort it in the engine
        (its KV blocks are freed at the next step boundary; ``finish_reason`` ``abort``).
        Used when a shutdown grace period runs out. Returns how many requests were open."""
        with self._cv:
            streams, self._streams = self._streams, {}
            self._pending_adds.clear()
        for request_id in streams:
            self.engine.post(AbortRequest(request_id=request_id))
        err = EngineDeadError(message)
        for loop, queue in streams.values():
            try:
                loop.call_soon_threadsafe(queue.deliver, err)
            except RuntimeError:   # loop already closed
                pass
        return len(streams)

    # ------------------------------------------------------------------ admin
    def request_precision(self, mode: str) -> None:
        """See :meth:`LLMEngine.request_precision`; applied before the next step."""
        self.engine.post(SwitchPrecision(mode=mode))

    def inject_fault(self, kind: str = "oom", count: int = 1) -> None:
        """See :meth:`LLMEngine.inject_fault`. Raises ``ValueError`` for a bad kind/count."""
        self.engine.post(InjectFault(kind=kind, count=count))

    def set_draining(self, draining: bool) -> None:
        """See :meth:`LLMEngine.set_draining`. Returns once the stepping thread has applied it
        (at most one step), so a request admitted after this call sees the drain."""
        self.engine.post(SetDraining(draining=draining)).wait(self.DRAIN_APPLY_TIMEOUT)

    async def set_draining_async(self, draining: bool) -> None:
        """:meth:`set_draining` without blocking the event loop (it waits for the step in flight)."""
        await asyncio.get_running_loop().run_in_executor(None, self.set_draining, draining)

    @property
    def precision(self) -> str:
        return self.engine.precision

    @property
    def requested_precision(self) -> str:
        return self.engine.requested_precision

    def stats(self) -> dict:
        """The engine's ``/stats`` document, taken between steps."""
        doc = self.engine.stats()
        doc["engine"]["step_thread_alive"] = self.is_running
        return doc

    def latency_histograms(self) -> dict:
        """The engine's cumulative latency histograms (``requests.latency_histograms`` of
        ``/stats``, :meth:`inferctl.engine.stats.EngineStats.latency_histograms`), read without
        waiting for the step in flight: the server adds every served model's to ``/stats``."""
        return self.engine.stats_.latency_histograms()

    async def get_latency_histograms(self) -> dict:
        """:meth:`latency_histograms` (read at once: nothing waits for the step in flight)."""
        return self.latency_histograms()

    async def get_stats(self) -> dict:
        """:meth:`stats` without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.stats)

    # ------------------------------------------------------------------ the thread
    def _has_work(self) -> bool:
        e = self.engine
        return bool(self._pending_adds or len(e.mailbox) or e.has_unfinished_requests())

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cv:
                while not self._stopping and not self._has_work():
                    self._cv.wait()
                if self._stopping:
                    return
            outputs: list[RequestOutput] = []
            try:
                engine.apply_commands()   # between steps, even during a backoff
                wait = engine.backoff_remaining()
                if wait > 0:
                    with self._cv:
                        self._cv.wait(wait)
                    continue
                with self._cv:
                    adds, self._pending_adds = self._pending_adds, []
                with engine.step_lock:
                    for seq in adds:
                        try:
                            engine.enqueue(seq)
                        except AdmissionError as err:
                            self._deliver_error(seq.request_id, err)
                    outputs = engine.step()
            except Exception as exc:   # noqa: BLE001 — keep the thread alive, fail the streams
                self.step_errors_total += 1
                logger.exception("engine step failed")
                self._fail_all(exc)
                time.sleep(0.01)
                continue
            if outputs:
                self._dispatch(outputs)
            elif engine.last_step_idle and engine.has_unfinished_requests():
                with self._cv:   # nothing could be scheduled: do not spin
                    self._cv.wait(0.001)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        with self._cv:
            streams = self._streams
            for out in outputs:
                entry = streams.get(out.request_id)
                if entry is None:
                    continue
                if out.finished:
                    del streams[out.request_id]
                by_loop.setdefault(entry[0], []).append((entry[1], out))
        post_by_loop(by_loop)

    def _deliver_error(self, request_id: str, err: BaseException) -> None:
        with self._cv:
            entry = self._streams.pop(request_id, None)
        if entry is not None:
            try:
                entry[0].call_soon_threadsafe(entry[1].deliver, err)
            except RuntimeError:
                pass

    def _fail_all(self, exc: BaseException) -> None:
        """Abort every request after a step raised; every open stream gets the error, so the
        requests queued meanwhile are dropped too (else they would run with no listener).
        Counted in ``/stats`` ``scheduler.step_errors_total`` / ``last_step_error``."""
        with self.engine.step_lock:
            self.engine.abort_all()
            self.engine.record_step_error(f"step raised: {type(exc).__name__}: {exc}")
        with self._cv:
            streams, self._streams = self._streams, {}
            self._pending_adds.clear()
        for loop, queue in streams.values():
            try:
                loop.call_soon_threadsafe(queue.deliver, RuntimeError(f"engine step failed: {exc}"))
            except RuntimeError:
                pass


class OutputQueue(asyncio.Queue):
    """One request's outputs on its event loop: queued for the :meth:`AsyncLLMEngine.generate`
    iterator, or handed to ``sink`` once :meth:`AsyncLLMEngine.redirect` set one. ``ended``:
    the last item (a finished output or an exception) went to the sink."""

    def __init__(self) -> None:
        super().__init__()
        self.sink: Callable[[RequestOutput | BaseException], None] | None = None
        self.ended = False

    def deliver(self, item: RequestOutput | BaseException) -> None:
        """Queue ``item`` or pass it to the sink (on the loop; never raises)."""
        if self.sink is None:
            self.put_nowait(item)
        elif not self.ended:
            self.deliver_to(self.sink, item)

    def redirect(self, sink: Callable[[RequestOutput | BaseException], None]) -> None:
        """Hand the items queued so far to ``sink``, now and in order, then every later one
        (:meth:`AsyncLLMEngine.redirect`)."""
        while not self.empty() and not self.ended:
            self.deliver_to(sink, self.get_nowait())
        self.sink = sink

    def deliver_to(self, sink: Callable[[RequestOutput | BaseException], None],
                   item: RequestOutput | BaseException) -> None:
        if isinstance(item, BaseException) or item.finished:
            self.ended = True
        sink(item)


def post_by_loop(by_loop: dict) -> None:
    """One :func:`_put_all` of ``items`` per event loop (``{loop: [(queue, item), ...]}``), from
    any thread; a closed loop (nobody listening) is skipped."""
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:   # the caller's loop is closed
            pass


def _put_all(items: list) -> None:
    for queue, out in items:
        queue.deliver(out)
