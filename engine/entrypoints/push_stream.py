"""The streaming fast path: SSE chunks written from the engine's output callbacks.

The general streaming path (:func:`inferctl.engine.entrypoints.sse.stream_guard` under
Starlette's ``StreamingResponse``) resumes a chain of async generators and the ASGI ``send``
coroutines for every output: the event loop's CPU fell from 54 to 41 µs a token on this
project's benchmark host without them, time the stepping thread waited for behind the GIL
(docs/performance.md, "Wave 13"). :class:`PushedStream` serves a one-choice stream instead by having
:meth:`~inferctl.engine.async_engine.AsyncLLMEngine.redirect` call a plain function on the loop
for each output: it renders the chunk and drives the ``send`` coroutine to completion at once,
which it does without suspending unless the socket's write buffer is full (uvicorn's flow
control). Then the coroutine is resumed when its future completes, and chunks that come
meanwhile wait, in order, behind it.

The bytes on the wire are the general path's: the same chunks, an ``error`` event (the OpenAI
error object) then ``[DONE]`` on an engine failure, no ``[DONE]`` after a client disconnect,
which aborts the request (its KV blocks are freed at the next step boundary) and is counted as
an abort with reason ``client_disconnect``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from fastapi.responses import Response

from inferctl.contract.errors import APIError
from inferctl.engine.entrypoints.errors import output_failure
from inferctl.engine.entrypoints.generation import _api_error, aclose, token_counts
from inferctl.engine.entrypoints.request_log import note_finished
from inferctl.engine.entrypoints.sse import DONE, sse
from inferctl.engine.entrypoints.state import ServedModel
from inferctl.engine.metrics import ABORT_CLIENT_DISCONNECT

if TYPE_CHECKING:
    from inferctl.engine.engine import RequestOutput
    from inferctl.engine.entrypoints.generation import Started

log = logging.getLogger(__name__)

#: ``render(output)``: the SSE chunk(s) for one output (several events in one ``bytes``), or None
#: to send nothing for it (text held back: a possible stop string or a partial character).
Render = Callable[["RequestOutput"], "bytes | None"]


class PushedStream(Response):
    """A ``text/event-stream`` response for ONE started generation, fed by engine callbacks.

    Args:
        served: the model served (abort and error counters, the async engine).
        started: ``(iterator, first output)`` from :func:`~inferctl.engine.entrypoints.generation.start`.
        request_id: the engine request id of ``started``.
        render: the chunk(s) of one output (see :data:`Render`); should not raise (if it does,
            the stream ends with a 500 ``internal_error`` event, as :func:`stream_guard`'s).
        retry_after: seconds for the ``Retry-After`` of a 503 error event.
        prompt_tokens: the prompt's length, the usage count until an output reports its own.
        usage: ``usage(prompt_tokens, completion_tokens)`` is the chunk after the last output
            (``stream_options.include_usage``; counted here, with
            :func:`~inferctl.engine.entrypoints.generation.token_counts`); None: no usage chunk.
        head: the chunks before the first output (chat's ``delta.role`` chunk).
    """

    media_type = "text/event-stream"

    def __init__(self, served: ServedModel, started: Started, request_id: str, render: Render,
                 retry_after: int, prompt_tokens: int, usage: Callable[[int, int], bytes] | None,
                 head: bytes = b"") -> None:
        super().__init__(status_code=200, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._served, self._started, self._request_id = served, started, request_id
        self._render, self._retry_after, self._usage, self._head = render, retry_after, usage, head
        self._counts = (prompt_tokens, 0)   # prompt tokens, completion tokens

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        agen, first = self._started
        writer = _Writer(send, asyncio.get_running_loop())
        context = contextvars.copy_context()   # the request log's record (note_finished)
        ended = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if self._head:
                writer.write(self._head)
            if first is None or self._take(first, writer):
                ended = True
            else:
                self._served.async_engine.redirect(
                    self._request_id, lambda item: context.run(self._on_item, item, writer))
                ended = await _wait_or_disconnect(writer.finished, receive)
            if ended:
                await writer.flushed()
            if not ended or writer.error is not None:   # the client left, or send failed: it is gone
                ended = False
                self._served.count_abort(ABORT_CLIENT_DISCONNECT)
                if writer.error is not None:
                    raise writer.error   # as the general path: the ASGI server sees send's error
                return
            tail = [] if writer.failed or self._usage is None else [self._usage(*self._counts)]
            for chunk in (*tail, DONE):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not ended:
                self._served.count_abort(ABORT_CLIENT_DISCONNECT)   # e.g. the server shut down
            raise
        finally:
            writer.closed = True
            await aclose(agen)   # aborts the request only if it has not ended

    def _on_item(self, item: RequestOutput | BaseException, writer: _Writer) -> None:
        """One engine item, on the loop (the redirect sink)."""
        if writer.closed or writer.finished.done():
            return
        if isinstance(item, BaseException):
            api = item if isinstance(item, APIError) else _api_error(item, self._served, self._retry_after)
            writer.write(sse(api.body()))
            writer.finish(failed=True)
            return
        self._take(item, writer)

    def _take(self, out: RequestOutput, writer: _Writer) -> bool:
        """Write ``out``'s chunk; True when it ended the stream."""
        try:
            if out.finished:
                note_finished(out)   # the request's log line, failed or not (as ``outputs``)
            failure = output_failure(out, self._retry_after)
            if failure is not None:
                writer.write(sse(failure.body()))
                writer.finish(failed=True)
                return True
            prompt, completion = self._counts
            self._counts = token_counts(out, prompt, completion + len(out.new_token_ids))
            chunk = self._render(out)
        except Exception as exc:  # noqa: BLE001 - a stream must end cleanly
            log.exception("streaming failed: %s", exc)
            self._served.count_error("internal")
            writer.write(sse(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").body()))
            writer.finish(failed=True)
            return True
        if chunk is not None:
            writer.write(chunk)
        if out.finished:
            writer.finish(failed=False)
            return True
        return False


async def _wait_or_disconnect(finished: asyncio.Future, receive: Callable) -> bool:
    """Wait for ``finished``; False if the client disconnected first (``http.disconnect``)."""
    if finished.done():
        return True

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    listener = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((finished, listener), return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
    return finished.done()


class _Writer:
    """Sends body chunks in order through an ASGI ``send``, synchronously when it can.

    ``write`` starts the ``send`` coroutine and runs it to its end at once; if it suspends (on
    uvicorn's flow-control future, or a bare ``yield``), it is resumed when that future
    completes (``call_soon`` for a bare yield) — what an asyncio Task would do — and chunks
    written meanwhile queue behind it. ``finished``: a future set when the stream's last
    output (or its error event) was written, or when ``send`` raised (``error``: the exception;
    later writes are dropped).
    """

    def __init__(self, send: Callable, loop: asyncio.AbstractEventLoop) -> None:
        self._send, self._loop = send, loop
        self._pending: deque[bytes] = deque()
        self._blocked: Coroutine[Any, Any, None] | None = None
        self._idle: asyncio.Future | None = None
        self.finished: asyncio.Future = loop.create_future()
        self.failed = False
        self.closed = False
        self.error: BaseException | None = None   # what ``send`` raised: the client is gone

    def write(self, chunk: bytes) -> None:
        if self.closed:
            return
        if self._blocked is not None:
            self._pending.append(chunk)
        else:
            self._run(self._send({"type": "http.response.body", "body": chunk, "more_body": True}))

    def finish(self, failed: bool) -> None:
        self.failed = failed
        if not self.finished.done():
            self.finished.set_result(None)

    async def flushed(self) -> None:
        """Return once every written chunk has been handed to ``send``."""
        while self._blocked is not None:
            if self._idle is None:
                self._idle = self._loop.create_future()
            await self._idle

    def _run(self, coro: Coroutine[Any, Any, None]) -> None:
        while True:
            try:
                yielded = coro.send(None)
            except StopIteration:
                pass
            except Exception as exc:  # noqa: BLE001 - the transport failed: the client is gone
                log.debug("stream send failed: %s", exc)
                self.closed, self.error = True, exc
                self._pending.clear()
                if not self.finished.done():
                    self.finished.set_result(None)   # stop waiting for outputs nobody can get
            else:
                self._blocked = coro
                if yielded is None:
                    self._loop.call_soon(self._resume)
                else:
                    yielded._asyncio_future_blocking = False
                    yielded.add_done_callback(lambda _f: self._resume())
                return
            self._blocked = None
            if not self._pending or self.closed:
                break
            coro = self._send({"type": "http.response.body", "body": self._pending.popleft(), "more_body": True})
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        self._idle = None

    def _resume(self) -> None:
        coro, self._blocked = self._blocked, None
        if coro is not None:
            self._run(coro)
