"""The router's own client API key (``--api-key`` / ``$INFERCTL_API_KEY``, router/auth.py) and the
per-replica affinity gauge, over REAL engine apps through httpx.ASGITransport (no ports).

The key: 401 with the engine's own body and headers, on the hot path and FastAPI's, before any
replica is asked; probes, scrapers and the OpenAPI document stay open; a refused ``Host`` is
still 421 first; a bad key exits 2 naming the flag, never the key (CliRunner)."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from inferctl.router.app import create_app
from inferctl.router.config import ConfigError, EngineSpec, RouterConfig
from tests.server_helpers import demo_engine, engines_running, make_app, run

KEY = "sk-router-key-42"


@pytest.fixture(scope="module")
def engine():
    eng = demo_engine("light")
    with engines_running(eng):
        yield eng


class Recording(httpx.AsyncBaseTransport):
    def __init__(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.seen: list[tuple[str, str, str | None]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path, request.headers.get("authorization")))
        return await self.inner.handle_async_request(request)


def router(engine_app, bind_host: str | None = None, **kw):
    rec = Recording(engine_app)
    client = httpx.AsyncClient(mounts={"http://a.test": rec}, timeout=60.0)
    app = create_app(RouterConfig(engines=(EngineSpec("a", "http://a.test"),), **kw), client=client,
                     bind_host=bind_host)
    return app, rec


BODY = {"model": "light", "prompt": "hello there", "max_tokens": 2, "temperature": 0}


async def call(app, method: str, path: str, headers: dict | None = None, host: str = "router.test", **kw):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{host}",
                                 timeout=60.0) as c:
        return await c.request(method, path, headers=headers, **kw)


def test_without_the_key_the_router_answers_the_engines_401_and_asks_no_replica(engine):
    async def go():
        keyed_engine = make_app({"light": engine}, api_key=KEY)
        app, rec = router(make_app({"light": engine}), api_key=KEY)
        await app.state.router.prober.round()
        probes = len(rec.seen)
        out = {
            "engine_missing": await call(keyed_engine, "POST", "/v1/completions", json=BODY),
            "engine_wrong": await call(keyed_engine, "POST", "/v1/completions", json=BODY,
                                       headers={"authorization": "Bearer nope"}),
            "missing": await call(app, "POST", "/v1/completions", json=BODY, headers={"x-request-id": "rid-1"}),
            "wrong": await call(app, "POST", "/v1/chat/completions", headers={"authorization": "Bearer nope"},
                                json={"model": "light", "messages": [{"role": "user", "content": "hi"}]}),
            "models": await call(app, "GET", "/v1/models"),
            "unknown": await call(app, "GET", "/v1/nothing-here"),
        }
        return out, rec.seen[probes:], app.state.router

    out, asked, state = run(go())
    for mine, theirs in (("missing", "engine_missing"), ("wrong", "engine_wrong")):
        assert out[mine].status_code == out[theirs].status_code == 401
        assert out[mine].json() == out[theirs].json()            # the engine's body, word for word
        assert out[mine].headers["www-authenticate"] == out[theirs].headers["www-authenticate"] == "Bearer"
    assert out["missing"].json()["error"]["code"] == "invalid_api_key"
    assert out["missing"].json()["error"]["message"].startswith("missing API key")
    assert out["wrong"].json()["error"]["message"] == "incorrect API key"
    assert out["missing"].headers["x-request-id"] == "rid-1"
    assert out["models"].status_code == 401 and out["unknown"].status_code == 401   # /v1 and below, any route
    assert asked == []                                            # no replica saw any of them
    assert state.registry.get_sample_value("inferctl_router_rejected_total", {"reason": "invalid_api_key"}) == 4


def test_with_the_key_requests_pass_and_the_clients_own_authorization_travels(engine):
    async def go():
        app, rec = router(make_app({"light": engine}), api_key=KEY)
        await app.state.router.prober.round()
        probes = len(rec.seen)
        ok = await call(app, "POST", "/v1/completions", json=BODY, headers={"authorization": f"Bearer {KEY}"})
        models = await call(app, "GET", "/v1/models", headers={"authorization": f"Bearer {KEY}"})
        return ok, models, rec.seen[probes:]

    ok, models, asked = run(go())
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["light"]
    assert ("POST", "/v1/completions", f"Bearer {KEY}") in asked


def test_probes_scrapes_and_the_openapi_document_stay_open(engine):
    async def go():
        app, _ = router(make_app({"light": engine}), api_key=KEY)
        await app.state.router.prober.round()
        return {p: await call(app, "GET", p) for p in ("/health", "/ready", "/metrics", "/replicas", "/openapi.json")}

    out = run(go())
    assert {p: r.status_code for p, r in out.items()} == dict.fromkeys(out, 200)
    doc = out["/openapi.json"].json()
    assert doc["paths"]["/v1/completions"]["post"]["security"] == [{"apiKeyAuth": []}]
    assert "security" not in doc["paths"]["/health"]["get"]


def test_a_refused_host_is_421_before_the_key_is_asked(engine):
    async def go():
        app, _ = router(make_app({"light": engine}), api_key=KEY, bind_host="127.0.0.1")
        return (await call(app, "POST", "/v1/completions", json=BODY, host="evil.example"),
                await call(app, "POST", "/v1/completions", json=BODY, host="127.0.0.1:8080"))

    foreign, local = run(go())
    assert foreign.status_code == 421 and local.status_code == 401


def test_without_a_key_the_router_stays_open(engine):
    async def go():
        app, _ = router(make_app({"light": engine}))
        await app.state.router.prober.round()
        return await call(app, "POST", "/v1/completions", json=BODY)

    assert run(go()).status_code == 200


@pytest.mark.parametrize("key, says", [("", "the API key is empty"), ("   ", "the API key is empty"),
                                       ("two words", "visible ASCII only"), ("ключ", "visible ASCII only")])
def test_a_key_no_client_could_send_is_refused_naming_the_flag_never_the_key(key, says):
    with pytest.raises(ConfigError, match=says) as info:
        RouterConfig(engines=(EngineSpec("a", "http://a.test"),), api_key=key).validate()
    assert str(info.value).startswith("--api-key (or $INFERCTL_API_KEY)")
    if key.strip():
        assert key not in str(info.value)
    from inferctl.cli import app
    res = CliRunner().invoke(app, ["router", "--engine", "a=http://127.0.0.1:9", "--api-key", key])
    assert res.exit_code == 2 and res.output.startswith("error: --api-key (or $INFERCTL_API_KEY)"), res.output
    assert key.strip() == "" or key not in res.output
    assert "api_key" not in repr(RouterConfig(engines=(EngineSpec("a", "http://a.test"),), api_key="sk-xyz-1"))


def test_the_affinity_gauge_counts_the_keys_placed_on_each_replica(engine):
    async def go():
        app, _ = router(make_app({"light": engine}))
        await app.state.router.prober.round()
        before = (await call(app, "GET", "/metrics")).text
        for prompt in ("a long shared system prompt number one, " * 2, "another long shared system prompt, " * 2):
            for _ in range(2):
                r = await call(app, "POST", "/v1/completions", json={**BODY, "prompt": prompt})
                assert r.status_code == 200
        r = await call(app, "POST", "/v1/completions", json=BODY, headers={"x-session-id": "chat-7"})
        assert r.status_code == 200
        return before, (await call(app, "GET", "/metrics")).text, app.state.router

    before, after, state = run(go())
    assert 'inferctl_router_affinity_keys{replica="a"} 0.0' in before
    assert 'inferctl_router_affinity_keys{replica="a"} 3.0' in after    # two prefixes and one session
    assert state.registry.get_sample_value("inferctl_router_affinity_keys", {"replica": "a"}) == 3
