"""The router's production upstream client (aiohttp, router/upstream.py) against real loopback
servers (aiohttp.web on port 0): chunk-by-chunk passthrough, a close before the end reaching
the server, keep-alive reuse, and the two error kinds the forwarder retries on."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import ClientError, web

from inferctl.router.app import create_app
from inferctl.router.config import EngineSpec, RouterConfig
from inferctl.router.upstream import AiohttpUpstream, UpstreamConnectError, UpstreamError

pytestmark = pytest.mark.e2e


def _upstream(read_timeout: float = 10.0) -> AiohttpUpstream:
    return AiohttpUpstream(connections=8, connect_timeout=2.0, read_timeout=read_timeout)


async def _serve(routes: list[web.RouteDef]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def test_a_stream_is_relayed_chunk_by_chunk_and_a_close_reaches_the_server():
    async def main():
        release = asyncio.Event()
        gone = asyncio.Event()
        seen: dict = {}

        async def stream(request: web.Request) -> web.StreamResponse:
            seen["body"] = await request.read()
            seen["headers"] = request.headers.copy()   # case-insensitive
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: 1\n\n")
            await release.wait()          # the second chunk only after the client saw the first
            try:
                for i in range(2, 1000):
                    await resp.write(f"data: {i}\n\n".encode())
                    await asyncio.sleep(0.01)
            except (OSError, ClientError, asyncio.CancelledError):   # the client closed the connection
                gone.set()
            return resp

        runner, url = await _serve([web.post("/s", stream)])
        up = _upstream()
        try:
            resp = await up.send("POST", url + "/s", content=b'{"a": 1}',
                                 headers={"content-type": "application/json", "x-request-id": "rid-7"})
            assert resp.status == 200 and resp.headers["content-type"] == "text/event-stream"
            chunks = resp.chunks()
            assert await anext(chunks) == b"data: 1\n\n"      # arrived before the server sent more
            release.set()
            assert (await anext(chunks)).startswith(b"data: 2\n\n")
            await resp.close()                                  # the client went away mid-stream
            await asyncio.wait_for(gone.wait(), 5)
            assert seen["body"] == b'{"a": 1}' and seen["headers"]["x-request-id"] == "rid-7"
        finally:
            await up.aclose()
            await runner.cleanup()

    asyncio.run(main())


def test_a_fully_read_answer_keeps_its_connection_for_the_next_request():
    async def main():
        peers: list = []

        async def ok(request: web.Request) -> web.Response:
            peers.append(request.transport.get_extra_info("peername"))
            return web.json_response({"n": len(peers)})

        runner, url = await _serve([web.post("/ok", ok)])
        up = _upstream()
        try:
            for n in (1, 2, 3):
                resp = await up.send("POST", url + "/ok", content=b"{}", headers={"content-type": "application/json"})
                body = b"".join([c async for c in resp.chunks()])
                await resp.close()
                assert resp.status == 200 and body == f'{{"n": {n}}}'.encode()
            assert len(peers) == 3 and len(set(peers)) == 1      # one keep-alive connection
        finally:
            await up.aclose()
            await runner.cleanup()

    asyncio.run(main())


def test_a_refused_port_is_a_connect_error_and_a_reset_before_the_body_an_upstream_error():
    async def main():
        async def reset(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"content-type": "application/json", "content-length": "100"})
            await resp.prepare(request)
            request.transport.abort()      # headers sent, then the connection is cut: no body byte
            return resp

        with socket.socket() as s:          # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]
        runner, url = await _serve([web.post("/reset", reset)])
        up = _upstream()
        try:
            with pytest.raises(UpstreamConnectError):
                await up.send("POST", f"http://127.0.0.1:{dead}/x", content=b"{}", headers={})
            resp = await up.send("POST", url + "/reset", content=b"{}", headers={})
            with pytest.raises(UpstreamError) as info:
                await anext(resp.chunks())
            assert not isinstance(info.value, UpstreamConnectError)
            await resp.close()
        finally:
            await up.aclose()
            await runner.cleanup()

    asyncio.run(main())


def test_the_router_forwards_with_aiohttp_unless_given_an_httpx_client():
    app = create_app(RouterConfig(engines=(EngineSpec("a", "http://127.0.0.1:9"),), upstream_connections=7))
    up = app.state.router.upstream
    assert isinstance(up, AiohttpUpstream) and up.connections == 7
    assert app.state.router.forwarder.upstream is up
