"""The router over REAL engine apps (stories260K and the demo model) through httpx.ASGITransport.

Each test builds a router whose upstream client mounts one engine app per replica URL (plus
refusing or failing transports for dead replicas), runs one probe round by hand (ASGI tests
have no lifespan) and drives the router through its own ASGI transport.
"""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi import FastAPI

from inferctl.router.app import create_app
from inferctl.router.config import EngineSpec, RouterConfig
from tests.server_helpers import (ADMIN_TOKEN, STORIES, demo_engine, engines_running, make_app, run, sse_events,
                                  stories_engine)

PROMPT = "Once upon a time"


class Refusing(httpx.AsyncBaseTransport):
    """A replica whose port refuses connections."""

    def __init__(self) -> None:
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += request.method == "POST"
        raise httpx.ConnectError("connection refused", request=request)


class _Broken(httpx.AsyncByteStream):
    async def __aiter__(self):
        raise httpx.ReadError("connection reset by peer")
        yield b""  # pragma: no cover - makes this an async generator


class FailsBeforeFirstByte(httpx.AsyncBaseTransport):
    """A replica that answers 200 headers, then resets the connection before any body byte."""

    def __init__(self) -> None:
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += request.method == "POST"
        return httpx.Response(200, headers={"content-type": "application/json"}, stream=_Broken())


