"""The OpenAI-compatible API over the real stories260K engine, in-process (ASGI).

Field cases F15 (max_tokens 0 with echo+logprobs), F16 (odd max_tokens), F17 (empty prompts),
the bad-input table, streaming, stop strings, logprobs, batch prompts, token-id prompts.
"""

from __future__ import annotations

import math
import re

import pytest
from pydantic import BaseModel

from inferctl.contract.openai import ChatCompletionChunk, ChatCompletionResponse, CompletionResponse
from tests.server_helpers import (  # noqa: F401 - stories_*_fixture are the engine and app fixtures
    REFERENCE,
    STORIES,
    client,
    http_get,
    http_post,
    http_post_bytes,
    make_app,
    run,
    sse_events,
    stories_app_fixture,
    stories_engine_fixture,
    strict_json,
)

PROMPT = "Once upon a time"


def _health_ok(app) -> dict:
    r = http_get(app, "/health")
    assert r.status_code == 200
    return r.json()


def _stream_chunks(r, obj: str, schema: type[BaseModel]) -> list[dict]:
    """The data chunks of an SSE answer, checked: it ends with ``[DONE]`` and every chunk is an
    ``obj`` object that validates against ``schema``."""
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == obj for c in chunks)
    for c in chunks:
        schema.model_validate(c)
    return chunks


def _completion(app, **body):
    body.setdefault("prompt", PROMPT)
    body.setdefault("temperature", 0)
    r = http_post(app, "/v1/completions", body)
    assert r.status_code == 200, r.text
    return strict_json(r.text)


# ------------------------------------------------------------------------- happy paths

def test_greedy_completion_is_the_llama2c_reference(app):
    doc = _completion(app, max_tokens=60)
    CompletionResponse.model_validate(doc)
    assert doc["object"] == "text_completion" and doc["model"] == STORIES
    assert doc["id"].startswith("cmpl-")
    choice = doc["choices"][0]
    assert REFERENCE.startswith(choice["text"]) or choice["text"].startswith(REFERENCE)
    assert choice["text"][:100] == REFERENCE[:100]
    assert choice["finish_reason"] in ("length", "stop")
    assert doc["usage"]["prompt_tokens"] == 5  # BOS + 4 tokens of "Once upon a time"
    assert doc["usage"]["total_tokens"] == doc["usage"]["prompt_tokens"] + doc["usage"]["completion_tokens"]


def test_streaming_equals_non_streaming_with_usage(app):
    plain = _completion(app, max_tokens=30)["choices"][0]["text"]
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "temperature": 0, "max_tokens": 30, "stream": True,
                                       "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = _stream_chunks(r, "text_completion", CompletionResponse)
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == plain
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finals[-1] == "length" and all(f is None for f in finals[:-1])
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 30,
                                                         "total_tokens": 35}


def test_chat_equals_completion_for_plain_template(app):
    plain = _completion(app, max_tokens=25)["choices"][0]["text"]
    r = http_post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                            "temperature": 0, "max_completion_tokens": 25})
    assert r.status_code == 200, r.text
    doc = strict_json(r.text)
    ChatCompletionResponse.model_validate(doc)
    assert doc["object"] == "chat.completion" and doc["id"].startswith("chatcmpl-")
    assert doc["choices"][0]["message"] == {"role": "assistant", "content": plain}
    assert doc["usage"]["completion_tokens"] == 25


def test_chat_streaming(app):
    plain = _completion(app, max_tokens=20)["choices"][0]["text"]
    r = http_post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
                                            "max_tokens": 20, "stream": True,
                                            "stream_options": {"include_usage": True}})
    chunks = _stream_chunks(r, "chat.completion.chunk", ChatCompletionChunk)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == plain
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 20 and chunks[-1]["choices"] == []


def test_chat_default_max_tokens_fills_the_context(app):
    # No max_tokens in chat: the rest of the context (512 - 5 prompt tokens), unless EOS first.
    r = http_post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                            "temperature": 0, "ignore_eos": True})
    doc = strict_json(r.text)
    assert doc["usage"]["completion_tokens"] == 512 - 5
    assert doc["choices"][0]["finish_reason"] == "length"


