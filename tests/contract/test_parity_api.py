"""What vLLM users expect of the API, with the official ``openai`` client over the ASGI
transport: ``n`` choices (and ``best_of`` refused), the ``--api-key`` guard of ``/v1``, and the
server-wide ``--repetition-stop`` default."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server_helpers import (STORIES, engines_running, http_get, http_post, make_app, run, sse_events,
                                  stories_engine)

KEY = "sk-test-parity-key"
PROMPT = "Once upon a time"


def oai(app, api_key: str = "unused") -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine.test")
    return openai.AsyncOpenAI(base_url="http://engine.test/v1", api_key=api_key, http_client=http, max_retries=0)


def test_n_choices_with_the_openai_client(engine):
    app = make_app({STORIES: engine})

    async def go():
        c = oai(app)
        comp = await c.completions.create(model=STORIES, prompt=PROMPT, n=3, max_tokens=12, temperature=1.0, seed=3)
        chat = await c.chat.completions.create(model=STORIES, messages=[{"role": "user", "content": PROMPT}],
                                               n=2, max_tokens=12, temperature=0.0)
        return comp, chat

    comp, chat = run(go())
    assert [ch.index for ch in comp.choices] == [0, 1, 2]
    assert len({ch.text for ch in comp.choices}) > 1            # seeds seed, seed+1, seed+2: different samples
    assert comp.usage.completion_tokens == 36 and comp.usage.prompt_tokens == 5
    assert [ch.index for ch in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content   # greedy: identical
    assert chat.usage.completion_tokens == 2 * 12


def test_n_is_reproducible_and_streams_each_index(engine):
    app = make_app({STORIES: engine})
    body = {"prompt": [PROMPT, "The dog"], "n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 11}
    a, b = http_post(app, "/v1/completions", body).json(), http_post(app, "/v1/completions", body).json()
    assert [c["index"] for c in a["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"] < 20   # each prompt counted once
    r = http_post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "n": 2,
                                                "max_tokens": 6, "stream": True})
    events = [e for e in sse_events(r.text) if isinstance(e, dict)]
    finished = sorted(c["index"] for e in events for c in e["choices"] if c["finish_reason"])
    assert finished == [0, 1]
    roles = sorted(c["index"] for e in events for c in e["choices"] if c["delta"].get("role"))
    assert roles == [0, 1]


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/completions", {"prompt": PROMPT, "n": 17}, "n", "between 1 and 16"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n", "between 1 and 16"),
    ("/v1/completions", {"prompt": PROMPT, "best_of": 2}, "best_of", "best_of=1"),
    # chat too: an ignored best_of would silently answer something other than what was asked
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "best_of": 2}, "best_of",
     "best_of=1"),
])
def test_n_limit_and_best_of_are_clear_400s(engine, path, body, param, words):
    r = http_post(make_app({STORIES: engine}), path, body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"]


def test_api_key_guards_v1_only(engine):
    app = make_app({STORIES: engine}, api_key=KEY)
    body = {"prompt": PROMPT, "max_tokens": 2}
    missing = http_post(app, "/v1/completions", body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert missing.json()["error"]["type"] == "invalid_request_error"
    wrong = http_post(app, "/v1/completions", body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "incorrect" in wrong.json()["error"]["message"]
    assert http_get(app, "/v1/models").status_code == 401
    ok = http_post(app, "/v1/completions", body, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"]
    for path in ("/health", "/ready", "/metrics", "/stats"):
        assert http_get(app, path).status_code == 200, path

    async def client_calls():
        good = await oai(app, KEY).completions.create(model=STORIES, prompt=PROMPT, max_tokens=3)
        with pytest.raises(openai.AuthenticationError):
            await oai(app, "bad-key").completions.create(model=STORIES, prompt=PROMPT, max_tokens=3)
        return good

    assert run(client_calls()).choices[0].text
    assert http_post(make_app({STORIES: engine}), "/v1/completions", body).status_code == 200   # no key: open


def test_repetition_stop_server_default_and_request_override(stories_dir):
    # stories260K loops on this prompt with a long greedy continuation
    body = {"prompt": "Lily and Ben", "max_tokens": 400, "temperature": 0.0}
    eng = stories_engine(stories_dir, repetition_stop_default=True)
    plain = stories_engine(stories_dir, name="plain")
    with engines_running(eng, plain):
        app = make_app({STORIES: eng})
        default = http_post(app, "/v1/completions", body).json()["choices"][0]
        off = http_post(app, "/v1/completions", {**body, "repetition_stop": False}).json()["choices"][0]
        base = http_post(make_app({"plain": plain}), "/v1/completions", body).json()["choices"][0]
        on = http_post(make_app({"plain": plain}), "/v1/completions",
                       {**body, "repetition_stop": True}).json()["choices"][0]
    assert default["finish_reason"] == "repetition"
    assert off["finish_reason"] == base["finish_reason"] == "length"
    assert on["finish_reason"] == "repetition"