class Switchable(httpx.AsyncBaseTransport):
    """``inner`` until ``down`` is set, then a refused connection."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner, self.down = inner, False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        return await self.inner.handle_async_request(request)


class Recording(httpx.AsyncBaseTransport):
    """An ASGI transport over ``app`` that records the requests it forwards."""

    def __init__(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await self.inner.handle_async_request(request)

    def posts(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == "POST" and r.url.path.startswith("/v1/")]


@pytest.fixture(scope="module")
def engines(stories_dir):
    a, b = stories_engine(stories_dir), stories_engine(stories_dir)
    light = demo_engine("light")
    with engines_running(a, b, light):
        yield {"a": a, "b": b, "light": light}


@pytest.fixture()
def apps(engines):
    """Fresh engine apps: replicas a and b serve stories260K, c serves the demo model "light"."""
    return {"a": make_app({STORIES: engines["a"]}), "b": make_app({STORIES: engines["b"]}),
            "c": make_app({"light": engines["light"]})}


def build_router(transports: dict, **config):
    """A router over ``{name: transport}`` (URL ``http://<name>.test``), and its state."""
    specs = tuple(EngineSpec(name, f"http://{name}.test") for name in transports)
    mounts = {f"http://{name}.test": t for name, t in transports.items()}
    client = httpx.AsyncClient(mounts=mounts, timeout=60.0)
    app = create_app(RouterConfig(engines=specs, **config), client=client)
    return app, app.state.router


def rclient(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router.test", timeout=60.0)


def sample(state, name: str, labels: dict) -> float | None:
    return state.registry.get_sample_value(name, labels)


def completion(**extra) -> dict:
    return {"model": STORIES, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra}


async def drain(app, on: bool) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e.test") as c:
        r = await c.post("/admin/drain", json={"draining": on}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 200, r.text


# ------------------------------------------------------------------ readiness


def test_routes_only_to_ready_replicas(apps):
    async def go():
        app, st = build_router({n: Recording(a) for n, a in apps.items()})
        await drain(apps["a"], True)
        try:
            await st.prober.round()
            assert not st.replicas["a"].routable and st.replicas["a"].reason == "draining"
            assert st.replicas["b"].routable and st.replicas["c"].routable
            async with rclient(app) as c:
                served = [(await c.post("/v1/completions", json=completion())) for _ in range(6)]
        finally:
            await drain(apps["a"], False)
        assert [r.status_code for r in served] == [200] * 6
        # stories260K is served by a (not ready) and b only: every request went to b
        assert {r.headers["x-inferctl-replica"] for r in served} == {"b"}
        return st

    st = run(go())
    assert sample(st, "inferctl_router_requests_total", {"replica": "b", "status": "200"}) == 6
    assert sample(st, "inferctl_router_replicas_ready", {}) == 2


def test_no_ready_replica_is_503_with_retry_after(apps):
    async def go():
        app, st = build_router({"down": Refusing()}, retry_after_seconds=3)
        await st.prober.round()
        async with rclient(app) as c:
            return await c.post("/v1/completions", json=completion()), await c.get("/ready"), st

    r, ready, st = run(go())
    assert r.status_code == 503 and r.headers["retry-after"] == "3"
    assert r.json()["error"]["code"] == "no_ready_replica"
    assert r.json()["error"]["type"] == "service_unavailable_error"
    assert ready.status_code == 503 and ready.json()["ready"] is False
    assert st.replicas["down"].reason == "down"


def test_models_is_the_union_of_ready_replicas(apps):
    async def go():
        app, st = build_router({n: Recording(a) for n, a in apps.items()})
        await st.prober.round()
        async with rclient(app) as c:
            models = (await c.get("/v1/models")).json()
            light = await c.post("/v1/completions", json={**completion(), "model": "light"})
        return models, light

    models, light = run(go())
    assert [m["id"] for m in models["data"]] == ["light", STORIES]
    assert light.status_code == 200 and light.headers["x-inferctl-replica"] == "c"


# ------------------------------------------------------------------ retries


def test_retries_a_refused_replica_before_the_first_byte(apps):
    async def go():
        refusing = Refusing()
        app, st = build_router({"down": refusing, "b": Recording(apps["b"])}, max_retries=1)
        await st.prober.round()
        st.replicas["down"].ready, st.replicas["down"].reason = True, None   # died after its last probe
        st.replicas["down"].models = None
        st.replicas["b"].outstanding = 3   # so that the least-loaded choice is the dead replica
        async with rclient(app) as c:
            r = await c.post("/v1/completions", json=completion())
        st.replicas["b"].outstanding -= 3
        return r, st, refusing

    r, st, refusing = run(go())
    assert r.status_code == 200 and r.headers["x-inferctl-replica"] == "b"
    assert refusing.calls == 1
    assert sample(st, "inferctl_router_retries_total", {"replica": "down", "reason": "connect_error"}) == 1
    assert sample(st, "inferctl_router_routing_decisions_total", {"reason": "fallback"}) == 1
    assert not st.replicas["down"].routable and st.replicas["down"].reason == "down"


def test_retries_a_draining_replica_503_and_one_failing_before_the_first_byte(apps):
    async def go():
        failing = FailsBeforeFirstByte()
        rec_a, rec_b = Recording(apps["a"]), Recording(apps["b"])
        app, st = build_router({"a": rec_a, "f": failing, "b": rec_b}, max_retries=2)
        await st.prober.round()
        st.replicas["f"].ready, st.replicas["f"].reason = True, None
        await drain(apps["a"], True)    # a still looks ready to the router: its probe is stale
        try:
            st.replicas["b"].outstanding = 5
            async with rclient(app) as c:
                r = await c.post("/v1/completions", json=completion())
            st.replicas["b"].outstanding -= 5
        finally:
            await drain(apps["a"], False)
        return r, st, rec_a, failing

    r, st, rec_a, failing = run(go())
    assert r.status_code == 200 and r.headers["x-inferctl-replica"] == "b"
    assert len(rec_a.posts()) == 1 and failing.calls == 1
    assert sample(st, "inferctl_router_retries_total", {"replica": "a", "reason": "unavailable"}) == 1
    assert sample(st, "inferctl_router_retries_total", {"replica": "f", "reason": "upstream_error"}) == 1


def test_every_replica_503_passes_the_last_503_through(apps):
    async def go():
        app, st = build_router({"a": Recording(apps["a"])})
        await st.prober.round()
        await drain(apps["a"], True)
        try:
            async with rclient(app) as c:
                via = await c.post("/v1/completions", json=completion())
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps["a"]), base_url="http://e") as c:
                direct = await c.post("/v1/completions", json=completion())
        finally:
            await drain(apps["a"], False)
        return via, direct

    via, direct = run(go())
    assert direct.status_code == 503 and via.status_code == 503
    assert via.json() == direct.json() and via.headers.get("retry-after") == direct.headers.get("retry-after")


# ------------------------------------------------------------------ 4xx


BAD_BODIES = [
    b'{"model": "stories260K", "prompt": "x", "max_tokens": "20"}',
    b'{"model": "stories260K", "prompt": ""}',
    b'{"model": "stories260K", "prompt": "x", "max_tokens": 0}',
    b'{"model": "stories260K", "prompt": "x", "n": 17}',
    b'{"prompt": "x", "temperature": NaN}',
    b'[1, 2]',
    b'{"prompt": "x"',
    b'',
    b'{"prompt": "\\ud800"}',
]


@pytest.mark.parametrize("body", BAD_BODIES)
def test_a_bad_body_gets_the_engines_400_without_reaching_a_replica(apps, body):
    async def go():
        rec = Recording(apps["a"])
        app, st = build_router({"a": rec})
        await st.prober.round()
        async with rclient(app) as c:
            via = await c.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps["a"]), base_url="http://e") as c:
            direct = await c.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        return via, direct, rec, st

    via, direct, rec, st = run(go())
    assert direct.status_code == 400
    assert via.status_code == direct.status_code and via.json() == direct.json()
    assert rec.posts() == []
    assert sample(st, "inferctl_router_rejected_total", {"reason": "invalid_request"}) == 1


