"""The controller's polls through libcurl (https://curl.se/libcurl/, via pycurl
http://pycurl.io/docs/latest/curlmultiobject.html), driven by the poller's asyncio loop.

Why: at 1,024 engines a tick makes ~1,536 GETs; aiohttp's request handling cost 0.3–0.7 ms of
CPU per GET on this host, libcurl's ~0.12 ms (same fake fleet, same run; docs/benchmarks.md
"Controller"). The HTTP work is libcurl's; this module only hooks one ``CurlMulti`` to the loop
with the standard ``multi_socket_action`` pattern (https://curl.se/libcurl/c/ephiperfifo.html):
``CURLMOPT_SOCKETFUNCTION`` -> the transport's own ``epoll`` (``register/modify/unregister``), whose
one descriptor the loop watches (``loop.add_reader``); ``CURLMOPT_TIMERFUNCTION`` ->
``loop.call_later``; each ready socket (all of one ``epoll.poll``, then one ``info_read`` pass) or
expired timer -> ``socket_action``. Where ``select.epoll`` is missing (not Linux), each socket is
watched on the loop itself (``loop.add_reader/add_writer``).

Why an epoll of its own: libcurl asks to watch a keep-alive connection's socket when a GET starts
and to stop when it ends, so every GET added and removed a loop watch (a uvloop/libuv poll handle
made and closed each time); an ``epoll_ctl`` through ``select.epoll`` is a C call. 1,024 GETs a
round over the bench's fleet, same process, the two alternating: 116 vs 143 ms CPU median.

Contract (the same as :meth:`inferctl.controller.scrape.aio.AsyncPoller.get`): one deadline for
the whole call (``CURLOPT_TIMEOUT_MS``: connect, headers and body), at most ``max_bytes`` of
DECODED body (``CURLOPT_MAXFILESIZE_LARGE`` for a declared ``Content-Length``, the write callback
for what arrives: it returns 0 past the bound, which aborts the transfer), redirects not followed,
HTTP/1.1, no proxy from the environment. Easy handles are reused per (URL, headers) and the
multi handle's connection cache keeps one keep-alive connection per engine.
"""

from __future__ import annotations

import asyncio
import select
from typing import Any

import pycurl

try:   # httpx depends on certifi: the CA bundle for https engines (libcurl's built-in path may not exist)
    import certifi
except ImportError:  # pragma: no cover
    certifi = None


class CurlTransportError(OSError):
    """A transport error reported by libcurl (refused, reset, malformed answer...): ``code`` is
    libcurl's ``CURLcode`` (https://curl.se/libcurl/c/libcurl-errors.html)."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(f"curl error {code}: {message}")


_POLL_IN, _POLL_OUT, _POLL_REMOVE = pycurl.POLL_IN, pycurl.POLL_OUT, pycurl.POLL_REMOVE
_CSELECT_IN, _CSELECT_OUT = pycurl.CSELECT_IN, pycurl.CSELECT_OUT
_SOCKET_TIMEOUT, _E_CALL_MULTI_PERFORM = pycurl.SOCKET_TIMEOUT, pycurl.E_CALL_MULTI_PERFORM
_EPOLL = getattr(select, "epoll", None)
_EPOLLIN, _EPOLLOUT = getattr(select, "EPOLLIN", 1), getattr(select, "EPOLLOUT", 4)
_EPOLL_FAIL = getattr(select, "EPOLLERR", 8) | getattr(select, "EPOLLHUP", 16)
#: libcurl's watch request (POLL_IN / POLL_OUT / both) -> the epoll event mask.
_EPOLL_MASK = {_POLL_IN: _EPOLLIN, _POLL_OUT: _EPOLLOUT, _POLL_IN | _POLL_OUT: _EPOLLIN | _EPOLLOUT}
#: libcurl's watch request -> the ``socket_action`` bits of an error or hang-up on that socket (the
#: directions watched, as the loop's own watches report one: readable and/or writable).
_FAIL_ACTION = {_POLL_IN: _CSELECT_IN, _POLL_OUT: _CSELECT_OUT, _POLL_IN | _POLL_OUT: _CSELECT_IN | _CSELECT_OUT}
#: Two timer requests within this many seconds are the same expiry (libcurl gives milliseconds
#: relative to its own clock reading; the loop's ``time()`` is read a moment later).
_SAME_TIMER_S = 0.001

#: Idle easy handles kept per (URL, headers); more concurrent calls to one URL make more.
_IDLE_PER_KEY = 2
#: Size of libcurl's connection cache (``CURLMOPT_MAXCONNECTS``). Its default is 4 × the easy
#: handles in flight (64 polls at once: 256), so at 1,024 engines connections were evicted and
#: re-opened every tick; one keep-alive connection per engine needs one slot per engine.
MAX_CONNECTIONS = 16384


class _Call:
    """One easy handle's call state, kept with the handle across its calls: the future of the
    call in flight, the body read so far, the size bound, and the per-call options last set on
    the handle (so a reused handle is re-configured only where a call differs: ``setopt`` is a
    Python-to-C call each, three per GET before)."""

    __slots__ = ("future", "chunks", "size", "max_bytes", "too_large", "key", "timeout_ms", "max_set")

    def __init__(self, key: tuple) -> None:
        self.future: asyncio.Future | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.max_bytes = 0
        self.too_large = False
        self.key = key
        self.timeout_ms = -1      # CURLOPT_TIMEOUT_MS last set on the handle (-1: never)
        self.max_set = -1         # CURLOPT_MAXFILESIZE_LARGE last set on the handle

    def start(self, future: asyncio.Future, max_bytes: int) -> None:
        """Ready for a new call: ``future`` gets its result, ``max_bytes`` bounds its body."""
        self.future = future
        self.chunks = []
        self.size = 0
        self.max_bytes = max_bytes
        self.too_large = False

    def write(self, data: bytes) -> int | None:
        """libcurl's write callback (decoded bytes): returning 0 aborts with CURLE_WRITE_ERROR."""
        self.size += len(data)
        if self.size > self.max_bytes:
            self.too_large = True
            return 0
        self.chunks.append(data)
        return None