def test_stop_string_is_never_leaked(app):
    for stream in (False, True):
        r = http_post(app, "/v1/completions", {"prompt": PROMPT, "temperature": 0, "max_tokens": 40,
                                           "stop": [" girl"], "stream": stream})
        if stream:
            events = sse_events(r.text)
            text = "".join(c["choices"][0]["text"] for c in events[:-1])
            finish = events[-2]["choices"][0]["finish_reason"]
        else:
            choice = strict_json(r.text)["choices"][0]
            text, finish = choice["text"], choice["finish_reason"]
        assert text == ", there was a little"
        assert finish == "stop"


def test_completion_logprobs_and_echo(app):
    doc = _completion(app, max_tokens=8, logprobs=3, echo=True)
    choice = doc["choices"][0]
    assert choice["text"].startswith(PROMPT + ", there was")
    lp = choice["logprobs"]
    n = doc["usage"]["completion_tokens"]
    assert n == 8
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert "".join(lp["tokens"]) == choice["text"][len(PROMPT):]
    assert lp["text_offset"][0] == len(PROMPT)
    for chosen, token, top in zip(lp["token_logprobs"], lp["tokens"], lp["top_logprobs"]):
        assert chosen is not None and chosen <= 0.0 and math.isfinite(chosen)
        assert len(top) == 3
        # greedy: the chosen token is the most likely one
        assert max(top.values()) == pytest.approx(chosen, abs=1e-5)
        assert top[token] == pytest.approx(chosen, abs=1e-5)


def test_chat_logprobs(app):
    r = http_post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
                                            "max_tokens": 5, "logprobs": True, "top_logprobs": 2})
    doc = strict_json(r.text)
    ChatCompletionResponse.model_validate(doc)
    content = doc["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    assert "".join(t["token"] for t in content) == doc["choices"][0]["message"]["content"]
    for t in content:
        assert len(t["top_logprobs"]) == 2
        assert max(x["logprob"] for x in t["top_logprobs"]) == pytest.approx(t["logprob"], abs=1e-5)
        assert bytes(t["bytes"]).decode() == t["token"]


def test_batch_and_token_id_prompts(app, engine):
    single = _completion(app, max_tokens=12)["choices"][0]["text"]
    ids = engine.engine.tokenizer.encode(PROMPT, bos=True)
    doc = _completion(app, prompt=[PROMPT, "Lily went"], max_tokens=12)
    assert [c["index"] for c in doc["choices"]] == [0, 1]
    assert doc["choices"][0]["text"] == single
    assert doc["choices"][1]["text"] != single
    assert doc["usage"]["completion_tokens"] == 24
    by_ids = _completion(app, prompt=ids, max_tokens=12)
    assert by_ids["choices"][0]["text"] == single
    # batch streaming: both indices appear, each text equals its non-streamed text
    r = http_post(app, "/v1/completions", {"prompt": [PROMPT, "Lily went"], "temperature": 0, "max_tokens": 12,
                                       "stream": True})
    events = sse_events(r.text)[:-1]
    texts = {0: "", 1: ""}
    for c in events:
        texts[c["choices"][0]["index"]] += c["choices"][0]["text"]
    assert texts == {0: doc["choices"][0]["text"], 1: doc["choices"][1]["text"]}


def test_seeded_sampling_is_reproducible(app):
    a = _completion(app, max_tokens=20, temperature=1.0, seed=42)["choices"][0]["text"]
    b = _completion(app, max_tokens=20, temperature=1.0, seed=42)["choices"][0]["text"]
    c = _completion(app, max_tokens=20, temperature=1.0, seed=43)["choices"][0]["text"]
    assert a == b
    assert a != c


def test_models_stats_metrics(app):
    async def go():
        async with client(app) as c:
            return await c.get("/v1/models"), await c.get("/stats"), await c.get("/metrics")
    models, stats, metrics = run(go())
    assert [m["id"] for m in models.json()["data"]] == [STORIES]
    assert models.json()["data"][0]["max_model_len"] == 512
    doc = strict_json(stats.text)
    assert doc["engine"]["model"] == STORIES and doc["engine"]["models"] == [STORIES]
    assert doc["kv_cache"]["blocks_used"] == 0
    assert doc["requests"]["finished_total"] >= 1
    assert metrics.headers["content-type"].startswith("text/plain")
    assert f'inferctl_engine_requests_total{{finish_reason="length",model="{STORIES}"}}' in metrics.text


# ------------------------------------------------------------------------- F15, F16, F17

F16_VALUES = [-186, -1, 0, "20", 1e12, 20.5, True]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("value", F16_VALUES)
def test_f16_odd_max_tokens_completions(app, value, stream):
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": value, "stream": stream})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = strict_json(r.text)["error"]
    assert err["param"] == "max_tokens" and err["type"] == "invalid_request_error"
    assert "max_tokens" in err["message"]
    if value == 1e12:
        assert "507 = max_model_len 512 - prompt 5" in err["message"]
    elif isinstance(value, int) and not isinstance(value, bool):
        assert "greater than or equal to 1" in err["message"]
    assert _health_ok(app)["status"] == "ok"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [-186, -1, 0, "20", 1e12])