def test_a_bad_chat_body_gets_the_engines_400(apps):
    body = {"model": STORIES, "messages": []}

    async def go():
        app, st = build_router({"a": Recording(apps["a"])})
        await st.prober.round()
        async with rclient(app) as c:
            via = await c.post("/v1/chat/completions", json=body)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps["a"]), base_url="http://e") as c:
            direct = await c.post("/v1/chat/completions", json=body)
        return via, direct

    via, direct = run(go())
    assert via.status_code == direct.status_code == 400
    assert via.json() == direct.json() and via.json()["error"]["param"] == "messages"


def test_an_upstream_4xx_is_passed_through_unchanged(apps):
    # max_tokens above the room left in the context: only the engine (with the tokenizer) knows
    too_long = completion(max_tokens=100_000)
    unknown = completion(model="no-such-model")

    async def go():
        rec = Recording(apps["a"])
        app, st = build_router({"a": rec})
        await st.prober.round()
        out = []
        for body in (too_long, unknown):
            async with rclient(app) as c:
                via = await c.post("/v1/completions", json=body)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps["a"]), base_url="http://e") as c:
                direct = await c.post("/v1/completions", json=body)
            out.append((via, direct))
        return out, rec, st

    out, rec, st = run(go())
    for via, direct in out:
        assert 400 <= direct.status_code < 500
        assert via.status_code == direct.status_code and via.content == direct.content
    assert [o[1].status_code for o in out] == [400, 404]
    assert len(rec.posts()) == 2      # both reached the replica: the 4xx is the engine's own
    assert sample(st, "inferctl_router_requests_total", {"replica": "a", "status": "404"}) == 1


# ------------------------------------------------------------------ streaming, request ids, affinity


def test_streaming_chunks_arrive_in_order(apps):
    body = completion(max_tokens=24, stream=True, stream_options={"include_usage": True})
    chat = {"model": STORIES, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24,
            "temperature": 0, "stream": True}

    async def go():
        app, st = build_router({"a": Recording(apps["a"])})
        await st.prober.round()
        out = []
        for path, b in (("/v1/completions", body), ("/v1/chat/completions", chat)):
            async with rclient(app) as c:
                via = await c.post(path, json=b)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps["a"]), base_url="http://e") as c:
                direct = await c.post(path, json=b)
            out.append((via, direct))
        return out, st

    out, st = run(go())
    for via, direct in out:
        assert via.status_code == 200 and via.headers["content-type"].startswith("text/event-stream")
        ev_via, ev_direct = sse_events(via.text), sse_events(direct.text)
        assert ev_via[-1] == "[DONE]" and len(ev_via) == len(ev_direct) > 5

        def content(events):
            return [e["choices"][0].get("text", e["choices"][0].get("delta", {}).get("content"))
                    for e in events[:-1] if isinstance(e, dict) and e.get("choices")]
        assert content(ev_via) == content(ev_direct)
    assert sample(st, "inferctl_router_outstanding_requests", {"replica": "a"}) == 0
    assert sample(st, "inferctl_router_requests_total", {"replica": "a", "status": "200"}) == 2


def test_request_id_is_forwarded_and_returned(apps):
    async def go():
        rec = Recording(apps["a"])
        app, st = build_router({"a": rec})
        await st.prober.round()
        async with rclient(app) as c:
            given = await c.post("/v1/completions", json=completion(), headers={"X-Request-Id": "abc-123"})
            made = await c.post("/v1/completions", json=completion())
            bad = await c.post("/v1/completions", json=completion(prompt=""), headers={"X-Request-Id": "r-400"})
        return given, made, bad, rec

    given, made, bad, rec = run(go())
    assert given.headers["x-request-id"] == "abc-123"
    sent = [r.headers.get("x-request-id") for r in rec.posts()]
    assert sent[0] == "abc-123"
    assert len(made.headers["x-request-id"]) == 32 and sent[1] == made.headers["x-request-id"]
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "r-400"


