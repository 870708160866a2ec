"""The streaming fast path (``PushedStream``) against the general one, over the real engine.

A one-choice streamed completion (or chat completion) without logprobs or echo is written from the engine's output
callbacks; every byte must be what the general path (``stream_guard`` under Starlette's
``StreamingResponse``) sends for the same greedy request, apart from the id and timestamp.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import pytest

from inferctl.engine.entrypoints import chat, completions
from inferctl.engine.entrypoints.push_stream import _Writer
from tests.server_helpers import (  # noqa: F401 - stories_*_fixture are the engine and app fixtures
    REFERENCE,
    STORIES,
    client,
    http_post,
    make_app,
    run,
    sse_events,
    stories_app_fixture,
    stories_engine,
    stories_engine_fixture,
)

PROMPT = "Once upon a time"


def _normalised(text: str) -> str:
    text = re.sub(r'"id":"(chat)?cmpl-[0-9a-f]+"', '"id":"X"', text)
    return re.sub(r'"created":\d+', '"created":0', text)


CASES = [
    {"max_tokens": 40, "ignore_eos": True},
    {"max_tokens": 40, "ignore_eos": True, "stream_options": {"include_usage": True}},
    {"max_tokens": 60, "stop": [" the"], "stream_options": {"include_usage": True}},   # held-back text
    {"max_tokens": 1},
    {"max_tokens": 200},   # past the reference text
]


@pytest.mark.parametrize("extra", CASES)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_pushed_stream_sends_the_general_paths_bytes(app, monkeypatch, path, extra):
    module = completions if path == "/v1/completions" else chat
    body = {"temperature": 0, "stream": True, **extra}
    if module is chat:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    taken = []
    real = module._pushed
    monkeypatch.setattr(module, "_pushed", lambda *a: taken.append(1) or real(*a))
    pushed = http_post(app, path, body)
    assert taken == [1]   # the fast path served it
    with monkeypatch.context() as m:
        m.setattr(module, "pushable", lambda req, jobs: False)
        general = http_post(app, path, body)
    assert taken == [1]
    assert pushed.status_code == general.status_code == 200
    assert pushed.headers["content-type"] == general.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert pushed.headers["cache-control"] == "no-cache" and "content-length" not in pushed.headers
    assert _normalised(pushed.text) == _normalised(general.text)
    events = sse_events(pushed.text)
    assert events[-1] == "[DONE]"
    if module is chat:
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
        assert len(text) > 0 or extra["max_tokens"] == 1   # the chat prompt: no reference text
    else:
        text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
        assert len(text) > 0 and (REFERENCE.startswith(text) or text.startswith(REFERENCE))
    finals = [e for e in events[:-1] if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] in ("length", "stop")
    if "stream_options" in extra:
        assert events[-2]["usage"]["completion_tokens"] >= 1 and events[-2]["choices"] == []


def test_fast_path_is_taken_only_for_one_plain_choice():
    class Req:
        logprobs = None
        echo = False
    one, two = [object()], [object(), object()]
    assert completions.pushable(Req(), one) is True
    assert completions.pushable(Req(), two) is False
    Req.logprobs = 0
    assert completions.pushable(Req(), one) is False
    Req.logprobs, Req.echo = None, True
    assert completions.pushable(Req(), one) is False

    class ChatReq:
        logprobs = False
    assert chat.pushable(ChatReq(), one) is True and chat.pushable(ChatReq(), two) is False
    ChatReq.logprobs = True
    assert chat.pushable(ChatReq(), one) is False


def test_writer_keeps_chunks_in_order_when_send_blocks():
    """uvicorn's send suspends on a flow-control future when the socket buffer is full: the
    chunks written meanwhile wait behind it, in order, and ``flushed`` waits for all of them."""
    async def go():
        loop = asyncio.get_running_loop()
        wire: list[bytes] = []
        gates: list[asyncio.Future] = []

        async def send(message):
            if len(wire) % 3 == 1:            # every third write finds the buffer full
                gate = loop.create_future()
                gates.append(gate)
                await gate
            if len(wire) % 5 == 4:
                await asyncio.sleep(0)        # a bare yield
            wire.append(message["body"])

        writer = _Writer(send, loop)
        for k in range(20):
            writer.write(b"%d" % k)
        assert len(wire) == 1 and len(gates) == 1   # blocked on the second chunk, 18 waiting

        async def open_gates():
            while len(wire) < 20:
                await asyncio.sleep(0)
                for gate in gates:
                    if not gate.done():
                        gate.set_result(None)
        opener = asyncio.ensure_future(open_gates())
        await asyncio.wait_for(writer.flushed(), 5)
        await opener
        return wire, len(gates)

    wire, blocked = run(go())
    assert wire == [b"%d" % k for k in range(20)]
    assert blocked >= 6


def test_writer_stops_writing_when_send_fails():
    async def go():
        loop = asyncio.get_running_loop()
        wire: list[bytes] = []

        async def send(message):
            if len(wire) == 2:
                raise OSError("connection reset")
            wire.append(message["body"])

        writer = _Writer(send, loop)
        for k in range(5):
            writer.write(b"%d" % k)
        await asyncio.wait_for(writer.flushed(), 5)
        return wire, writer.closed

    wire, closed = run(go())
    assert wire == [b"0", b"1"] and closed is True


def _asgi_scope(body: bytes) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
            "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1234), "server": ("127.0.0.1", 80), "state": {}}


def test_a_send_that_raises_ends_the_stream_and_aborts_the_request(app, engine):
    """An ASGI server may report a lost connection by raising from ``send`` and never sending
    ``http.disconnect``: the stream must end (the error goes back to the server, as on the general
    path) and the request must be aborted, not generated to its end for nobody (found by a
    breaker: the fast path waited for a disconnect that never came)."""
    body = json.dumps({"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True, "stream": True,
                       "temperature": 0}).encode()
    served = app.state.server.models[STORIES]
    client_gone = {"reason": "client_disconnect"}

    async def go():
        sent = {"bodies": 0}
        first = [True]

        async def receive():
            if first[0]:
                first[0] = False
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()   # never a disconnect

        async def send(message):
            if message["type"] == "http.response.body":
                sent["bodies"] += 1
                if sent["bodies"] == 3:
                    raise OSError("connection reset by peer")
        before_abort = engine.stats()["requests"]["by_finish_reason"]["abort"]
        before_gone = _metric(served, client_gone)
        with pytest.raises(OSError, match="connection reset"):
            await asyncio.wait_for(app(_asgi_scope(body), receive, send), 10)
        return before_abort, before_gone

    before_abort, before_gone = run(go())
    for _ in range(500):
        stats = engine.stats()
        if stats["scheduler"]["running"] == 0 and stats["requests"]["by_finish_reason"]["abort"] == before_abort + 1:
            break
        time.sleep(0.01)
    assert stats["requests"]["by_finish_reason"]["abort"] == before_abort + 1
    assert stats["kv_cache"]["blocks_used"] == 0
    assert _metric(served, client_gone) == before_gone + 1


def _metric(served, labels: dict) -> float:
    return served.registry.get_sample_value("inferctl_engine_request_aborts_total",
                                            {"model": STORIES, **labels}) or 0.0


def test_a_stream_that_fails_is_logged_with_its_error(stories_dir, caplog):
    """The request's log line of a stream whose engine output fails (an OOM with no retries left)
    names finish reason ``error`` and its tokens on the fast path as on the general one."""
    eng = stories_engine(stories_dir, max_oom_retries=0)
    app_ = make_app({STORIES: eng})
    body = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True, "temperature": 0}

    async def one():
        async with client(app_) as c:
            task = asyncio.ensure_future(c.post("/v1/completions", json=body))
            steps0 = eng.stats()["scheduler"]["steps_total"]
            while eng.stats()["scheduler"]["steps_total"] < steps0 + 10:   # the stream is under way
                await asyncio.sleep(0.001)
            eng.inject_fault("oom", 1)
            return await task

    try:
        with caplog.at_level(logging.INFO, logger="inferctl.engine.requests"):
            r = run(one())
    finally:
        eng.shutdown()
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "out_of_memory"
    lines = [rec for rec in caplog.records if getattr(rec, "endpoint", None) == "/v1/completions"]
    assert len(lines) == 1
    assert lines[0].finish_reasons == ["error"] and lines[0].completion_tokens >= 10