def test_f16_odd_max_tokens_chat(app, field, value):
    for stream in (False, True):
        r = http_post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                field: value, "stream": stream})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field
        if value == 1e12:
            assert "507" in err["message"] and "512" in err["message"]


def test_f16_limit_value_is_accepted(app):
    doc = _completion(app, max_tokens=507, ignore_eos=True)
    assert doc["usage"]["completion_tokens"] == 507
    assert http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 508}).status_code == 400


@pytest.mark.parametrize("stream", [False, True])
def test_f15_max_tokens_zero_with_echo_and_logprobs(app, stream):
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1,
                                       "stream": stream})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"
    # the engine is alive and the next request succeeds
    assert _completion(app, max_tokens=3)["usage"]["completion_tokens"] == 3
    assert _health_ok(app)["status"] == "ok"


@pytest.mark.parametrize("route, body", [
    ("/v1/completions", {"prompt": ""}),
    ("/v1/completions", {"prompt": [""]}),
    ("/v1/completions", {"prompt": []}),
    ("/v1/completions", {"prompt": [[]]}),
    ("/v1/completions", {"prompt": "", "stream": True}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [], "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}),
])
def test_f17_empty_prompts(app, engine, route, body):
    before = engine.stats()["requests"]["finished_total"]
    r = http_post(app, route, body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] in ("prompt", "messages")
    assert "empty" in err["message"] or "at least one message" in err["message"]
    assert engine.stats()["requests"]["finished_total"] == before  # the engine never saw it
    assert _completion(app, max_tokens=2)["usage"]["completion_tokens"] == 2


# ------------------------------------------------------------------------- bad input table

BAD_INPUTS = [
    # (route, body, status, param)
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": 2.1}, 400, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": PROMPT, "top_p": 1.01}, 400, "top_p"),
    ("/v1/completions", {"prompt": PROMPT, "top_k": -5}, 400, "top_k"),
    ("/v1/completions", {"prompt": PROMPT, "top_k": "5"}, 400, "top_k"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 6}, 400, "logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": "1"}, 400, "logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "n": 17}, 400, "n"),
    ("/v1/completions", {"prompt": PROMPT, "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": PROMPT, "echo": 1}, 400, "echo"),
    ("/v1/completions", {"prompt": PROMPT, "stop": 7}, 400, "stop"),
    ("/v1/completions", {"prompt": PROMPT, "stop": ["s"] * 17}, 400, "stop"),
    ("/v1/completions", {"prompt": PROMPT, "seed": "1"}, 400, "seed"),
    ("/v1/completions", {"prompt": PROMPT, "seed": 2**64}, 400, "seed"),
    ("/v1/completions", {"prompt": PROMPT, "repetition_penalty": -1}, 400, "repetition_penalty"),
    ("/v1/completions", {"prompt": PROMPT, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": PROMPT, "frequency_penalty": "0"}, 400, "frequency_penalty"),
    ("/v1/completions", {"prompt": PROMPT, "user": 1}, 400, "user"),
    ("/v1/completions", {"prompt": PROMPT, "ignore_eos": "true"}, 400, "ignore_eos"),
    ("/v1/completions", {"prompt": PROMPT, "repetition_stop": 1}, 400, "repetition_stop"),
    ("/v1/completions", {"prompt": PROMPT, "stop_token_ids": [99999]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": [1, 2, 512]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "story " * 600}, 400, "prompt"),
    ("/v1/completions", {"prompt": PROMPT, "model": "no-such-model"}, 404, "model"),
    ("/v1/completions", {"prompt": PROMPT, "model": 3}, 400, "model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "n": 0}, 400, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": PROMPT}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "temperature": -1}, 400,
     "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "top_logprobs": 3}, 400,
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "story " * 500}]}, 400, "prompt"),
]