def test_prefix_affinity_and_session_pin_a_replica(apps):
    # longer than the 256 affinity characters: every turn's key is the system prompt alone (at
    # 2 copies the key took in each turn's own user text, and the turns were 4 different keys)
    system = "You are a storyteller who always writes about a cat named Tom and his friend. " * 4

    async def go():
        app, st = build_router({"a": Recording(apps["a"]), "b": Recording(apps["b"])})
        await st.prober.round()
        seen, sessions = [], []
        async with rclient(app) as c:
            for turn in range(4):
                body = {"model": STORIES, "max_tokens": 4, "temperature": 0,
                        "messages": [{"role": "system", "content": system},
                                     {"role": "user", "content": f"turn {turn}"}]}
                seen.append((await c.post("/v1/chat/completions", json=body)).headers["x-inferctl-replica"])
                sessions.append((await c.post("/v1/completions", json=completion(prompt=f"hi {turn}"),
                                              headers={"X-Session-Id": "user-42"})).headers["x-inferctl-replica"])
        return seen, sessions, st

    seen, sessions, st = run(go())
    assert len(set(seen)) == 1 and len(set(sessions)) == 1
    assert sample(st, "inferctl_router_routing_decisions_total", {"reason": "affinity"}) == 4
    assert sample(st, "inferctl_router_routing_decisions_total", {"reason": "session"}) == 4


# ------------------------------------------------------------------ the controller's view


def test_controller_view_blocks_and_survives_the_controller_going_away(apps):
    view = {"engines": {"a": {"url": "http://a.test", "up": True, "draining": True},
                        "b": {"url": "http://b.test", "up": True, "draining": False}}}
    controller = FastAPI()

    @controller.get("/status")
    async def status():
        return view

    async def go():
        transports = {"a": Recording(apps["a"]), "b": Recording(apps["b"])}
        specs = tuple(EngineSpec(n, f"http://{n}.test") for n in transports)
        mounts = {f"http://{n}.test": t for n, t in transports.items()}
        ctl = Switchable(httpx.ASGITransport(app=controller))
        mounts["http://ctl.test"] = ctl
        client = httpx.AsyncClient(mounts=mounts, timeout=60.0)
        app = create_app(RouterConfig(engines=specs, controller="http://ctl.test"), client=client)
        st = app.state.router
        await st.prober.round()
        first = (st.replicas["a"].routable, st.replicas["a"].blocked, st.replicas["b"].routable)
        ctl.down = True
        await st.prober.round()
        second = (st.replicas["a"].routable, st.prober.controller_ok)
        async with rclient(app) as c:
            r = await c.post("/v1/completions", json=completion())
        return first, second, r, st

    first, second, r, st = run(go())
    assert first == (False, "draining", True)
    assert second == (False, False)          # the last known view is kept
    assert r.headers["x-inferctl-replica"] == "b"
    assert sample(st, "inferctl_router_controller_up", {}) == 0


def test_metrics_route_serves_the_catalog(apps):
    async def go():
        app, st = build_router({"a": Recording(apps["a"])})
        await st.prober.round()
        async with rclient(app) as c:
            return (await c.get("/metrics")).text, (await c.get("/health")).json(), (await c.get("/ready")).json()

    text, health, ready = run(go())
    assert "inferctl_router_replicas_ready 1.0" in text
    assert 'inferctl_router_replica_ready{replica="a"} 1.0' in text
    assert health == {"status": "ok"} and ready == {"ready": True, "replicas_ready": 1}
    json.dumps(ready)


def test_a_non_json_content_type_gets_what_the_engine_gives(apps):
    body = json.dumps(completion()).encode()

    async def go():
        rec = Recording(apps["a"])
        app, st = build_router({"a": rec})
        await st.prober.round()
        headers = {"content-type": "text/plain"}
        async with rclient(app) as c:
            via = await c.post("/v1/completions", content=body, headers=headers)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps["a"]), base_url="http://e") as c:
            direct = await c.post("/v1/completions", content=body, headers=headers)
        return via, direct, rec

    via, direct, rec = run(go())
    assert via.status_code == direct.status_code
    if direct.status_code >= 400:      # the engine refuses non-JSON bodies (415): so does the router, alone
        assert via.json() == direct.json() and rec.posts() == []


