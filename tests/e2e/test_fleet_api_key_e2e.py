"""End to end (issue 9, hole 3): ``INFERCTL_API_KEY=KEY inferctl up --replicas 2`` — engines that
require a key sit behind the router: its probes carry the key (every replica routable, its models
known), the official ``openai`` client with the key works through the router's URL, a wrong key
gets the engines' 401 (the router never lends its key to a client)."""

from __future__ import annotations

import signal

import httpx
import openai
import pytest

from tests.fleet_helpers import start_up

pytestmark = pytest.mark.e2e

KEY = "sk-e2e-fleet-key-0123"


def test_keyed_replicas_behind_the_router(stories_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERCTL_API_KEY", KEY)        # inherited by every launched engine
    up = start_up(stories_dir / "stories260K.bin", tmp_path, replicas=2)
    try:
        replicas = httpx.get(up.router + "/replicas").json()
        assert {n: (r["routable"], r["models"]) for n, r in replicas.items()} == \
            {"main-0": (True, ["stories260K"]), "main-1": (True, ["stories260K"])}, replicas
        client = openai.OpenAI(base_url=up.router + "/v1", api_key=KEY, max_retries=0)
        c = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=4, temperature=0)
        assert c.usage.completion_tokens == 4
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=up.router + "/v1", api_key="wrong", max_retries=0).completions.create(
                model="stories260K", prompt="Once", max_tokens=2)
        r = httpx.post(up.router + "/v1/completions", json={"model": "stories260K", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    finally:
        up.proc.send_signal(signal.SIGINT)         # Ctrl-C: everything stops, exit 0
        assert up.proc.wait(90) == 0
