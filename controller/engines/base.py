"""The engine client interface: one snapshot per poll, whatever the engine.

A client reaches its engine over HTTP only, with a timeout below the poll interval: the
controller's polls go through ``poll_async(poller, now)`` on the shared event loop and its HTTP
client (libcurl, else aiohttp) (:class:`~inferctl.controller.scrape.aio.AsyncPoller`); ``poll(now)`` is the same
poll over a synchronous ``httpx.Client`` (tests with an httpx transport, one-off calls).
``poll``/``poll_async`` never raise: a refused connection, a timeout, a 5xx or an unreadable body is
``EngineSnapshot(ok=False, error=...)`` with every number ``None``. Admin calls (bundled engine
only) raise :class:`EngineAdminError` with the HTTP status and the engine's message.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from typing import Any

import httpx

from inferctl.controller.scrape.aio import AsyncPoller
from inferctl.controller.scrape.http import bounded_request
from inferctl.controller.types import EngineSnapshot, engine_snapshot

__all__ = ["EngineAdminError", "EngineClient", "describe_error", "failed_snapshot"]


class EngineAdminError(RuntimeError):
    """An admin call failed. ``status`` is the HTTP status (0: no response), ``message`` the
    engine's own words (its JSON ``detail``/``error`` when it sent one)."""

    def __init__(self, status: int, message: str, *, path: str = "") -> None:
        self.status = status
        self.message = message
        self.path = path
        super().__init__(f"{path or 'admin call'}: HTTP {status}: {message}" if status
                         else f"{path or 'admin call'}: {message}")


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a failed admin call may still have reached the engine: no HTTP answer (an
    :class:`~inferctl.controller.engines.base.EngineAdminError` with status 0, or a bare
    ``httpx`` error) other than a refused or timed-out connection (nothing was sent)."""
    if getattr(exc, "status", None) not in (0, None):
        return False      # the engine answered (4xx/5xx): it did not take the call
    cause = exc if isinstance(exc, httpx.HTTPError) else exc.__cause__
    return isinstance(cause, httpx.HTTPError) and not isinstance(cause, (httpx.ConnectError, httpx.ConnectTimeout))


class EngineClient(abc.ABC):
    """Base of all engine clients.

    ``name``: the engine's configured name (from the controller config, never from a request).
    ``kind``: ``"bundled"``, ``"vllm"``, ``"tgi"`` or ``"llamacpp"``. ``base_url`` without a
    trailing slash. ``timeout_s``: per-request bound in seconds (must be > 0).
    """

    kind: str = "engine"

    def __init__(self, name: str, base_url: str, *, timeout_s: float = 2.0,
                 headers: dict[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        if not name:
            raise ValueError("engine name must be a non-empty string")
        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"engine {name!r}: base_url {base_url!r} must start with http:// or https://")
        if not timeout_s > 0:
            raise ValueError(f"engine {name!r}: timeout_s must be > 0, got {timeout_s!r}")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self._headers = dict(headers or {})
        #: ``poll_async`` reaches the real network; a client given an httpx ``transport`` (a test
        #: double) is polled through ``poll`` instead, so the transport is honoured.
        self.supports_async = transport is None
        self._transport = transport
        # the synchronous client (admin calls, and polls where ``supports_async`` is False) is
        # built on first use: an httpx.Client loads the CA bundle into an SSL context (~10 ms
        # of CPU), which at 1,024 engines made the controller's start cost seconds for clients
        # most of which only ever poll through the shared poller
        self._sync: httpx.Client | None = None
        self._sync_lock = threading.Lock()
        self._closed = False

    @property
    def _client(self) -> httpx.Client:
        """The synchronous ``httpx.Client`` (built on first use; thread-safe)."""
        client = self._sync
        if client is None:
            with self._sync_lock:
                if self._sync is None:
                    self._sync = httpx.Client(base_url=self.base_url, timeout=self.timeout_s,
                                              headers=self._headers, transport=self._transport)
                    if self._closed:
                        self._sync.close()
                client = self._sync
        return client

    @abc.abstractmethod
    def poll(self, now: float) -> EngineSnapshot:
        """One snapshot of the engine at ``now`` (``time.time()``). Never raises."""

    async def poll_async(self, poller: AsyncPoller, now: float) -> EngineSnapshot:
        """:meth:`poll` on ``poller``'s loop and connection pool (same snapshot, never raises).
        The default runs :meth:`poll` in a worker thread; the HTTP clients override it."""
        return await asyncio.to_thread(self.poll, now)

    def _request(self, method: str, path: str, *, timeout_s: float | None = None,
                 **kwargs: Any) -> httpx.Response:
        """A call to the engine whose whole answer (not only each read) is bounded by
        ``timeout_s`` (default the client's) and :data:`inferctl.controller.scrape.http.MAX_RESPONSE_BYTES`."""
        t = self.timeout_s if timeout_s is None else timeout_s
        return bounded_request(self._client, method, path, deadline_s=t, timeout=t, **kwargs)

    def close(self) -> None:
        with self._sync_lock:
            self._closed = True
            if self._sync is not None:
                self._sync.close()

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Admin calls: only the bundled engine has them.
    def set_precision(self, mode: str) -> dict[str, Any]:
        raise EngineAdminError(501, f"{self.kind} engines have no precision admin API", path="/admin/precision")

    def inject_fault(self, kind: str = "oom", count: int = 1) -> dict[str, Any]:
        raise EngineAdminError(501, f"{self.kind} engines have no fault admin API", path="/admin/fault")

    def drain(self, draining: bool = True) -> dict[str, Any]:
        raise EngineAdminError(501, f"{self.kind} engines have no drain admin API", path="/admin/drain")

    def route(self, model: str, to: str | None) -> dict[str, Any]:
        raise EngineAdminError(501, f"{self.kind} engines have no route admin API", path="/admin/route")


def describe_error(exc: BaseException, deadline_s: float) -> str:
    """A poll error in words: ``timed out after 0.8 s`` for a deadline, else ``Type: message``."""
    if isinstance(exc, (asyncio.TimeoutError, httpx.TimeoutException)) and not str(exc):
        return f"timed out after {deadline_s:g} s"
    return f"{type(exc).__name__}: {exc}"


def failed_snapshot(client: EngineClient, now: float, error: str) -> EngineSnapshot:
    """``ok=False`` with every number None (no data, never 0)."""
    return engine_snapshot(client.name, client.kind, False, now, error=error)
