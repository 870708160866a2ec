"""A replica started with ``--api-key`` behind the router (issue 9, hole 3), in process: the
router's probes carry its ``upstream_api_key`` (the engine guards ``/v1/models``, so without it
the router never learns the served names); a client's own ``Authorization`` is passed through
unchanged and the engine judges it (a request without one gets the engine's 401: the router
never lends its key to a client, docs/router.md "API keys")."""

from __future__ import annotations

import httpx
import pytest

from inferctl.router.app import create_app
from inferctl.router.config import EngineSpec, RouterConfig
from tests.server_helpers import demo_engine, engines_running, make_app, run

KEY = "sk-upstream-1234"


@pytest.fixture(scope="module")
def engine_app():
    eng = demo_engine("light")
    with engines_running(eng):
        yield make_app({"light": eng}, api_key=KEY)


class Recording(httpx.AsyncBaseTransport):
    def __init__(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.auth: list[tuple[str, str | None]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.auth.append((request.url.path, request.headers.get("authorization")))
        return await self.inner.handle_async_request(request)


def router(engine_app, key):
    rec = Recording(engine_app)
    client = httpx.AsyncClient(mounts={"http://a.test": rec}, timeout=60.0)
    app = create_app(RouterConfig(engines=(EngineSpec("a", "http://a.test"),), upstream_api_key=key), client=client)
    return app, app.state.router, rec


async def ask(app, headers):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router.test",
                                 timeout=60.0) as c:
        return await c.post("/v1/completions", headers=headers,
                            json={"model": "light", "prompt": "hello", "max_tokens": 2, "temperature": 0})


def test_probes_carry_the_upstream_key_and_learn_the_models(engine_app):
    async def go():
        app, st, rec = router(engine_app, KEY)
        await st.prober.round()
        return st.replicas["a"], rec.auth
    replica, seen = run(go())
    assert replica.routable and replica.models == frozenset({"light"})
    assert dict(seen)["/v1/models"] == f"Bearer {KEY}"


def test_without_the_key_the_probe_cannot_read_the_models(engine_app):
    async def go():
        app, st, _ = router(engine_app, None)
        await st.prober.round()
        return st.replicas["a"]
    assert run(go()).models is None          # /v1/models answered 401


def test_client_authorization_passes_through_and_the_engine_judges_it(engine_app):
    async def go():
        app, st, rec = router(engine_app, KEY)
        await st.prober.round()
        good = await ask(app, {"Authorization": f"Bearer {KEY}"})
        wrong = await ask(app, {"Authorization": "Bearer not-the-key"})
        anonymous = await ask(app, {})
        posts = [a for p, a in rec.auth if p == "/v1/completions"]
        return good, wrong, anonymous, posts
    good, wrong, anonymous, posts = run(go())
    assert good.status_code == 200, good.text
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert anonymous.status_code == 401 and "missing API key" in anonymous.json()["error"]["message"]
    assert posts == [f"Bearer {KEY}", "Bearer not-the-key", None]     # never the router's key for a client


def test_with_its_own_key_the_router_reaches_the_engines_with_theirs(engine_app):
    """One key at the front door: a client admitted with the router's key is forwarded with the
    replicas' key (``inferctl up`` with a shell key and engines on ``launch.api_key``)."""
    front = "sk-front-door-77"

    async def go():
        rec = Recording(engine_app)
        client = httpx.AsyncClient(mounts={"http://a.test": rec}, timeout=60.0)
        app = create_app(RouterConfig(engines=(EngineSpec("a", "http://a.test"),), upstream_api_key=KEY,
                                      api_key=front), client=client)
        await app.state.router.prober.round()
        probes = len(rec.auth)
        good = await ask(app, {"Authorization": f"Bearer {front}"})
        engines_key = await ask(app, {"Authorization": f"Bearer {KEY}"})      # the router's door wants its own
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router.test") as c:
            models = await c.get("/v1/models", headers={"Authorization": f"Bearer {front}"})
        return good, engines_key, models, rec.auth[probes:]

    good, engines_key, models, asked = run(go())
    assert good.status_code == 200, good.text
    assert engines_key.status_code == 401 and engines_key.json()["error"]["message"] == "incorrect API key"
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["light"]
    assert asked == [("/v1/completions", f"Bearer {KEY}"), ("/v1/models", f"Bearer {KEY}")]
