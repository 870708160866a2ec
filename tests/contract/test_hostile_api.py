"""Hostile input against the real engine API in-process (stories260K, ASGI, no ports): bodies
not sent as JSON (415), the Host guard (421) with probes and scrapes still passing, huge
prompts refused before tokenizing, and clients that leave counted as aborts, kept out of the
latency histograms; the controller's API under the same rules."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.server_helpers import (STORIES, auth, client, http_get, http_post, make_app, run,
                                  stories_app_fixture, stories_engine_fixture)

app = stories_app_fixture
engine = stories_engine_fixture

MiB = 1024 * 1024


def post_raw(app_, path: str, content: bytes, headers: dict):
    async def go():
        async with client(app_) as c:
            return await c.post(path, content=content, headers=headers)
    return run(go())


# ------------------------------------------------------------------ 415
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None])
def test_post_routes_refuse_bodies_not_sent_as_json(app, path, ctype):
    body = json.dumps({"prompt": "Once upon a time", "messages": [{"role": "user", "content": "hi"}],
                       "tokens": [1, 2]}).encode()
    headers = {} if ctype is None else {"content-type": ctype}
    r = post_raw(app, path, body, headers)
    assert r.status_code == 415, r.text
    err = r.json()["error"]
    assert err["param"] == "Content-Type" and err["code"] == "unsupported_media_type"
    assert "application/json" in err["message"]


def test_admin_routes_refuse_text_plain(app):
    r = post_raw(app, "/admin/precision", b'{"mode": "int8"}', {"content-type": "text/plain", **auth()})
    assert r.status_code == 415
    r = http_post(app, "/admin/precision", {"mode": "full"}, headers=auth())
    assert r.status_code == 200, r.text


def test_json_with_charset_still_generates(app):
    r = post_raw(app, "/v1/completions", b'{"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}',
                 {"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


# ------------------------------------------------------------------ Host guard
def test_loopback_bound_app_refuses_foreign_host_and_serves_probes(engine):
    guarded = make_app({STORIES: engine}, bind_host="127.0.0.1")
    r = http_post(guarded, "/v1/completions", {"prompt": "Once", "max_tokens": 2},
                  headers={"host": "evil.example"})
    assert r.status_code == 421
    err = r.json()["error"]
    assert err["param"] == "Host" and "evil.example" in err["message"]
    for path in ("/health", "/metrics", "/stats"):
        assert http_get(guarded, path, headers={"host": "evil.example:8000"}).status_code == 421
        assert http_get(guarded, path, headers={"host": "127.0.0.1:8000"}).status_code == 200, path
        assert http_get(guarded, path, headers={"host": "localhost:8000"}).status_code == 200, path
    r = http_post(guarded, "/v1/completions", {"prompt": "Once", "max_tokens": 2}, headers={"host": "[::1]:8000"})
    assert r.status_code == 200


def test_allowed_host_is_accepted(engine):
    guarded = make_app({STORIES: engine}, bind_host="0.0.0.0", allowed_hosts=("llm.internal",))
    assert http_get(guarded, "/health", headers={"host": "llm.internal:8000"}).status_code == 200
    assert http_get(guarded, "/health", headers={"host": "10.0.0.7:8000"}).status_code == 200   # pod-IP probe
    assert http_get(guarded, "/health", headers={"host": "evil.example"}).status_code == 421


def test_controller_api_host_guard_and_415(tmp_path):
    from fastapi.testclient import TestClient

    from inferctl.controller.api import create_app
    from tests.controller_helpers import FakeClock, FakeEngineClient, make_controller

    token = "hostile-controller-token"
    fake = FakeEngineClient()
    ctl, _, _ = make_controller(tmp_path, {"main": fake}, clock=FakeClock())
    ctl.tick()
    http = TestClient(create_app(ctl, token, bind_host="127.0.0.1"), base_url="http://127.0.0.1:8900")
    bearer = {"Authorization": f"Bearer {token}"}
    assert http.get("/status").status_code == 200
    assert http.get("/metrics", headers={"host": "localhost:8900"}).status_code == 200
    r = http.get("/status", headers={"host": "evil.example:8900"})
    assert r.status_code == 421 and r.json()["error"]["field"] == "Host"
    r = http.post("/actions/drain", content=b'{"engine": "main"}', headers={**bearer, "content-type": "text/plain"})
    assert r.status_code == 415
    assert r.json()["error"] == {"code": "unsupported_media_type", "message": r.json()["error"]["message"],
                                 "field": "Content-Type"}
    assert fake.calls == []
    r = http.post("/actions/drain", json={"engine": "main"}, headers=bearer)
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------ size bound before tokenizing
class SpyTokenizer:
    """Wraps the real tokenizer and counts encode calls and their characters."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def encode(self, text, bos=True):
        self.calls.append(len(text))
        return self.inner.encode(text, bos=bos)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def big_app(engine):
    a = make_app({STORIES: engine}, max_body_bytes=8 * MiB)
    served = a.state.server.models[STORIES]
    served.tokenizer = SpyTokenizer(served.tokenizer)
    return a, served