class CurlTransport:
    """A ``pycurl.CurlMulti`` driven by ``loop``. Every method runs on the loop's thread.

    :meth:`get` -> ``(status, body)``; :meth:`close` removes every watch and frees libcurl's
    handles (idempotent). ``too_large`` is the exception class raised for a body over the bound.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, too_large: type[Exception], *,
                 own_epoll: bool = True) -> None:
        self._loop = loop
        self._too_large = too_large
        self._multi = pycurl.CurlMulti()
        # ``own_epoll`` False (or no epoll on this platform): each socket watched on the loop
        self._epoll = _EPOLL() if own_epoll and _EPOLL is not None else None
        if self._epoll is not None:
            loop.add_reader(self._epoll.fileno(), self._on_ready)
        self._multi.setopt(pycurl.M_SOCKETFUNCTION,
                           self._on_socket_epoll if self._epoll is not None else self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._multi.setopt(pycurl.M_MAXCONNECTS, MAX_CONNECTIONS)
        self._watch: dict[int, int] = {}          # fd -> POLL_IN | POLL_OUT bits watched on the loop
        self._timer: asyncio.TimerHandle | None = None   # libcurl's timer, armed at self._timer_when
        self._timer_when = 0.0
        self._soon = False                                # a "0 ms" run is scheduled (call_soon)
        self._active: dict[Any, _Call] = {}        # easy handle -> its call
        self._idle: dict[tuple, list[tuple[Any, _Call]]] = {}   # (url, headers) -> idle (handle, call)
        self._closed = False

    @staticmethod
    def version() -> str:
        """libcurl's version string (``pycurl.version``), for the start log line."""
        return pycurl.version

    # libcurl -> loop ------------------------------------------------------------------------
    def _on_socket(self, what: int, fd: int, multi: Any, socketp: Any) -> None:
        old = self._watch.get(fd, 0)
        new = 0 if what == _POLL_REMOVE else what
        loop = self._loop
        if old == new:
            return
        if old & _POLL_IN and not new & _POLL_IN:
            loop.remove_reader(fd)
        if old & _POLL_OUT and not new & _POLL_OUT:
            loop.remove_writer(fd)
        if new & _POLL_IN and not old & _POLL_IN:
            loop.add_reader(fd, self._action, fd, _CSELECT_IN)
        if new & _POLL_OUT and not old & _POLL_OUT:
            loop.add_writer(fd, self._action, fd, _CSELECT_OUT)
        if new:
            self._watch[fd] = new
        else:
            self._watch.pop(fd, None)

    def _on_socket_epoll(self, what: int, fd: int, multi: Any, socketp: Any) -> None:
        """libcurl's socket request on the transport's epoll: watch ``fd`` for ``what``, or stop
        (``POLL_REMOVE``; libcurl asks before it closes a socket; a socket closed meanwhile has
        already left the epoll, so its ``unregister`` error is ignored)."""
        if self._closed:              # close() drops the epoll and every watch at once
            return
        old = self._watch.get(fd, 0)
        new = 0 if what == _POLL_REMOVE else what
        if old == new:
            return
        ep = self._epoll
        if not new:
            del self._watch[fd]
            try:
                ep.unregister(fd)
            except OSError:
                pass
            return
        self._watch[fd] = new
        mask = _EPOLL_MASK[new]
        try:
            if old:
                ep.modify(fd, mask)
            else:
                ep.register(fd, mask)
        except FileExistsError:      # a number still registered from before (never seen; kept safe)
            ep.modify(fd, mask)
        except FileNotFoundError:    # a number no longer registered (closed and reused)
            ep.register(fd, mask)

    def _on_ready(self) -> None:
        """The epoll is readable: ``socket_action`` for each ready socket still watched, with the
        directions it is ready for (an error or hang-up: the directions watched), then one pass
        over the finished transfers."""
        if self._closed:
            return
        multi, watch = self._multi, self._watch
        for fd, events in self._epoll.poll(0):
            what = watch.get(fd)
            if what is None:          # removed by an earlier socket_action of this batch
                continue
            action = (_CSELECT_IN if events & _EPOLLIN else 0) | (_CSELECT_OUT if events & _EPOLLOUT else 0)
            if events & _EPOLL_FAIL:
                action |= _FAIL_ACTION[what]
            while multi.socket_action(fd, action)[0] == _E_CALL_MULTI_PERFORM:
                pass
        self._finish_done()

    def _on_timer(self, timeout_ms: int) -> None:
        """libcurl's one timer, each call replacing the last (never call ``socket_action`` from
        here). ``0`` (after every ``add_handle``: "act now") is a ``call_soon`` that leaves the
        armed timer alone, and a request for the time the armed timer already has (libcurl asks
        for it again once the "now" is served) keeps it: a GET used to cancel and re-arm a
        loop timer twice."""
        if timeout_ms == 0:
            if not self._soon:
                self._soon = True
                self._loop.call_soon(self._run_soon)
            return
        timer = self._timer
        if timeout_ms < 0:       # -1: no timeout wanted
            if timer is not None:
                timer.cancel()
                self._timer = None
            return
        when = self._loop.time() + timeout_ms / 1000.0
        if timer is not None:
            if abs(when - self._timer_when) < _SAME_TIMER_S:
                return
            timer.cancel()
        self._timer_when = when
        self._timer = self._loop.call_at(when, self._run_timer)

    def _run_soon(self) -> None:
        self._soon = False
        self._action(_SOCKET_TIMEOUT, 0)

    def _run_timer(self) -> None:
        self._timer = None
        self._action(_SOCKET_TIMEOUT, 0)

    def _action(self, fd: int, event: int) -> None:
        if self._closed:
            return
        multi = self._multi
        while True:
            ret, _running = multi.socket_action(fd, event)
            if ret != _E_CALL_MULTI_PERFORM:
                break
        self._finish_done()

    def _finish_done(self) -> None:
        while True:
            queued, ok, failed = self._multi.info_read()
            for handle in ok:
                self._complete(handle, 0, "")
            for handle, code, message in failed:
                self._complete(handle, code, message)
            if not queued:
                break

    def _complete(self, handle: Any, code: int, message: str) -> None:
        call = self._active.pop(handle, None)
        self._multi.remove_handle(handle)
        if call is None:
            handle.close()
            return
        if call.future.done():          # cancelled meanwhile
            handle.close()
            return
        if code == 0:
            call.future.set_result((handle.getinfo(pycurl.RESPONSE_CODE), b"".join(call.chunks)))
        elif call.too_large or code == pycurl.E_FILESIZE_EXCEEDED:
            call.future.set_exception(self._too_large(f"body larger than {call.max_bytes} bytes"))
        elif code == pycurl.E_OPERATION_TIMEDOUT:
            call.future.set_exception(asyncio.TimeoutError())   # empty: describe_error says "timed out after"
        else:
            call.future.set_exception(CurlTransportError(code, message))
        call.chunks = []
        call.future = None
        pool = self._idle.setdefault(call.key, [])
        if code == 0 and len(pool) < _IDLE_PER_KEY:
            pool.append((handle, call))
        else:
            handle.close()

    # the call -------------------------------------------------------------------------------
    def _new_handle(self, url: str, headers: dict[str, str] | None, call: _Call) -> Any:
        c = pycurl.Curl()
        c.setopt(pycurl.WRITEFUNCTION, call.write)   # the handle's call state, reused with it
        c.setopt(pycurl.URL, url)
        c.setopt(pycurl.NOSIGNAL, 1)
        c.setopt(pycurl.FOLLOWLOCATION, 0)
        c.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        c.setopt(pycurl.ACCEPT_ENCODING, "")    # every encoding libcurl decodes; the bound counts decoded bytes
        c.setopt(pycurl.PROXY, "")             # no proxy from http_proxy & co (as aiohttp's default)
        # no DNS cache: libcurl prunes its cache of "host:port" entries on every transfer, a walk
        # over one entry per engine (O(engines) per GET, O(engines^2) a round: 20 % of libcurl's
        # CPU at 1,024 engines, 1,024 GETs 147 -> 113 ms median, same run). The connections are
        # kept alive, so a name is resolved only when a connection to it is (re)opened.
        c.setopt(pycurl.DNS_CACHE_TIMEOUT, 0)
        if certifi is not None and url.startswith("https://"):
            c.setopt(pycurl.CAINFO, certifi.where())
        if headers:
            c.setopt(pycurl.HTTPHEADER, [f"{k}: {v}" for k, v in headers.items()])
        return c

    async def get(self, url: str, *, deadline_s: float, max_bytes: int,
                  headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """``GET url`` -> ``(status, body)`` within ``deadline_s`` seconds in all.

        Raises:
            asyncio.TimeoutError: past the deadline (a body still arriving included).
            too_large (the class given at construction): the body or its ``Content-Length`` is
                over ``max_bytes`` (decoded bytes).
            CurlTransportError: refused, reset, a malformed answer (an ``OSError``).
            RuntimeError: the transport is closed.
        """
        if self._closed:
            raise RuntimeError("the curl transport is closed")
        key = (url, tuple(headers.items()) if headers else ())
        pool = self._idle.get(key)
        if pool:
            handle, call = pool.pop()
        else:
            call = _Call(key)
            handle = self._new_handle(url, headers, call)
        future = self._loop.create_future()
        call.start(future, max_bytes)
        timeout_ms = max(1, int(deadline_s * 1000))
        if call.timeout_ms != timeout_ms:
            handle.setopt(pycurl.TIMEOUT_MS, timeout_ms)
            call.timeout_ms = timeout_ms
        if call.max_set != max_bytes:
            handle.setopt(pycurl.MAXFILESIZE_LARGE, max_bytes)
            call.max_set = max_bytes
        self._active[handle] = call
        self._multi.add_handle(handle)   # libcurl asks for a 0 ms timer: the transfer starts on the loop
        try:
            return await future
        except asyncio.CancelledError:   # a caller's own timeout: stop the transfer, drop its connection
            if self._active.pop(handle, None) is not None:
                self._multi.remove_handle(handle)
                handle.close()
            raise

    def close(self) -> None:
        """Fail the calls in flight, stop watching libcurl's sockets, free the handles."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for handle, call in list(self._active.items()):
            self._multi.remove_handle(handle)
            handle.close()
            if call.future is not None and not call.future.done():
                call.future.set_exception(RuntimeError("the curl transport is closed"))
        self._active.clear()
        if self._epoll is not None:
            self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()
        else:
            for fd, bits in list(self._watch.items()):
                if bits & pycurl.POLL_IN:
                    self._loop.remove_reader(fd)
                if bits & pycurl.POLL_OUT:
                    self._loop.remove_writer(fd)
        self._watch.clear()
        for pool in self._idle.values():
            for handle, _call in pool:
                handle.close()
        self._idle.clear()
        self._multi.close()
