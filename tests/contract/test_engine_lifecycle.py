"""Engine lifecycle, in-process over real engines: ``/ready`` (starting, draining, stopping, the
light model's drain), the in-flight count, and the SIGTERM drain (streams finish within the
grace period; past it they end with an error event, nothing is dropped)."""

from __future__ import annotations

import asyncio
import signal

import pytest
import uvicorn

from inferctl.engine.async_engine import AsyncLLMEngine
from inferctl.engine.engine import LLMEngine
from inferctl.engine.entrypoints.lifecycle import GracefulServer, drain
from inferctl.engine.loader import load_model
from inferctl.engine.config import EngineConfig
from tests.server_helpers import (STORIES, auth, client, demo_engine, engines_running, http_get, http_post,
                                  make_app, run, sse_events, stories_engine, wait_for)

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def pair(stories_dir):
    """stories260K (context 2048, past its trained 512, for long generations) as the main model, the demo
    model as "light"."""
    main = stories_engine(stories_dir, max_model_len=2048, allow_long_max_model_len=True)
    light = demo_engine("light")
    with engines_running(main, light):
        yield main, light


@pytest.fixture()
def app(pair):
    main, light = pair
    return make_app({STORIES: main, "light": light})


def _drain(app, draining: bool, model: str | None = None) -> None:
    body = {"draining": draining} if model is None else {"draining": draining, "model": model}
    assert http_post(app, "/admin/drain", body, headers=auth()).status_code == 200


def test_ready_is_200_when_serving(app):
    r = http_get(app, "/ready")
    assert r.status_code == 200
    assert r.json() == {"ready": True, "status": "ok", "model": STORIES,
                        "models": {STORIES: {"ready": True, "reason": None}, "light": {"ready": True, "reason": None}}}
    assert http_get(app, "/health").json()["status"] == "ok"   # liveness unchanged


def test_ready_is_503_draining_after_admin_drain_and_200_after_undrain(app):
    _drain(app, True)
    try:
        r = http_get(app, "/ready")
        assert r.status_code == 503
        assert r.headers["retry-after"] == "5"
        body = r.json()
        assert body["ready"] is False and body["reason"] == "draining" and body["status"] == "draining"
        h = http_get(app, "/health")
        assert h.status_code == 200 and h.json()["status"] == "draining"   # liveness stays 200
    finally:
        _drain(app, False)
    r = http_get(app, "/ready")
    assert r.status_code == 200 and r.json()["ready"] is True


def test_light_model_drain_leaves_the_server_ready_unless_it_serves_the_main_name(app):
    _drain(app, True, model="light")
    try:
        r = http_get(app, "/ready")
        assert r.status_code == 200
        assert r.json()["models"]["light"] == {"ready": False, "reason": "draining"}
        assert r.json()["models"][STORIES] == {"ready": True, "reason": None}
        # main routed to the drained light model: a request for main would be refused → not ready
        assert http_post(app, "/admin/route", {"model": STORIES, "to": "light"}, headers=auth()).status_code == 200
        r = http_get(app, "/ready")
        assert r.status_code == 503 and r.json()["reason"] == "draining"
        refused = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_draining"
    finally:
        http_post(app, "/admin/route", {"model": STORIES, "to": None}, headers=auth())
        _drain(app, False, model="light")
    assert http_get(app, "/ready").status_code == 200


def test_ready_is_503_starting_before_the_engine_thread_runs(stories_dir):
    engine = AsyncLLMEngine(LLMEngine(load_model(str(stories_dir / "stories260K.bin")),
                                      EngineConfig(num_threads=1, served_model_name=STORIES)))
    app = make_app({STORIES: engine})
    r = http_get(app, "/ready")
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["ready"] is False and r.json()["reason"] == "starting"
    assert http_get(app, "/health").status_code == 200
    engine.start()
    with engines_running(engine):
        r = http_get(app, "/ready")
        assert r.status_code == 200 and r.json()["ready"] is True


def test_stopping_refuses_new_requests_and_readiness(app):
    app.state.server.stopping = True
    r = http_get(app, "/ready")
    assert r.status_code == 503 and r.json()["reason"] == "stopping" and r.headers["retry-after"] == "5"
    assert r.json()["models"]["light"] == {"ready": False, "reason": "stopping"}
    for model in (STORIES, "light"):
        refused = http_post(app, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 2})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert refused.json()["error"]["code"] == "engine_draining"
        assert "shutting down" in refused.json()["error"]["message"]
    assert http_get(app, "/health").status_code == 200


def _stream_body(max_tokens: int) -> dict:
    return {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


def test_in_flight_counts_requests_but_not_probes(app):
    state = app.state.server

    async def go():
        async with client(app) as c:
            task = asyncio.ensure_future(c.post("/v1/completions", json=_stream_body(300)))
            await wait_for(lambda: _async(state.in_flight == 1))
            assert (await c.get("/ready")).status_code == 200
            assert state.in_flight == 1                       # the probe was not counted
            await task
        return state.in_flight

    assert run(go()) == 0


async def _async(value):
    return value


def test_drain_lets_a_stream_finish_within_the_grace_period(app):
    state = app.state.server

    async def go():
        async with client(app) as c:
            task = asyncio.ensure_future(c.post("/v1/completions", json=_stream_body(120)))
            await wait_for(lambda: _async(state.in_flight == 1))
            finished_in_grace = await drain(state, 60.0)
            refused = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
            return finished_in_grace, await task, refused

    finished_in_grace, streamed, refused = run(go())
    assert finished_in_grace is True and state.in_flight == 0 and state.stopping is True
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 120    # every token, then the normal end
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_draining"


def test_drain_past_the_grace_period_aborts_with_an_error_event(app, pair):
    state = app.state.server
    main = pair[0]
    before = main.stats()["requests"]["by_finish_reason"]["abort"]

    async def go():
        async with client(app) as c:
            stream = asyncio.ensure_future(c.post("/v1/completions", json=_stream_body(2000)))
            plain = asyncio.ensure_future(c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2000,
                                                                          "ignore_eos": True}))
            await wait_for(lambda: _async(state.in_flight == 2))
            finished_in_grace = await drain(state, 0.2, flush_seconds=10.0)
            return finished_in_grace, await stream, await plain

    finished_in_grace, streamed, plain = run(go())
    assert finished_in_grace is False and state.in_flight == 0
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    err = events[-2]["error"]
    assert err["code"] == "engine_unavailable" and "grace period (0.2 s)" in err["message"]
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])   # cut short: no "length", no usage
    assert plain.status_code == 503 and plain.headers["retry-after"] == "5"
    assert plain.json()["error"]["code"] == "engine_unavailable"

    async def aborted_and_freed():
        s = main.stats()
        return (s["requests"]["by_finish_reason"]["abort"] == before + 2 and s["kv_cache"]["blocks_used"] == 0
                and s["scheduler"]["running"] == 0)
    run(wait_for(aborted_and_freed))


def test_graceful_server_first_signal_drains_second_forces(app):
    server = GracefulServer(uvicorn.Config(app), app.state.server, grace_seconds=1.0)
    server.handle_exit(signal.SIGTERM, None)
    assert app.state.server.stopping is True
    assert server.should_exit is False and server.force_exit is False   # drain first, on the next tick
    server.handle_exit(signal.SIGTERM, None)
    assert server.forced is True and server.force_exit is True and server.should_exit is True