def test_non_ascii_headers_are_not_forwarded_and_never_a_500(apps):
    """A client header the HTTP client cannot send (non-ASCII) is left out of the forwarded
    request; the request is served (it was a bare 500, unlogged, before)."""
    async def go():
        rec = Recording(apps["a"])
        app, st = build_router({"a": rec})
        await st.prober.round()
        async with rclient(app) as c:
            r = await c.post("/v1/completions", json=completion(),
                             headers={"X-Session-Id": "é☃".encode(), "X-Foo": "café".encode(),
                                      "X-Bar": "plain"})
        return r, rec

    r, rec = run(go())
    assert r.status_code == 200, r.text
    [sent] = rec.posts()
    assert "x-foo" not in sent.headers and "x-session-id" not in sent.headers
    assert sent.headers["x-bar"] == "plain"


def test_a_router_bound_to_loopback_refuses_a_foreign_host(apps):
    """DNS rebinding: bound to 127.0.0.1 the router answers only loopback Host names (421 else),
    as the engine and the controller do; --allowed-host adds names."""
    async def go():
        specs = (EngineSpec("a", "http://a.test"),)
        client = httpx.AsyncClient(mounts={"http://a.test": httpx.ASGITransport(app=apps["a"])}, timeout=60.0)
        app = create_app(RouterConfig(engines=specs), client=client, bind_host="127.0.0.1",
                         allowed_hosts=("router.internal",))
        await app.state.router.prober.round()
        out = {}
        for host in ("evil.example", "127.0.0.1:8080", "localhost:8080", "router.internal:8080"):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{host}",
                                         timeout=60.0) as c:
                out[host] = await c.post("/v1/completions", json=completion())
        return out

    out = run(go())
    assert out["evil.example"].status_code == 421
    assert out["evil.example"].json()["error"]["code"] == "host_not_allowed"
    assert all(out[h].status_code == 200 for h in ("127.0.0.1:8080", "localhost:8080", "router.internal:8080"))


def test_the_completion_routes_skip_fastapis_stack_and_keep_their_answers(apps):
    """The hot path (RouterApp): a POST to /v1/completions or /v1/chat/completions never enters
    FastAPI's middleware stack (a recording middleware sees only the other requests), yet gets
    the same answers: 200 from the replica, the engine's 400 for a bad field, a request id."""
    async def go():
        app, st = build_router({"a": httpx.ASGITransport(app=apps["a"])})
        seen: list[str] = []

        class Spy:
            def __init__(self, inner) -> None:
                self.inner = inner

            async def __call__(self, scope, receive, send) -> None:
                if scope["type"] == "http":
                    seen.append(f"{scope['method']} {scope['path']}")
                await self.inner(scope, receive, send)

        app.add_middleware(Spy)
        await st.prober.round()
        async with rclient(app) as c:
            ok = await c.post("/v1/completions", json=completion(), headers={"X-Request-Id": "hot-1"})
            chat = await c.post("/v1/chat/completions", json={"model": STORIES, "max_tokens": 4,
                                                               "messages": [{"role": "user", "content": "Hi"}]})
            bad = await c.post("/v1/completions", json=completion(max_tokens=-1))
            health = await c.get("/health")
            wrong = await c.get("/v1/completions")
        return seen, ok, chat, bad, health, wrong

    seen, ok, chat, bad, health, wrong = run(go())
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] and ok.headers["x-request-id"] == "hot-1"
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert health.status_code == 200 and wrong.status_code == 405
    assert seen == ["GET /health", "GET /v1/completions"]


def test_the_routers_own_404_and_405_carry_a_request_id(apps):
    async def go():
        app, st = build_router({"a": apps["a"]})
        async with rclient(app) as c:
            return (await c.get("/v1/nothing"), await c.get("/v1/completions"),
                    await c.get("/v1/nothing", headers={"X-Request-Id": "mine-1"}))

    missing, wrong_method, given = run(go())
    assert missing.status_code == 404 and len(missing.headers["x-request-id"]) == 32
    assert wrong_method.status_code == 405 and len(wrong_method.headers["x-request-id"]) == 32
    assert given.headers["x-request-id"] == "mine-1"


