"""libcurl's easy handles across calls (controller/scrape/curl.py): a reused handle keeps its call
state and is re-configured only where a call differs, the bounds of each call still hold, and no
handle keeps a DNS cache (libcurl pruned a cache of one entry per engine on every transfer)."""

from __future__ import annotations

import asyncio

import pycurl
import pytest
from aiohttp import web

from inferctl.controller.scrape.aio import AsyncPoller, BodyTooLarge
from tests.aiohttp_helpers import ThreadedAiohttpServer

BODY = b"x" * 4096


class Server(ThreadedAiohttpServer):
    """One aiohttp server in its own thread: ``/body`` answers :data:`BODY`, ``/slow`` after 2 s,
    ``/peer`` the client's port (one port per keep-alive connection)."""

    def make_app(self) -> web.Application:
        async def body(request: web.Request) -> web.Response:
            return web.Response(body=BODY)

        async def slow(request: web.Request) -> web.Response:
            await asyncio.sleep(2.0)
            return web.Response(body=BODY)

        async def peer(request: web.Request) -> web.Response:
            return web.Response(text=str(request.transport.get_extra_info("peername")[1]))

        app = web.Application()
        app.router.add_get("/body", body)
        app.router.add_get("/slow", slow)
        app.router.add_get("/peer", peer)
        return app

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


class RecordingCurl(pycurl.Curl):
    """A ``pycurl.Curl`` that records every option set on it."""

    made: list["RecordingCurl"] = []

    def __init__(self) -> None:
        super().__init__()
        self.options: list[tuple[int, object]] = []
        RecordingCurl.made.append(self)

    def setopt(self, option: int, value: object) -> None:
        self.options.append((option, value))
        super().setopt(option, value)


def get(poller: AsyncPoller, url: str, **kw):
    return poller.submit(poller.get(url, **kw)).result(10)


def test_a_reused_handle_is_reconfigured_only_where_the_call_differs(server, monkeypatch):
    monkeypatch.setattr(pycurl, "Curl", RecordingCurl)
    RecordingCurl.made = []
    poller = AsyncPoller("t", "curl")
    try:
        url = server.url("/body")
        assert get(poller, url, deadline_s=2.0, max_bytes=1 << 20) == (200, BODY)
        assert len(RecordingCurl.made) == 1
        handle = RecordingCurl.made[0]
        assert (pycurl.DNS_CACHE_TIMEOUT, 0) in handle.options          # no DNS cache to prune
        handle.options.clear()
        for _ in range(3):                                               # same deadline and bound
            assert get(poller, url, deadline_s=2.0, max_bytes=1 << 20) == (200, BODY)
        assert RecordingCurl.made == [handle] and handle.options == []   # no setopt at all
        with pytest.raises(BodyTooLarge):                                # a smaller bound on that handle
            get(poller, url, deadline_s=2.0, max_bytes=1000)
        assert handle.options == [(pycurl.MAXFILESIZE_LARGE, 1000)]
        handle.options.clear()
        assert get(poller, url, deadline_s=1.5, max_bytes=1 << 20) == (200, BODY)   # a handle made anew
        assert len(RecordingCurl.made) == 2                              # (the failed one was closed)
    finally:
        poller.close()


def test_bounds_of_each_call_hold_on_reused_handles(server):
    poller = AsyncPoller("t", "curl")
    try:
        peer = get(poller, server.url("/peer"), deadline_s=2.0, max_bytes=1 << 20)
        for deadline in (1.0, 2.0, 3.0):           # the same keep-alive connection, any deadline
            assert get(poller, server.url("/peer"), deadline_s=deadline, max_bytes=1 << 20) == peer
        with pytest.raises(asyncio.TimeoutError):   # a short deadline after longer ones on one handle
            get(poller, server.url("/slow"), deadline_s=0.3, max_bytes=1 << 20)
        assert get(poller, server.url("/body"), deadline_s=2.0, max_bytes=len(BODY)) == (200, BODY)
        with pytest.raises(BodyTooLarge):           # a bound one byte short after an exact one
            get(poller, server.url("/body"), deadline_s=2.0, max_bytes=len(BODY) - 1)
        assert get(poller, server.url("/body"), deadline_s=2.0, max_bytes=len(BODY)) == (200, BODY)
    finally:
        poller.close()