@pytest.mark.parametrize("route, body, status, param", BAD_INPUTS,
                         ids=[f"{i}-{p}" for i, (_, _, _, p) in enumerate(BAD_INPUTS)])
def test_bad_input_table(app, route, body, status, param):
    for stream in (False, True):
        r = http_post(app, route, {**body, "stream": body.get("stream", stream)})
        assert r.status_code == status, r.text
        err = strict_json(r.text)["error"]
        assert err["type"] == "invalid_request_error"
        assert err["param"] == param, err
        assert param.split("[")[0].split(".")[0] in err["message"] or status == 404
        assert _health_ok(app)["status"] == "ok"


def test_unknown_model_is_404_model_not_found(app):
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "model": "m-123"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert STORIES in r.json()["error"]["message"]


def test_prompt_too_long_names_numbers(app):
    r = http_post(app, "/v1/completions", {"prompt": "story " * 500})
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert "max_model_len is 512" in err["message"] and "at most 511" in err["message"]


@pytest.mark.parametrize("raw, words", [
    (b'{"prompt": "x",', "not valid JSON"),
    (b"", "empty"),
    (b'["prompt"]', "JSON object"),
    (b"\xff\xfe", "not UTF-8"),
    (b'{"prompt": "x", "temperature": NaN}', "finite"),
])
def test_malformed_bodies_are_400(app, raw, words):
    r = http_post_bytes(app, "/v1/completions", raw)
    assert r.status_code == 400
    assert words in r.json()["error"]["message"]
    assert _health_ok(app)["status"] == "ok"


def test_body_size_limit_is_413(engine):
    small = make_app({STORIES: engine}, max_body_bytes=1024)
    r = http_post(small, "/v1/completions", {"prompt": "x" * 2000})
    assert r.status_code == 413
    assert "1024 bytes" in r.json()["error"]["message"]
    assert http_post(small, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_x_request_id_is_echoed_not_used_as_label(app):
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}, headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    assert r.json()["id"] != "abc-123"


@pytest.mark.parametrize("given", [None, "", "has space", "x" * 201, "caf\u00e9".encode("latin-1")],
                         ids=["absent", "empty", "space", "too-long", "non-ascii"])
def test_x_request_id_follows_the_routers_rule(app, given):
    """Same rule as the router (contract/http.py ``request_id``): an id that is not 1..200
    visible ASCII characters is replaced by a new one, and every answer carries one."""
    headers = {} if given is None else {"x-request-id": given}
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}, headers=headers)
    rid = r.headers["x-request-id"]
    assert rid != given and re.fullmatch("[0-9a-f]{32}", rid)
    assert http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2},
                     headers={"x-request-id": "x" * 200}).headers["x-request-id"] == "x" * 200


def test_fastapi_validation_errors_use_the_openai_shape(app):
    # unknown route and method: still the OpenAI error object, never FastAPI's {"detail": ...}
    async def go():
        async with client(app) as c:
            return await c.get("/v1/completions"), await c.get("/v1/nothing")
    method, missing = run(go())
    assert method.status_code == 405 and "error" in method.json()
    assert missing.status_code == 404 and "error" in missing.json()


class _CountBody(BaseModel):
    count: int


def test_request_validation_error_handler_gives_400_openai_shape(engine):
    # Routes declared with a pydantic body (FastAPI's own validation) get the same 400 shape.
    app = make_app({STORIES: engine})

    @app.post("/test-only")
    async def _route(body: _CountBody) -> dict:
        return {"count": body.count}

    async def go():
        async with client(app) as c:
            return (await c.post("/test-only", json={"count": "many"}),
                    await c.post("/test-only", content=b"{oops", headers={"content-type": "application/json"}),
                    await c.post("/test-only", json={"count": 3}))
    bad_type, bad_json, good = run(go())
    for r in (bad_type, bad_json):
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "detail" not in r.json()
    assert bad_type.json()["error"]["param"] == "count"
    assert good.json() == {"count": 3}