# ------------------------------------------------------------------ per-key rate limits


def test_per_key_rate_limits_answer_429_with_retry_after_and_count_by_key_name(apps):
    from inferctl.router.ratelimit import KeyLimit

    keys = {"sk-secret-a": KeyLimit("team-a", requests_per_minute=2),
            "sk-secret-b": KeyLimit("team-b", tokens_per_minute=6)}
    rec = Recording(apps["a"])

    async def go():
        app, st = build_router({"a": rec}, rate_keys=keys)
        await st.prober.round()
        auth_a = {"Authorization": "Bearer sk-secret-a"}
        auth_b = {"Authorization": "Bearer sk-secret-b"}
        async with rclient(app) as c:
            a = [await c.post("/v1/completions", json=completion(), headers=auth_a) for _ in range(3)]
            other = await c.post("/v1/completions", json=completion())            # no key: not limited
            b = [await c.post("/v1/completions", json=completion(max_tokens=8), headers=auth_b) for _ in range(2)]
            metrics = (await c.get("/metrics")).text
        return a, other, b, metrics, st

    a, other, b, metrics, st = run(go())
    assert [r.status_code for r in a] == [200, 200, 429]
    err = a[2].json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
    assert "team-a" in err["message"] and "requests per minute" in err["message"]
    assert a[2].headers["retry-after"] == "30" and a[2].headers["x-request-id"]
    assert other.status_code == 200
    # team-b: the first answer's usage (prompt + 8 tokens > 6) overdraws the tokens bucket
    assert b[0].status_code == 200 and b[0].json()["usage"]["total_tokens"] > 6
    assert b[1].status_code == 429 and b[1].json()["error"]["message"].endswith(
        f"retry after {b[1].headers['retry-after']} s") and int(b[1].headers["retry-after"]) >= 1
    assert sample(st, "inferctl_router_rate_limited_total", {"key": "team-a", "limit": "requests"}) == 1
    assert sample(st, "inferctl_router_rate_limited_total", {"key": "team-b", "limit": "tokens"}) == 1
    assert "sk-secret" not in metrics
    assert len(rec.posts()) == 4                     # the two 429s never reached the replica


class _CutStream(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def __aiter__(self):
        for part in self.parts:
            yield part
        raise httpx.ReadError("connection reset by peer")


class CutsTheStream(httpx.AsyncBaseTransport):
    """A replica whose event stream breaks after ``parts`` (a SIGKILLed engine mid-answer)."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST":
            return httpx.Response(200, json={"ready": True, "data": [{"id": STORIES}]})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_CutStream(self.parts))


CHUNK = (b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"stories260K",'
         b'"choices":[{"index":0,"text":" Once","logprobs":null,"finish_reason":null}]}\n\n')


def test_a_stream_cut_after_its_first_byte_ends_with_an_error_event_the_openai_client_raises():
    import openai

    async def go():
        app, st = build_router({"a": CutsTheStream([CHUNK])})
        await st.prober.round()
        client = openai.AsyncOpenAI(base_url="http://router.test/v1", api_key="unused", max_retries=0,
                                    http_client=rclient(app))
        texts, raised = [], None
        try:
            async for event in await client.completions.create(model=STORIES, prompt=PROMPT, max_tokens=8,
                                                               stream=True):
                texts.append(event.choices[0].text)
        except openai.APIError as exc:
            raised = exc
        return texts, raised, st

    texts, raised, st = run(go())
    assert texts == [" Once"]                                    # what came before the cut is kept
    assert raised is not None and "cut the stream" in str(raised)
    assert sample(st, "inferctl_router_stream_errors_total", {"replica": "a"}) == 1


def test_a_stream_cut_inside_an_event_closes_it_before_the_error_event():
    async def go():
        app, st = build_router({"a": CutsTheStream([CHUNK, b'data: {"id":"cmpl-1","cho'])})
        await st.prober.round()
        async with rclient(app) as c:
            return await c.post("/v1/completions", json=completion(stream=True))

    r = run(go())
    events = [e for e in r.text.split("\n\n") if e]
    assert events[1] == 'data: {"id":"cmpl-1","cho'                          # the cut event, now closed
    error = json.loads(events[2].removeprefix("data: "))["error"]
    assert (error["code"], error["type"]) == ("upstream_stream_cut", "server_error")
    assert events[3] == "data: [DONE]" and r.text.endswith("\n\n")
