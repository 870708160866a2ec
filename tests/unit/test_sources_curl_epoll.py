"""libcurl's sockets on the transport's own epoll (controller/scrape/curl.py ``_on_socket_epoll``,
``_on_ready``): a watch request registers, modifies or unregisters the socket there; a ready socket
reaches ``socket_action`` with the directions it is ready for (an error or hang-up: the directions
watched); a socket removed earlier in the same batch gets nothing; a closed socket's removal and a
reused descriptor number are handled; GETs over the epoll give what the loop's own watches give
(keep-alive, errors, deadlines, size bound), and nothing is left watched afterwards."""

from __future__ import annotations

import asyncio
import select
import socket

import pycurl
import pytest
from aiohttp import web

from inferctl.controller.scrape.aio import BodyTooLarge
from inferctl.controller.scrape.curl import CurlTransport, CurlTransportError
from tests.aiohttp_helpers import ThreadedAiohttpServer

pytestmark = pytest.mark.skipif(not hasattr(select, "epoll"), reason="select.epoll is Linux only")


class FakeMulti:
    """Stands in for the ``CurlMulti``: records ``socket_action`` calls; an optional hook runs in
    the call (as libcurl calls the socket callback from inside ``socket_action``)."""

    def __init__(self) -> None:
        self.actions: list[tuple[int, int]] = []
        self.hook = None

    def socket_action(self, fd: int, action: int) -> tuple[int, int]:
        self.actions.append((fd, action))
        if self.hook is not None:
            self.hook(fd, action)
        return 0, 0

    def info_read(self) -> tuple[int, list, list]:
        return 0, [], []


def _run(loop: asyncio.AbstractEventLoop, seconds: float = 0.05) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


@pytest.fixture
def rig():
    """A transport on a fresh loop with its multi replaced by :class:`FakeMulti`, and a socket pair."""
    loop = asyncio.new_event_loop()
    t = CurlTransport(loop, BodyTooLarge)
    real, fake = t._multi, FakeMulti()
    t._multi = fake
    a, b = socket.socketpair()
    a.setblocking(False)
    yield loop, t, fake, a, b
    t._multi = real
    t.close()
    a.close()
    b.close()
    loop.close()


def test_a_ready_socket_reaches_socket_action_and_a_removed_one_does_not(rig):
    loop, t, fake, a, b = rig
    assert t._epoll is not None
    t._on_socket_epoll(pycurl.POLL_IN, a.fileno(), None, None)
    _run(loop)
    assert fake.actions == []                                 # nothing to read yet
    b.send(b"x")
    _run(loop)
    assert (a.fileno(), pycurl.CSELECT_IN) in fake.actions
    a.recv(1)
    t._on_socket_epoll(pycurl.POLL_REMOVE, a.fileno(), None, None)
    assert t._watch == {}
    fake.actions.clear()
    b.send(b"y")
    _run(loop)
    assert fake.actions == []                                 # unregistered: no more events


def test_a_watch_change_modifies_the_registration(rig):
    loop, t, fake, a, b = rig
    t._on_socket_epoll(pycurl.POLL_IN, a.fileno(), None, None)
    t._on_socket_epoll(pycurl.POLL_IN, a.fileno(), None, None)         # the same: nothing to do
    t._on_socket_epoll(pycurl.POLL_OUT, a.fileno(), None, None)        # writable at once
    _run(loop)
    assert t._watch == {a.fileno(): pycurl.POLL_OUT}
    assert fake.actions and set(fake.actions) == {(a.fileno(), pycurl.CSELECT_OUT)}
    fake.actions.clear()
    t._on_socket_epoll(pycurl.POLL_INOUT, a.fileno(), None, None)
    b.send(b"x")
    _run(loop, 0.02)
    assert (a.fileno(), pycurl.CSELECT_IN | pycurl.CSELECT_OUT) in fake.actions


def test_a_hang_up_is_reported_in_the_directions_watched(rig):
    loop, t, fake, a, b = rig
    t._on_socket_epoll(pycurl.POLL_IN, a.fileno(), None, None)
    b.close()
    _run(loop, 0.02)
    assert fake.actions and all(act == pycurl.CSELECT_IN for fd, act in fake.actions)
    fake.actions.clear()
    t._on_socket_epoll(pycurl.POLL_OUT, a.fileno(), None, None)       # a hang-up while writing
    _run(loop, 0.02)
    assert fake.actions and all(act & pycurl.CSELECT_OUT for fd, act in fake.actions)


