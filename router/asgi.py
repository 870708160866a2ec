"""The router's hot path at the ASGI level: request headers, the request body, a pass-through response.

The two completion routes (and the tokenizer API) skip Starlette's ``Request``, ``Headers`` and
``Response`` header machinery (docs/router.md, "Cost per request"):

* :func:`scope_headers` — the request's headers as one ``dict`` (lower-case name → Latin-1
  value; a repeated name counts by its first value, as on the engine: Starlette's
  ``Headers.get`` and its API-key check read the first), built once per request;
* :class:`AsgiBody` — the body source :func:`inferctl.contract.http.read_body` reads (``headers``
  and ``stream()``), straight over ASGI ``receive``; a client gone before its body ends raises
  Starlette's ``ClientDisconnect``, as ``Request.stream()`` does (the reader's 400 ``disconnected``);
* :func:`response_headers` — an upstream answer's raw header pairs minus the hop-by-hop ones and
  those the router's server sets itself, plus ``x-request-id`` and ``x-inferctl-replica``, as ASGI
  ``(bytes, bytes)`` pairs: no decoding and re-encoding of what is only passed on;
* :class:`PassThrough` — a Starlette ``Response`` over such a header list and a whole body
  (Starlette's own ``__call__``: one ``http.response.start``, one ``http.response.body``);
* :class:`ClientWatch` — while the router waits for a replica's answer, watches ``receive`` for
  the client's disconnect and cancels the waiting task, so the upstream connection is closed and
  the replica aborts the generation (docs/router.md, "Client disconnects").
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncIterator, Iterable

from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope

#: Response headers never passed on from a replica: RFC 9110 section 7.6.1 hop-by-hop ones, the
#: framing the router's server sets (``content-length``, ``transfer-encoding``), the router's own
#: ``x-request-id`` / ``x-inferctl-replica``, and ``date`` / ``server``, which uvicorn adds to
#: every answer (passed on, the client got each twice; RFC 9110 section 6.6.1: one ``Date``).
DROPPED_RESPONSE_HEADERS = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization",
                                      b"te", b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"host",
                                      b"content-length", b"x-request-id", b"x-inferctl-replica", b"date",
                                      b"server"})

#: A byte outside tab and printable ASCII (RFC 9110 section 5.5 field-vchar, SP, HTAB).
_NOT_PRINTABLE = re.compile(rb"[^\t\x20-\x7e]")


def scope_headers(scope: Scope) -> dict[str, str]:
    """The request headers of ASGI ``scope`` as lower-case name → value (Latin-1). A repeated
    name keeps its FIRST value, the one the engine reads (``Content-Type``, ``Content-Length``,
    ``X-Request-Id``, ``Authorization``): joined with ``", "`` the router refused what the engine
    accepts (415, 400) or forwarded a value the engine refuses (``Bearer a, Bearer b``); the
    later values are neither read nor forwarded. ASGI servers give names lower-case already."""
    out: dict[str, str] = {}
    for k, v in scope.get("headers") or ():
        name = k.decode("latin-1")
        if name not in out:
            out[name] = v.decode("latin-1")
    return out


class AsgiBody:
    """A request body source over ASGI ``receive`` (``headers``: :func:`scope_headers`' dict).

    ``stream()`` is the body's chunks as they arrive, an async iterator object rather than an
    async generator (the event loop tracks every async generator it starts in a weak set, a
    cost on each request); it raises Starlette's ``ClientDisconnect`` when the client went away
    before the body's end. Read it once."""

    __slots__ = ("headers", "_receive", "_done")

    def __init__(self, headers: dict[str, str], receive: Receive) -> None:
        self.headers = headers
        self._receive = receive
        self._done = False

    def stream(self) -> AsyncIterator[bytes]:
        """The body's chunks (class docstring)."""
        return self

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        while not self._done:
            message = await self._receive()
            if message["type"] == "http.request":
                self._done = not message.get("more_body", False)
                body = message.get("body", b"")
                if body:
                    return body
            elif message["type"] == "http.disconnect":
                self._done = True
                raise ClientDisconnect()
        raise StopAsyncIteration


def response_headers(raw: Iterable[tuple[bytes, bytes]], request_id: bytes,
                     replica: bytes) -> list[tuple[bytes, bytes]]:
    """ASGI response headers from an upstream answer's raw ``(name, value)`` pairs (module
    docstring): names lower-cased, :data:`DROPPED_RESPONSE_HEADERS`, the fields the replica's
    ``Connection`` header names and values that are not printable ASCII left out, then
    ``x-request-id`` and ``x-inferctl-replica``."""
    out = []
    listed = None
    for k, v in raw:
        k = k.lower()
        if k == b"connection":
            listed = v if listed is None else listed + b"," + v
        elif k not in DROPPED_RESPONSE_HEADERS and (v.isascii() and _NOT_PRINTABLE.search(v) is None):
            out.append((k, v))
    if listed is not None:      # RFC 9110 section 7.6.1: the fields Connection names are hop-by-hop too
        names = {t.strip().lower() for t in listed.split(b",")}
        out = [(k, v) for k, v in out if k not in names]
    out.append((b"x-request-id", request_id))
    out.append((b"x-inferctl-replica", replica))
    return out


class PassThrough(Response):
    """A whole upstream body with ready-made ASGI headers (``content-length`` appended here).

    ``status``: the HTTP status; ``headers``: :func:`response_headers`' list (taken, not copied);
    ``body``: the bytes to send."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:  # noqa: D107
        self.status_code = status
        self.body = body
        self.background = None
        headers.append((b"content-length", str(len(body)).encode()))
        self.raw_headers = headers


class ClientWatch:
    """Cancels the current task if the client disconnects before :meth:`stop` (make it inside the
    task that waits for the replica, after the request body was read whole).

    On ``http.disconnect`` before :meth:`stop`, ``gone`` becomes True and the watched task is
    cancelled: its pending upstream call raises ``CancelledError``, which the caller catches,
    checks ``gone`` and ``Task.uncancel()``s (a cancel with ``gone`` False is someone else's:
    re-raise it). Two ways to learn of the disconnect, the cheaper first:

    * **uvicorn** (the router's server): ``receive`` is a bound method of uvicorn's per-request
      cycle, whose ``message_event`` (an ``asyncio.Event``) uvicorn sets when the connection is
      lost (``disconnected`` then True) or the response is complete. One future is added to that
      event's waiters — what ``Event.wait()`` itself does, without a task to run it — and taken
      out at :meth:`stop`. A wake-up that is not a disconnect re-arms it.
    * **any other ASGI server** (httpx's ``ASGITransport`` in the tests): one small task awaits
      ``receive`` until ``http.disconnect`` (after the body a server sends nothing else); a
      ``receive`` that raises ends the watch quietly. :meth:`stop` cancels it (no message is
      consumed, so a stream's own disconnect listener still gets it).

    Measured (in-process ASGI calls with a stub upstream, CPU per request): the task costs about
    25 µs (its steps, the cancel's exception, the cycles it leaves to the garbage collector), the
    event waiter about 4 µs (docs/router.md, "Client disconnects")."""

    __slots__ = ("gone", "_task", "_cycle", "_event", "_fut", "_watcher")

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self._task: asyncio.Task | None = asyncio.current_task()
        self._fut: asyncio.Future | None = None
        self._watcher: asyncio.Task | None = None
        cycle = getattr(receive, "__self__", None)
        event = getattr(cycle, "message_event", None)
        if type(event) is asyncio.Event and type(getattr(event, "_waiters", None)) is deque \
                and type(getattr(cycle, "disconnected", None)) is bool:
            self._cycle, self._event = cycle, event
            self._arm()
        else:
            self._cycle = self._event = None
            self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    def _arm(self) -> None:
        fut = self._fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(self._woken)
        self._event._waiters.append(fut)        # what Event.wait() does; Event.set() resolves it

    def _woken(self, _fut: asyncio.Future) -> None:
        if self._task is None:
            return
        if self._cycle.disconnected:
            self._gone()
        else:                                   # the event was set for another reason: keep watching
            self._event._waiters.remove(_fut)
            self._arm()

    async def _watch(self, receive: Receive) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # noqa: BLE001 - a server whose receive fails: stop watching, the request goes on
            return
        if self._task is not None:
            self._gone()

    def _gone(self) -> None:
        self.gone = True
        self._task.cancel()

    def stop(self) -> None:
        """Stop watching (idempotent); a disconnect after this cancels nothing."""
        self._task = None
        fut = self._fut
        if fut is not None:
            self._fut = None        # no reference cycle left for the garbage collector
            try:
                self._event._waiters.remove(fut)
            except ValueError:      # already woken and out
                pass
        elif self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
