"""One event loop, one connection pool: the controller's telemetry polls (every engine's
``/stats`` or ``/metrics``) run concurrently on a single asyncio loop in one thread.

Why: a poll per engine in its own worker thread with its own ``httpx.Client`` costs about 2 ms
of CPU per poll (thread hand-offs, httpx's sync machinery); 256 polls over loopback measured
528 ms of CPU with that model, 4.9 s with httpx's ``AsyncClient`` on one loop, and 58 ms with
aiohttp on one loop (``python -m bench.controller_tick``, docs/benchmarks.md "Controller"). At
1,024 engines aiohttp's own request handling was most of the tick (0.3–0.7 ms of CPU per GET), so
the polls now go through libcurl (:mod:`.curl`, a ``pycurl.CurlMulti`` driven by this loop) where
pycurl imports, else aiohttp (https://docs.aiohttp.org/en/stable/client_reference.html);
:func:`poll_client` decides (``INFERCTL_POLL_CLIENT=aiohttp|curl`` overrides) and the poller logs
its choice at start.

Contracts kept from :mod:`inferctl.controller.scrape.http`: each call has one deadline for the
whole answer (``asyncio.timeout(...)`` bounds connect, headers and body together)
and reads at most ``max_bytes`` of body; a body too large to parse quickly is parsed in a worker
thread (:meth:`AsyncPoller.offload`), so one huge or slow answer never holds the loop that
serves the other engines.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import os
import threading
from typing import Any, Callable, Coroutine, TypeVar

import aiohttp
from aiohttp import hdrs

from inferctl.controller.scrape.http import MAX_RESPONSE_BYTES

try:   # pinned in pyproject (not on Windows): the loop's own cost per poll is lower on libuv
    import uvloop
except ImportError:  # pragma: no cover - Windows
    uvloop = None

try:   # pinned in pyproject: the cheaper HTTP client per poll (docs/benchmarks.md "Controller")
    from inferctl.controller.scrape.curl import CurlTransport
except ImportError:  # pragma: no cover - no pycurl wheel for this platform
    CurlTransport = None

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Bodies above this many bytes are parsed in a worker thread, not on the polling loop (a
#: recorded vLLM ``/metrics`` is 29 KiB and parses in about 1 ms; 256 KiB is ~10 ms).
INLINE_PARSE_BYTES = 256 * 1024
#: Reads of a body, in bytes per chunk.
_CHUNK = 64 * 1024
#: The session's own timeouts are off: each call is bounded by ``asyncio.timeout(deadline_s)``.
_NO_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=None)


class BodyTooLarge(Exception):
    """A response body (or its ``Content-Length``) over the caller's bound; read no further."""


#: What a bounded call may raise: a transport error (aiohttp's, or libcurl's
#: :class:`~inferctl.controller.scrape.curl.CurlTransportError`, an ``OSError``), the deadline,
#: or a body over the bound.
SCRAPE_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, BodyTooLarge, OSError, ValueError)

#: The poll clients :class:`AsyncPoller` can use.
POLL_CLIENTS = ("curl", "aiohttp")


def poll_client(requested: str | None = None) -> str:
    """The HTTP client of the polls: ``requested``, else env ``INFERCTL_POLL_CLIENT``, else
    ``"curl"`` when pycurl imports, else ``"aiohttp"``.

    Raises:
        ValueError: a requested client not in :data:`POLL_CLIENTS`, or ``"curl"`` without pycurl.
    """
    choice = (requested or os.environ.get("INFERCTL_POLL_CLIENT", "")).strip().lower()
    if not choice:
        return "curl" if CurlTransport is not None else "aiohttp"
    if choice not in POLL_CLIENTS:
        raise ValueError(f"poll client {choice!r}: must be one of {', '.join(POLL_CLIENTS)}")
    if choice == "curl" and CurlTransport is None:
        raise ValueError("poll client 'curl': pycurl is not installed")
    return choice


class AsyncPoller:
    """An asyncio loop (uvloop's where installed: https://github.com/MagicStack/uvloop) in one
    daemon thread with one HTTP client: a libcurl multi handle or one ``aiohttp.ClientSession``
    (``client``: ``"curl"``, ``"aiohttp"`` or None for :func:`poll_client`'s choice).

    ``submit(coro)`` schedules a coroutine on the loop from any thread and returns a
    ``concurrent.futures.Future``; :meth:`get` is the bounded GET the engine clients use;
    :meth:`close` stops the loop (idempotent). The session keeps one keep-alive connection per
    engine (``limit=0``: no global cap; the number of engines bounds it); so does libcurl's
    connection cache.

    Raises:
        ValueError: from :func:`poll_client`.
    """

    def __init__(self, name: str = "poller", client: str | None = None) -> None:
        self.client = poll_client(client)
        self._loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None
        self._curl = CurlTransport(self._loop, BodyTooLarge) if self.client == "curl" else None
        log.info("%s: engine polls through %s", name,
                 f"libcurl ({CurlTransport.version()})" if self._curl is not None else f"aiohttp {aiohttp.__version__}")
        self._closed = False
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> "cf.Future[T]":
        """Run ``coro`` on the loop (thread-safe). Raises RuntimeError once closed."""
        if self._closed:
            coro.close()
            raise RuntimeError("the poller is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300),
                auto_decompress=True, raise_for_status=False, timeout=_NO_TIMEOUT)
        return self._session

    async def get(self, url: str, *, deadline_s: float, max_bytes: int = MAX_RESPONSE_BYTES,
                  headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """``GET url`` -> ``(status, body)`` within ``deadline_s`` seconds in all (connect,
        headers and the whole body), reading at most ``max_bytes`` of (decoded) body.

        Raises:
            asyncio.TimeoutError: past the deadline (a body still arriving included).
            BodyTooLarge: the body or its ``Content-Length`` is over ``max_bytes``.
            aiohttp.ClientError or CurlTransportError (an OSError): refused, reset, a malformed answer.
        """
        if self._curl is not None:
            return await self._curl.get(url, deadline_s=deadline_s, max_bytes=max_bytes, headers=headers)
        # one asyncio timer for the whole call (connect, headers, body) instead of aiohttp's
        # per-request ClientTimeout machinery (a timer context and handles per request)
        async with asyncio.timeout(deadline_s), self._session_now().get(url, headers=headers,
                                                                         allow_redirects=False) as resp:
            declared = resp.content_length
            if declared is not None and declared > max_bytes:
                raise BodyTooLarge(f"GET {url}: body of {declared} bytes > {max_bytes}")
            if declared is not None and hdrs.CONTENT_ENCODING not in resp.headers:
                return resp.status, await resp.read()   # at most ``declared`` bytes: no decoding
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_chunked(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise BodyTooLarge(f"GET {url}: body larger than {max_bytes} bytes")
                chunks.append(chunk)
            return resp.status, b"".join(chunks)

    async def offload(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` inline when the body it parses is small (``size`` bytes <=
        :data:`INLINE_PARSE_BYTES`), else in a worker thread so the loop keeps serving."""
        if size <= INLINE_PARSE_BYTES:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    def close(self, timeout: float = 2.0) -> None:
        """Close the session and stop the loop's thread (pending polls are cancelled)."""
        if self._closed:
            return
        self._closed = True

        async def _shutdown() -> None:
            if self._curl is not None:
                self._curl.close()
            if self._session is not None:
                await self._session.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        try:
            asyncio.run_coroutine_threadsafe(_shutdown(), self._loop).result(timeout)
        except (cf.TimeoutError, RuntimeError):
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()
