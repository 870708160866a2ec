"""Operations routes over real engines, in-process: admin auth, precision, fault (OOM), drain,
route to the light model, /health, /stats, /metrics (F06 cardinality), client disconnect."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferctl.engine.engine import RequestOutput
from inferctl.engine.entrypoints.errors import output_failure as _output_failure
from tests.server_helpers import (
    ADMIN_TOKEN,
    STORIES,
    auth,
    client,
    demo_engine,
    engines_running,
    make_app,
    metric_series,
    run,
    stories_engine,
    strict_json,
    wait_for,
)

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def pair(stories_dir):
    """stories260K as the main model and the demo model as "light"."""
    main = stories_engine(stories_dir, max_oom_retries=1, oom_backoff_seconds=0.01)
    light = demo_engine("light")
    with engines_running(main, light):
        yield main, light


@pytest.fixture()
def app(pair):
    main, light = pair
    return make_app({STORIES: main, "light": light})


async def _stats(c, model=None) -> dict:
    r = await c.get("/stats", params={"model": model} if model else None)
    assert r.status_code == 200
    return strict_json(r.text)


# ------------------------------------------------------------------------- admin auth

ADMIN_CALLS = [
    ("/admin/precision", {"mode": "full"}),
    ("/admin/fault", {"kind": "oom", "count": 1}),
    ("/admin/drain", {"draining": False}),
    ("/admin/route", {"model": STORIES, "to": None}),
]


@pytest.mark.parametrize("path, body", ADMIN_CALLS)
def test_admin_needs_the_bearer_token(app, path, body):
    async def go():
        async with client(app) as c:
            none = await c.post(path, json=body)
            wrong = await c.post(path, json=body, headers=auth("nope"))
            basic = await c.post(path, json=body, headers={"Authorization": f"Basic {ADMIN_TOKEN}"})
            return none, wrong, basic
    for r in run(go()):
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("path, body", ADMIN_CALLS)
def test_admin_without_configured_token_is_403(pair, path, body):
    main, light = pair
    app = make_app({STORIES: main, "light": light}, admin_token=None)

    async def go():
        async with client(app) as c:
            return await c.post(path, json=body, headers=auth())
    r = run(go())
    assert r.status_code == 403
    msg = r.json()["error"]["message"]
    assert "--admin-token" in msg and "INFERCTL_ADMIN_TOKEN" in msg


@pytest.mark.parametrize("path, body, param", [
    ("/admin/precision", {"mode": "fp4"}, "mode"),
    ("/admin/precision", {}, "mode"),
    ("/admin/fault", {"kind": "disk"}, "kind"),
    ("/admin/fault", {"count": 0}, "count"),
    ("/admin/fault", {"count": "2"}, "count"),
    ("/admin/drain", {"draining": "yes"}, "draining"),
    ("/admin/route", {"model": STORIES, "to": "nowhere"}, "to"),
    ("/admin/route", {"to": "light"}, "model"),
])
def test_admin_bad_bodies(app, path, body, param):
    async def go():
        async with client(app) as c:
            return await c.post(path, json=body, headers=auth()), await c.get("/health")
    r, health = run(go())
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param
    assert health.status_code == 200 and health.json()["status"] == "ok"


# ------------------------------------------------------------------------- precision

def test_precision_switch_degrades_health_and_recovers(app):
    async def go():
        async with client(app) as c:
            r = await c.post("/admin/precision", json={"mode": "int8", "model": STORIES}, headers=auth())
            assert r.status_code == 200
            assert r.json()["requested"] == "int8"

            async def switched():
                h = (await c.get("/health")).json()
                return h if h["precision"] == "int8" else None
            health = await wait_for(switched)
            assert health["status"] == "degraded"
            done = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
            assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 8
            metrics = (await c.get("/metrics")).text
            stats = await _stats(c)
            r = await c.post("/admin/precision", json={"mode": "full"}, headers=auth())
            assert r.status_code == 200

            async def back():
                h = (await c.get("/health")).json()
                return h if h["status"] == "ok" else None
            final = await wait_for(back)
            return metrics, stats, final
    metrics, stats, final = run(go())
    assert 'inferctl_engine_precision_mode{mode="int8"} 1.0' in metrics
    assert stats["engine"]["precision"] == "int8"
    assert stats["memory"]["weights_bytes"] < stats["memory"]["full_weights_bytes"]
    assert final["precision"] == "full"


# ------------------------------------------------------------------------- OOM

@pytest.mark.parametrize("stream", [False, True])
def test_oom_failing_a_request_is_503_with_retry_after_and_engine_lives(app, pair, stream):
    main, _ = pair

    async def go():
        async with client(app) as c:
            before = await _stats(c)
            # max_oom_retries=1: the first OOM re-queues the request, the second fails it.
            r = await c.post("/admin/fault", json={"kind": "oom", "count": 2, "model": STORIES}, headers=auth())
            assert r.status_code == 200
            failed = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "stream": stream})
            health = await c.get("/health")
            ok = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "temperature": 0})
            after = await _stats(c)
            return before, failed, health, ok, after
    before, failed, health, ok, after = run(go())
    assert failed.status_code == 503, failed.text
    assert failed.headers["retry-after"] == "5"
    assert failed.headers["content-type"].startswith("application/json")
    err = failed.json()["error"]
    assert "out of memory" in err["message"] and err["code"] == "out_of_memory"
    assert health.status_code == 200
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 5
    assert after["faults"]["oom_total"] == before["faults"]["oom_total"] + 2
    assert after["requests"]["by_finish_reason"]["error"] == before["requests"]["by_finish_reason"]["error"] + 1
    assert after["kv_cache"]["blocks_used"] == 0 and after["scheduler"]["running"] == 0


@pytest.mark.parametrize("status, code, http", [(400, "request_too_large_for_device", 400),
                                                (503, "out_of_memory", 503), (500, "engine_error", 500)])
def test_engine_error_status_mapping(status, code, http):
    # The engine's "impossible" OOM (error_status 400) cannot be provoked on a budget that was
    # sized for the model's largest step, so the mapping is checked on the engine's own type.
    out = RequestOutput("r", [], "", True, "error", [], 5, 0, None, "out of memory: can never fit", status)
    err = _output_failure(out, 7)
    assert err.status == http and err.code == code
    assert ("Retry-After" in err.headers) == (http == 503)
    ok = RequestOutput("r", [1], "x", True, "length", [-0.1], 5, 1)
    assert _output_failure(ok, 7) is None


# ------------------------------------------------------------------------- drain

def test_drain_refuses_new_requests_and_finishes_in_flight(app):
    async def go():
        async with client(app) as c:
            in_flight = asyncio.ensure_future(c.post("/v1/completions", json={
                "prompt": PROMPT, "max_tokens": 500, "ignore_eos": True, "temperature": 0}))

            async def running():
                return (await _stats(c))["scheduler"]["running"] == 1
            await wait_for(running, timeout=10, interval=0.002)
            r = await c.post("/admin/drain", json={"draining": True}, headers=auth())
            assert r.status_code == 200 and r.json()["draining"] is True
            refused = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
            refused_stream = await c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": PROMPT}], "stream": True})
            health = await c.get("/health")
            done = await in_flight
            await c.post("/admin/drain", json={"draining": False}, headers=auth())
            again = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
            health_after = await c.get("/health")
            return refused, refused_stream, health, done, again, health_after
    refused, refused_stream, health, done, again, health_after = run(go())
    for r in (refused, refused_stream):
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) > 0
        assert r.json()["error"]["code"] == "engine_draining"
    assert health.status_code == 200 and health.json()["status"] == "draining"
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 500
    assert again.status_code == 200
    assert health_after.json()["status"] == "ok"


# ------------------------------------------------------------------------- route to the light model

def test_route_main_to_light_and_back(app):
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "model": STORIES}

    async def go():
        async with client(app) as c:
            direct = await c.post("/v1/completions", json=body)
            r = await c.post("/admin/route", json={"model": STORIES, "to": "light"}, headers=auth())
            assert r.json() == {"routes": {STORIES: "light"}}
            routed = await c.post("/v1/completions", json=body)
            routed_chat = await c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3, "model": STORIES})
            health = (await c.get("/health")).json()
            listing = await c.get("/admin/route", headers=auth())
            models = (await c.get("/v1/models")).json()
            r = await c.post("/admin/route", json={"model": STORIES, "to": None}, headers=auth())
            assert r.json() == {"routes": {}}
            back = await c.post("/v1/completions", json=body)
            light_stats = await _stats(c, "light")
            return direct, routed, routed_chat, health, listing, models, back, light_stats
    direct, routed, routed_chat, health, listing, models, back, light_stats = run(go())
    assert direct.json()["model"] == STORIES
    assert routed.json()["model"] == "light" and routed_chat.json()["model"] == "light"
    assert routed.json()["choices"][0]["text"] != direct.json()["choices"][0]["text"]
    assert health["status"] == "degraded" and health["routes"] == {STORIES: "light"}
    assert listing.json() == {"routes": {STORIES: "light"}}
    assert sorted(m["id"] for m in models["data"]) == sorted([STORIES, "light"])
    assert back.json()["model"] == STORIES
    assert back.json()["choices"][0]["text"] == direct.json()["choices"][0]["text"]
    assert light_stats["engine"]["model"] == "light" and light_stats["requests"]["finished_total"] >= 2


def test_metrics_merge_two_engines_without_duplicates(app):
    async def go():
        async with client(app) as c:
            await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
            await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "model": "light"})
            return (await c.get("/metrics")).text
    text = run(go())
    series = metric_series(text)
    assert len(series) == len(set(series))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    models = {s.labels["model"] for s in families["inferctl_engine_requests"].samples}
    assert models == {STORIES, "light"}


# ------------------------------------------------------------------------- F06 cardinality

def test_f06_label_cardinality_is_bounded(stories_dir):
    eng = stories_engine(stories_dir, name="M")
    with engines_running(eng):
        app = make_app({"M": eng})

        async def go():
            async with client(app) as c:
                for i in range(10):
                    r = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "model": "M",
                                                              "user": f"user-{i}"},
                                     headers={"x-request-id": f"real-{i}"})
                    assert r.status_code == 200
                after_10 = (await c.get("/metrics")).text
                codes = set()
                for i in range(10_000):
                    r = await c.post("/v1/completions", json={"prompt": PROMPT, "model": f"m-{uuid.uuid4().hex}"},
                                     headers={"x-request-id": f"req-{uuid.uuid4().hex}"})
                    codes.add((r.status_code, r.json()["error"]["code"]))
                after_10k = (await c.get("/metrics")).text
                return after_10, codes, after_10k
        after_10, codes, after_10k = run(go())
    assert codes == {(404, "model_not_found")}
    s10, s10k = metric_series(after_10), metric_series(after_10k)
    assert len(s10) == len(s10k)
    assert sorted(s10) == sorted(s10k)
    label_names, model_values = set(), set()
    for fam in text_string_to_metric_families(after_10k):
        for sample in fam.samples:
            label_names |= set(sample.labels)
            if "model" in sample.labels:
                model_values.add(sample.labels["model"])
    assert model_values == {"M"}
    assert not label_names & {"request_id", "x_request_id", "user", "id"}
    for fam in text_string_to_metric_families(after_10k):
        for sample in fam.samples:
            for value in sample.labels.values():
                assert not value.startswith(("m-", "req-", "real-", "user-")), (sample.name, sample.labels)


# ------------------------------------------------------------------------- client disconnect

async def _asgi_disconnect(app, path: str, body: dict, after_chunks: int, after_seconds: float) -> list[bytes]:
    """Call the app with raw ASGI; the client disconnects after ``after_chunks`` body chunks
    (streaming) or ``after_seconds`` (whichever comes first)."""
    raw = json.dumps(body).encode()
    sent = False
    chunks: list[bytes] = []
    gone = asyncio.Event()

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        try:
            await asyncio.wait_for(gone.wait(), after_seconds)
        except asyncio.TimeoutError:
            pass
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            chunks.append(message["body"])
            if len(chunks) >= after_chunks:
                gone.set()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(raw)).encode())],
             "server": ("engine.test", 80), "client": ("127.0.0.1", 50000)}
    await asyncio.wait_for(app(scope, receive, send), 30)
    return chunks


@pytest.mark.parametrize("path, stream, prompts", [("/v1/completions", True, 1), ("/v1/chat/completions", True, 1),
                                                   ("/v1/completions", False, 1), ("/v1/completions", True, 2),
                                                   ("/v1/completions", False, 2)])
def test_client_disconnect_aborts_and_frees_blocks(app, path, stream, prompts):
    body = {"max_tokens": 500, "ignore_eos": True, "stream": stream, "temperature": 0}
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT if prompts == 1 else [PROMPT, "Lily went"]

    async def go():
        async with client(app) as c:
            before = await _stats(c)
            chunks = await _asgi_disconnect(app, path, body, after_chunks=3, after_seconds=0.05)

            async def freed():
                s = await _stats(c)
                return s if (s["kv_cache"]["blocks_used"] == 0 and s["scheduler"]["running"] == 0
                             and s["requests"]["by_finish_reason"]["abort"]
                             == before["requests"]["by_finish_reason"]["abort"] + prompts) else None
            after = await wait_for(freed, timeout=5)
            return before, chunks, after
    before, chunks, after = run(go())
    for recent in after["requests"]["recent"][-prompts:]:
        assert recent["finish_reason"] == "abort"
        assert recent["completion_tokens"] < 500
    assert after["requests"]["completion_tokens_total"] - before["requests"]["completion_tokens_total"] < 500 * prompts
    if stream:
        assert len(chunks) >= 3 and chunks[0].startswith(b"data: ")


def test_stopped_engine_answers_503_and_health_degraded(stories_dir):
    eng = stories_engine(stories_dir)
    eng.shutdown()
    app = make_app({STORIES: eng})

    async def go():
        async with client(app) as c:
            return (await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}),
                    await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "stream": True}),
                    await c.get("/health"))
    r, rs, health = run(go())
    for resp in (r, rs):
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable"
        assert resp.headers["retry-after"] == "5"
    assert health.status_code == 200
    assert health.json()["status"] == "degraded"
    assert health.json()["models"][STORIES]["engine_running"] is False


def test_kv_pool_admission_is_the_engines_400_and_defaults_fit_the_pool(stories_dir):
    # 4 blocks of 16 tokens: max_model_len (512) allows more than the pool holds (F14 c).
    eng = stories_engine(stories_dir, num_kv_blocks=4)
    with engines_running(eng):
        app = make_app({STORIES: eng})

        async def go():
            async with client(app) as c:
                too_big = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 100})
                too_big_stream = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 100,
                                                                       "stream": True})
                default = await c.post("/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": PROMPT}], "ignore_eos": True})
                long_prompt = await c.post("/v1/completions", json={"prompt": "story " * 100})
                health = await c.get("/health")
                return too_big, too_big_stream, default, long_prompt, health
        too_big, too_big_stream, default, long_prompt, health = run(go())
    for r in (too_big, too_big_stream):
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "max_tokens"
        assert "needs 7 KV blocks of 16 tokens > 4 blocks in the KV cache" in err["message"]
    assert default.status_code == 200
    assert default.json()["usage"]["completion_tokens"] == 64 - 5 + 1
    assert long_prompt.status_code == 400 and long_prompt.json()["error"]["param"] == "prompt"
    assert "KV blocks" in long_prompt.json()["error"]["message"]
    assert health.json()["status"] == "ok"
