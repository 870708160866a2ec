"""The router's upstream HTTP client: one small interface, two implementations.

:class:`Upstream` is what :class:`inferctl.router.proxy.Forwarder` needs from an HTTP client:
``await send(method, url, content=..., headers=...)`` → an :class:`UpstreamResponse` (status,
headers, the body as an async iterator of raw chunks, ``read()``, ``close()``), with every
transport failure raised as one of two exceptions:

* :class:`UpstreamConnectError` — the replica could not be reached (connection refused,
  connect timeout): the forwarder marks it ``down`` and tries another one;
* :class:`UpstreamError` — any other transport failure (reset, read timeout, a truncated body).

Implementations:

* :class:`AiohttpUpstream` (production, :func:`aiohttp_upstream`) — one ``aiohttp.ClientSession``
  per router over a ``TCPConnector`` of at most ``upstream_connections`` connections, kept alive
  between requests. Chosen by measurement (docs/benchmarks.md, router section): under 64
  concurrent streams httpx's async pool rescans every connection on every request and
  response (``AsyncConnectionPool._assign_requests_to_connections``: O(connections) per event),
  which made the router, not the engine, the bottleneck.
* :class:`HttpxUpstream` — over an ``httpx.AsyncClient``; the contract tests use it to mount
  engine apps through ``httpx.ASGITransport`` (in process, no ports), which aiohttp cannot do.

Both relay the body's raw bytes (no decompression: ``Content-Encoding`` passes through as sent)
and both close the upstream connection when a response is closed before its end, so a client
that goes away aborts the request on the replica.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import aiohttp
import httpx
import yarl

#: Seconds an idle upstream connection is kept: below uvicorn's default ``timeout_keep_alive``
#: (5 s, the engine's server), so the router never reuses a connection the engine is closing.
KEEPALIVE_SECONDS = 4.0


class UpstreamError(Exception):
    """A transport failure talking to a replica (reset, read timeout, truncated body)."""


class UpstreamConnectError(UpstreamError):
    """The replica could not be reached: connection refused or connect timeout."""


class UpstreamResponse(Protocol):
    """One upstream answer whose body is not read yet.

    ``status``: the HTTP status; ``headers``: lower-case name → value (repeated names joined
    with ``", "``, RFC 9110 section 5.3); ``raw_headers``: the ``(name, value)`` byte pairs as
    received (what the router passes on, :func:`inferctl.router.asgi.response_headers`)."""

    status: int
    headers: Mapping[str, str]
    raw_headers: "tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]]"

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's raw bytes as they arrive (raises :class:`UpstreamError`)."""

    async def read(self) -> bytes:
        """The whole body (raises :class:`UpstreamError`)."""

    async def close(self) -> None:
        """Release the response: the connection is reused when the body was read to its end,
        closed otherwise (the replica sees the disconnect). Idempotent."""


class Upstream(Protocol):
    """Sends one request to a replica (module docstring)."""

    async def send(self, method: str, url: str, *, content: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        """The answer once its status line and headers arrived (the body is not read).

        Raises:
            UpstreamConnectError: the replica could not be reached.
            UpstreamError: another transport failure before the headers arrived."""

    async def aclose(self) -> None:
        """Close every connection (at the router's shutdown)."""


def _joined(items) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in items:
        k = k.lower()
        out[k] = f"{out[k]}, {v}" if k in out else v
    return out


class _AiohttpResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.raw_headers = resp.raw_headers
        self._done = False

    @functools.cached_property
    def headers(self) -> dict[str, str]:
        """Name → value, made on first use (the forwarder passes ``raw_headers`` on)."""
        return _joined(self._resp.headers.items())

    def chunks(self) -> AsyncIterator[bytes]:
        return self

    # the chunks as an async iterator object, not an async generator: the event loop tracks every
    # async generator it starts (a weak set), a cost on each request
    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._resp.content.readany()     # b"" at the end, as iter_any()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(repr(exc)) from exc
        if not chunk:
            self._done = True
            raise StopAsyncIteration
        return chunk

    async def read(self) -> bytes:
        try:
            body = await self._resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(repr(exc)) from exc
        self._done = True
        return body

    async def close(self) -> None:
        if self._done:
            self._resp.release()     # read to its end: the connection goes back to the pool
        else:
            self._resp.close()       # cut short: close the connection, the replica sees it


class AiohttpUpstream:
    """:class:`Upstream` over one ``aiohttp.ClientSession``, made by :meth:`start` (the router
    app's startup: a session belongs to the event loop that made it) or by the first
    :meth:`send`, closed by :meth:`aclose` (shutdown).

    ``connections``: the most connections open at once (all replicas together; a request beyond
    waits for a free one, without deadline, as httpx's pool did with the router's 600 s pool
    timeout); ``connect_timeout``: TCP connect deadline (s); ``read_timeout``: the deadline
    between two bytes of the answer, headers included (s)."""

    def __init__(self, *, connections: int, connect_timeout: float, read_timeout: float) -> None:
        self.connections = connections
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self.session: aiohttp.ClientSession | None = None
        self._urls: dict[str, yarl.URL] = {}

    def start(self) -> aiohttp.ClientSession:
        """The session, made now if not yet (call inside the serving event loop)."""
        if self.session is None:
            connector = aiohttp.TCPConnector(limit=self.connections, limit_per_host=0,
                                             keepalive_timeout=KEEPALIVE_SECONDS)
            # no cookie jar: a router relays requests, it keeps no client state
            self.session = aiohttp.ClientSession(connector=connector, timeout=self.timeout, auto_decompress=False,
                                                 cookie_jar=aiohttp.DummyCookieJar())
        return self.session

    async def send(self, method: str, url: str, *, content: bytes, headers: Mapping[str, str]) -> _AiohttpResponse:
        session = self.session or self.start()
        target = self._urls.get(url)
        if target is None:          # a replica's URL and path: a few distinct ones, parsed once
            target = yarl.URL(url)
            if len(self._urls) < 1024:
                self._urls[url] = target
        try:
            resp = await session.request(method, target, data=content, headers=headers, allow_redirects=False)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise UpstreamConnectError(repr(exc)) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(repr(exc)) from exc
        return _AiohttpResponse(resp)

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None


class _HttpxResponse:
    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.status = resp.status_code
        self.headers = dict(resp.headers.items())   # httpx joins repeated names with ", "
        self.raw_headers = resp.headers.raw

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(repr(exc)) from exc

    async def read(self) -> bytes:
        try:
            return await self._resp.aread()
        except httpx.HTTPError as exc:
            raise UpstreamError(repr(exc)) from exc

    async def close(self) -> None:
        await self._resp.aclose()


class HttpxUpstream:
    """:class:`Upstream` over an ``httpx.AsyncClient`` (its own timeouts and pool; the contract
    tests pass one that mounts engine apps through ``httpx.ASGITransport``). ``aclose`` closes
    the client only when ``owns`` is true."""

    def __init__(self, client: httpx.AsyncClient, *, owns: bool = False) -> None:
        self.client = client
        self.owns = owns

    async def send(self, method: str, url: str, *, content: bytes, headers: Mapping[str, str]) -> _HttpxResponse:
        try:
            resp = await self.client.send(self.client.build_request(method, url, content=content, headers=headers),
                                          stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise UpstreamConnectError(repr(exc)) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(repr(exc)) from exc
        return _HttpxResponse(resp)

    async def aclose(self) -> None:
        if self.owns:
            await self.client.aclose()
