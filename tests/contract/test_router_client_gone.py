"""The router over a REAL engine app (stories260K, httpx.ASGITransport, in process): a client that
leaves a non-streamed request while the replica generates aborts the generation there (issue 9:
"client disconnects propagated to the replica"), and a non-streamed answer that breaks after some
of its bytes arrived is retried under its own reason, ``partial_body`` (docs/router.md, "Retries").
"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from inferctl.router.app import create_app
from inferctl.router.config import EngineSpec, RouterConfig
from tests.server_helpers import STORIES, make_app, run

PROMPT = "Once upon a time"


def build_router(transports: dict, **config):
    specs = tuple(EngineSpec(name, f"http://{name}.test") for name in transports)
    client = httpx.AsyncClient(mounts={f"http://{n}.test": t for n, t in transports.items()}, timeout=60.0)
    app = create_app(RouterConfig(engines=specs, **config), client=client)
    return app, app.state.router


async def stats(engine_app) -> dict:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=engine_app), base_url="http://e.test") as c:
        return (await c.get("/stats")).json()


async def until(engine_app, ok, seconds: float = 30.0) -> dict:
    """The engine's ``/stats`` once ``ok(doc)`` holds (polled), or the last one after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        doc = await stats(engine_app)
        if ok(doc) or loop.time() > deadline:
            return doc
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "stream-before-its-first-chunk"])
def test_a_client_that_leaves_while_the_router_waits_aborts_the_request_on_the_replica(engine, stream):
    """Before the ClientWatch the router waited for the whole answer (480 tokens generated for
    nobody): the engine finished the request with ``length``, nothing counted the disconnect.
    (Over httpx's ASGITransport the router gets a stream's head and first chunk only when the
    engine app returns, so a stream is still waited for here: the case of a stream whose first
    token has not come yet.)"""
    engine_app = make_app({STORIES: engine})
    body = json.dumps({"model": STORIES, "prompt": PROMPT, "max_tokens": 480, "ignore_eos": True,
                       "temperature": 0, "stream": stream}).encode()
    rid = f"gone-{'stream' if stream else 'whole'}-1"
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"", "root_path": "",
             "http_version": "1.1", "scheme": "http",
             "headers": [(b"host", b"router.test"), (b"content-type", b"application/json"),
                         (b"x-request-id", rid.encode())]}

    async def go():
        app, st = build_router({"a": httpx.ASGITransport(app=engine_app)})
        await st.prober.round()
        before = (await stats(engine_app))["requests"]
        gone, sent, first = asyncio.Event(), [], [True]

        async def receive():
            if first[0]:
                first[0] = False
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()                       # the server's receive: nothing until the client leaves
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        call = asyncio.ensure_future(app(scope, receive, send))
        running = await until(engine_app, lambda d: d["scheduler"]["running"] == 1)
        gone.set()                                  # the client goes away mid-generation
        await asyncio.wait_for(call, 30)
        after = await until(engine_app, lambda d: d["scheduler"]["running"] == 0)
        return st, before, running, after, sent

    st, before, running, after, sent = run(go())
    assert running["scheduler"]["running"] == 1
    assert after["scheduler"]["running"] == 0
    assert after["requests"]["aborted_total"] == before["aborted_total"] + 1
    [mine] = [q for q in after["requests"]["recent"] if q["x_request_id"] == rid]
    assert mine["finish_reason"] == "abort" and mine["completion_tokens"] < 480
    # the router counted it, and answered nobody (a server drops what is sent after a disconnect)
    assert st.registry.get_sample_value("inferctl_router_client_disconnects_total", {"replica": "a"}) == 1
    assert st.registry.get_sample_value("inferctl_router_requests_total", {"replica": "a", "status": "499"}) == 1
    assert st.replicas["a"].outstanding == 0
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [499]


class _BreaksAfter(httpx.AsyncByteStream):
    """Part of a JSON answer, then a reset (the replica died while writing it)."""

    async def __aiter__(self):
        yield b'{"id": "cmpl-partial", "object": "text_completion", "choices": [{"text": "Once'
        raise httpx.ReadError("connection reset by peer")


class BreaksMidAnswer(httpx.AsyncBaseTransport):
    """A replica whose non-streamed 200 answer breaks after its first bytes."""

    def __init__(self) -> None:
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += request.method == "POST"
        return httpx.Response(200, headers={"content-type": "application/json", "content-length": "4096"},
                              stream=_BreaksAfter())


def test_a_non_streamed_answer_broken_after_some_bytes_is_retried_as_partial_body(engine, caplog):
    """The client got none of the broken answer, so another replica answers it whole; the retry is
    counted and logged as what it is (``partial_body``: the first replica's generation ran), not as
    a failure before the first byte (``upstream_error``, as before)."""
    engine_app = make_app({STORIES: engine})

    async def go():
        broken = BreaksMidAnswer()
        app, st = build_router({"f": broken, "b": httpx.ASGITransport(app=engine_app)}, max_retries=1)
        await st.prober.round()
        st.replicas["f"].ready, st.replicas["f"].reason, st.replicas["f"].models = True, None, None
        st.replicas["b"].outstanding = 3           # the least-loaded choice is f
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router.test",
                                     timeout=60) as c:
            r = await c.post("/v1/completions", json={"model": STORIES, "prompt": PROMPT, "max_tokens": 8,
                                                      "temperature": 0})
        st.replicas["b"].outstanding -= 3
        return r, st, broken

    with caplog.at_level(logging.WARNING, logger="inferctl.router.access"):
        r, st, broken = run(go())
    assert r.status_code == 200 and r.headers["x-inferctl-replica"] == "b" and broken.calls == 1
    assert r.json()["usage"]["completion_tokens"] == 8
    assert st.registry.get_sample_value("inferctl_router_retries_total",
                                        {"replica": "f", "reason": "partial_body"}) == 1
    assert st.registry.get_sample_value("inferctl_router_retries_total",
                                        {"replica": "f", "reason": "upstream_error"}) is None
    [line] = [rec.getMessage() for rec in caplog.records if "attempt on f" in rec.getMessage()]
    assert "broke after some of its bytes arrived (none sent to the client)" in line
    assert "before the first byte" not in line and "retrying on another replica" in line
    assert st.replicas["f"].outstanding == 0 and st.replicas["b"].outstanding == 0
    # one request, one observation: the broken attempt is not the answer (before: f's time to first
    # byte was observed as a success and the overhead histogram counted the request twice)
    assert st.registry.get_sample_value("inferctl_router_upstream_latency_seconds_count", {"replica": "f"}) is None
    assert st.registry.get_sample_value("inferctl_router_upstream_latency_seconds_count", {"replica": "b"}) == 1
    assert st.registry.get_sample_value("inferctl_router_overhead_seconds_count", {}) == 1
