"""ClientWatch (router/asgi.py) under the REAL pinned uvicorn server: it must take its cheap path
(one future on uvicorn's per-request ``message_event``, no task per request) and see a client that
leaves. The path rests on uvicorn internals (``RequestResponseCycle.message_event`` and
``disconnected``, ``asyncio.Event._waiters``), guarded by type checks with a task as the fallback;
an upgrade that changes them must fail here instead of silently costing the fallback's ~25 µs a
request (docs/router.md, "Client disconnects")."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from inferctl.router.asgi import ClientWatch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_client_watch_uses_uvicorns_event_and_sees_the_client_leave(http):
    seen: dict = {}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await receive()                                  # the (empty) body
        watch = ClientWatch(receive)
        seen["event_path"] = watch._event is not None and watch._watcher is None
        if scope["path"] == "/leave":
            try:
                await asyncio.sleep(10)                  # "waiting for the replica"
            except asyncio.CancelledError:
                seen["gone"] = watch.gone
                asyncio.current_task().uncancel()
                watch.stop()
                return
        watch.stop()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=http, log_level="error",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "ok"
        assert seen["event_path"] is True
        with socket.create_connection(("127.0.0.1", port)) as s:     # a client that leaves
            s.sendall(b"GET /leave HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.3)
        deadline = time.monotonic() + 5
        while "gone" not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen.get("gone") is True
    finally:
        server.should_exit = True
        thread.join(10)
