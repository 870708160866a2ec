"""``inferctl engine serve --no-enable-prefix-caching --repetition-stop --api-key`` (and
``$INFERCTL_API_KEY``): the values reach the EngineConfig and the app (CliRunner, no port)."""

from __future__ import annotations

import pytest

from tests.server_helpers import run, serve_without_listening


def call(app, method: str, path: str, **kw) -> int:
    """Status of one in-process request, Host 127.0.0.1 (the CLI's app checks Host)."""
    import httpx

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            return (await c.request(method, path, **kw)).status_code
    return run(go())


def serve(monkeypatch, args: list[str], env: dict | None = None) -> dict:
    res, seen = serve_without_listening(monkeypatch, args, env)
    assert res.exit_code == 0, res.output
    return seen


def test_defaults_cache_on_repetition_stop_off_api_open(monkeypatch):
    monkeypatch.delenv("INFERCTL_API_KEY", raising=False)
    seen = serve(monkeypatch, [])
    [eng] = seen["engines"].values()
    assert eng.engine.config.enable_prefix_caching is True
    assert eng.engine.block_manager.pool.enable_caching is True
    assert eng.engine.config.repetition_stop_default is False
    assert call(seen["app"], "GET", "/v1/models") == 200


@pytest.mark.parametrize("from_env", [False, True])
def test_flags_reach_the_engine_and_the_app(monkeypatch, from_env):
    key = "sk-cli-key-0123456789"
    args = ["--no-enable-prefix-caching", "--repetition-stop"] + ([] if from_env else ["--api-key", key])
    seen = serve(monkeypatch, args, env={"INFERCTL_API_KEY": key} if from_env else None)
    [eng] = seen["engines"].values()
    assert eng.engine.config.enable_prefix_caching is False
    assert eng.engine.block_manager.pool.enable_caching is False
    assert eng.engine.config.repetition_stop_default is True
    app = seen["app"]
    assert call(app, "GET", "/v1/models") == 401
    assert call(app, "GET", "/v1/models", headers={"Authorization": f"Bearer {key}"}) == 200
    assert call(app, "POST", "/v1/completions", json={"prompt": "x", "max_tokens": 1}) == 401
    assert call(app, "GET", "/health") == 200