def test_a_socket_removed_earlier_in_the_batch_gets_no_action(rig):
    loop, t, fake, a, b = rig
    c, d = socket.socketpair()
    try:
        t._on_socket_epoll(pycurl.POLL_IN, a.fileno(), None, None)
        t._on_socket_epoll(pycurl.POLL_IN, c.fileno(), None, None)

        c.setblocking(False)
        socks = {a.fileno(): a, c.fileno(): c}

        def remove_the_other(fd: int, action: int) -> None:   # libcurl reads, and drops the other socket
            socks[fd].recv(16)
            other = c.fileno() if fd == a.fileno() else a.fileno()
            t._on_socket_epoll(pycurl.POLL_REMOVE, other, None, None)
        fake.hook = remove_the_other
        b.send(b"x")
        d.send(b"x")
        _run(loop)
        assert len(fake.actions) == 1                         # both were ready; the second was removed
        assert len(t._watch) == 1
    finally:
        c.close()
        d.close()


def test_a_closed_socket_and_a_reused_number(rig):
    loop, t, fake, a, b = rig
    c, d = socket.socketpair()
    fd = c.fileno()
    t._on_socket_epoll(pycurl.POLL_IN, fd, None, None)
    c.close()                                                 # closed: the epoll dropped it
    t._on_socket_epoll(pycurl.POLL_REMOVE, fd, None, None)    # its unregister fails: ignored
    assert t._watch == {}
    d.close()
    e, f = socket.socketpair()                                # likely the same number again
    try:
        t._watch[e.fileno()] = pycurl.POLL_OUT               # a stale watch under that number
        t._on_socket_epoll(pycurl.POLL_IN, e.fileno(), None, None)   # modify fails: registered
        f.send(b"x")
        _run(loop)
        assert (e.fileno(), pycurl.CSELECT_IN) in fake.actions
    finally:
        e.close()
        f.close()


def test_close_drops_the_epoll_and_later_requests_are_ignored():
    loop = asyncio.new_event_loop()
    try:
        t = CurlTransport(loop, BodyTooLarge)
        a, b = socket.socketpair()
        t._on_socket_epoll(pycurl.POLL_IN, a.fileno(), None, None)
        t.close()
        assert t._epoll.closed and t._watch == {}
        t._on_socket_epoll(pycurl.POLL_REMOVE, a.fileno(), None, None)   # no error
        a.close()
        b.close()
    finally:
        loop.close()


class Server(ThreadedAiohttpServer):
    """``/body`` answers 4 KB, ``/big`` 64 KB, ``/slow`` after 2 s, ``/peer`` the client's port."""

    def make_app(self) -> web.Application:
        async def body(request: web.Request) -> web.Response:
            return web.Response(body=b"x" * 4096)

        async def big(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()          # chunked: no Content-Length, the write callback bounds it
            await resp.prepare(request)
            await resp.write(b"y" * 65536)
            await resp.write_eof()
            return resp

        async def slow(request: web.Request) -> web.Response:
            await asyncio.sleep(2.0)
            return web.Response(body=b"late")

        async def peer(request: web.Request) -> web.Response:
            return web.Response(text=str(request.transport.get_extra_info("peername")[1]))

        app = web.Application()
        for path, handler in (("/body", body), ("/big", big), ("/slow", slow), ("/peer", peer)):
            app.router.add_get(path, handler)
        return app


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def _outcomes(server: Server, own_epoll: bool) -> list:
    """The same script of GETs through a transport with or without its own epoll."""
    loop = asyncio.new_event_loop()
    t = CurlTransport(loop, BodyTooLarge, own_epoll=own_epoll)
    base = f"http://127.0.0.1:{server.port}"

    async def one(path: str, deadline_s: float = 2.0, max_bytes: int = 1 << 20):
        try:
            return await t.get(base + path, deadline_s=deadline_s, max_bytes=max_bytes)
        except Exception as exc:                              # the failure is part of the outcome
            return type(exc).__name__

    async def script() -> list:
        out = [await one("/body") for _ in range(3)]
        out.append(len({await one("/peer") for _ in range(4)}))          # one keep-alive connection
        out += await asyncio.gather(*[one("/body") for _ in range(20)])
        out.append(await one("/big", max_bytes=1000))
        out.append(await one("/big"))
        out.append(await one("/slow", deadline_s=0.2))
        out.append(await one("/body"))
        refused = socket.socket()
        refused.bind(("127.0.0.1", 0))
        port = refused.getsockname()[1]
        refused.close()
        try:
            await t.get(f"http://127.0.0.1:{port}/", deadline_s=1.0, max_bytes=100)
        except CurlTransportError as exc:
            out.append(exc.code)
        out.append(dict(t._watch))
        return out

    try:
        return loop.run_until_complete(script())
    finally:
        t.close()
        loop.close()


def test_gets_over_the_epoll_are_the_gets_over_loop_watches(server):
    mine, loops = _outcomes(server, True), _outcomes(server, False)
    assert mine == loops
    assert mine[0] == (200, b"x" * 4096) and mine[3] == 1
    assert mine[-6:-2] == ["BodyTooLarge", (200, b"y" * 65536), "TimeoutError", (200, b"x" * 4096)]
    assert mine[-2] == pycurl.E_COULDNT_CONNECT and mine[-1] == {}