def test_five_megabyte_prompts_are_refused_without_tokenizing(big_app):
    a, served = big_app
    limit = served.max_prompt_chars
    assert limit is not None and limit < 5 * MiB
    huge = "Once upon a time " * (5 * MiB // 17)
    cases = [("/v1/completions", {"prompt": huge}, "prompt"),
             ("/v1/completions", {"prompt": ["short", huge]}, "prompt[1]"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge[: len(huge) // 2]},
                                                    {"role": "user", "content": huge[len(huge) // 2:]}]}, "messages")]
    for path, body, param in cases:
        r = http_post(a, path, body)
        assert r.status_code == 400, (path, r.text[:300])
        err = r.json()["error"]
        assert err["param"] == param and str(limit) in err["message"], err
        assert f"{len(huge)} characters" in err["message"] or param == "messages"
    assert served.tokenizer.calls == []     # never tokenized


def test_a_prompt_at_the_bound_is_still_generated_from(big_app):
    a, served = big_app
    text = "a" * served.max_prompt_chars
    r = http_post(a, "/v1/completions", {"prompt": text, "max_tokens": 1})
    assert served.tokenizer.calls == [len(text)]          # tokenized: only then can its length be judged
    assert r.status_code == 400 and "max_model_len" in r.text   # 3,584 'a's are more tokens than the context


def test_tokenize_takes_a_text_longer_than_the_context(big_app):
    """Counting and cutting whole books is what /tokenize is for (long-text processing): a text
    of many contexts is tokenized, bounded only by the body limit."""
    a, served = big_app
    text = "Once upon a time there was a little girl. " * 400       # ~17,000 characters
    assert len(text) > served.max_prompt_chars
    r = http_post(a, "/tokenize", {"prompt": text})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["count"] > served.max_model_len and served.tokenizer.calls == [len(text)]


# ------------------------------------------------------------------ aborts
def _sample(served, name: str, labels: dict) -> float:
    return served.registry.get_sample_value(name, labels) or 0.0


def _counts(served) -> dict:
    m = {"model": STORIES}
    return {"ttft": _sample(served, "inferctl_engine_time_to_first_token_seconds_count", m),
            "itl": _sample(served, "inferctl_engine_inter_token_latency_seconds_count", m),
            "e2e": _sample(served, "inferctl_engine_e2e_request_latency_seconds_count", m),
            "abort": _sample(served, "inferctl_engine_requests_total", {**m, "finish_reason": "abort"}),
            "client": _sample(served, "inferctl_engine_request_aborts_total", {**m, "reason": "client_disconnect"})}


async def _asgi_call(app_, body: dict, disconnect_when) -> list:
    """Drive one POST /v1/completions through the raw ASGI interface; the client disconnects
    once ``disconnect_when(sent messages)`` is true."""
    sent: list = []
    body_sent = False

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        for _ in range(3000):
            if disconnect_when(sent):
                return {"type": "http.disconnect"}
            await asyncio.sleep(0.005)
        return {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
             "root_path": "", "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    await asyncio.wait_for(app_(scope, receive, send), 60)
    return sent


def _wait_idle(engine_) -> None:
    for _ in range(400):
        if not engine_.engine.has_unfinished_requests():
            return
        asyncio.run(asyncio.sleep(0.01))
    pytest.fail("the aborted request is still running")


def test_client_disconnect_is_an_abort_not_a_latency_sample(app, engine):
    served = app.state.server.models[STORIES]
    before = _counts(served)
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}

    # non-streaming: the client leaves once the engine has produced tokens for it
    def generating(_sent):
        return served.registry.get_sample_value("inferctl_engine_generation_tokens_total", {"model": STORIES}) \
            and engine.engine.has_unfinished_requests()

    sent = run(_asgi_call(app, body, generating))
    assert sent[0]["status"] == 499
    _wait_idle(engine)
    mid = _counts(served)
    assert mid["abort"] == before["abort"] + 1 and mid["client"] == before["client"] + 1
    assert (mid["ttft"], mid["itl"], mid["e2e"]) == (before["ttft"], before["itl"], before["e2e"])

    # streaming: the client leaves after the first chunk
    sent = run(_asgi_call(app, {**body, "stream": True},
                          lambda s: sum(1 for m in s if m.get("type") == "http.response.body" and m.get("body")) >= 2))
    assert sent[0]["status"] == 200
    _wait_idle(engine)
    after = _counts(served)
    assert after["abort"] == mid["abort"] + 1 and after["client"] == mid["client"] + 1
    assert (after["ttft"], after["itl"], after["e2e"]) == (before["ttft"], before["itl"], before["e2e"])
    stats = http_get(app, "/stats").json()["requests"]
    assert stats["aborted_total"] >= 2 and stats["by_finish_reason"]["abort"] == stats["aborted_total"]

    # a request that finishes is a latency sample (the histograms still work)
    r = http_post(app, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200
    done = _counts(served)
    assert done["ttft"] == after["ttft"] + 1 and done["e2e"] == after["e2e"] + 1
    assert done["itl"] == after["itl"] + 4
