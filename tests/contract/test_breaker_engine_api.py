"""Breaker regressions: bad input that used to crash or mislead the engine's HTTP API.

Each test is one attack found by driving a real ``inferctl engine serve`` (stories260K) with
malformed requests; here it runs in-process (ASGI) over the real model. After every attack the
answer must be a 4xx OpenAI error naming the field (never a 500), ``/health`` must stay 200
and a normal greedy request must still give the reference text.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.server_helpers import (  # noqa: F401 - stories_*_fixture are the engine and app fixtures
    REFERENCE,
    STORIES,
    auth,
    client,
    demo_engine,
    engines_running,
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


def _error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    err = strict_json(r.text)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def _still_serving(app) -> None:
    assert http_get(app, "/health").status_code == 200
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text
    text = strict_json(r.text)["choices"][0]["text"]
    assert len(text) > 20 and REFERENCE.startswith(text)


# --------------------------------------------------------------------------- JSON body


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_integer_literal_past_python_digit_limit_is_400_not_500(app, path):
    # json.loads raises a plain ValueError (not JSONDecodeError) for a 5000-digit integer
    body = b'{"prompt": "hi", "messages": [], "max_tokens": ' + b"9" * 5000 + b"}"
    err = _error(http_post_bytes(app, path, body), 400)
    assert err["code"] == "invalid_json"
    assert "4300 digits" in err["message"]  # the limit is named
    _still_serving(app)


@pytest.mark.parametrize("path,body,param", [
    # echo sends the prompt back: a lone surrogate cannot be encoded as UTF-8
    ("/v1/completions", '{"prompt": "Once \\ud800 upon", "max_tokens": 2, "echo": true}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "bad \\udfff"], "max_tokens": 2}', "prompt[1]"),
    ("/v1/completions", '{"prompt": "Once", "max_tokens": 2, "stop": ["a", "\\ud83d"]}', "stop[1]"),
    # these were echoed inside the 400 message itself, which then failed to render (500)
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "\\ud800"}]}]}',
     "messages[0].content[0].type"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "\\ud800"}}',
     "response_format.type"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi", "\\ud800": 1}]}', "messages[0]"),
])
def test_unpaired_surrogate_is_400_naming_the_field(app, path, body, param):
    err = _error(http_post_bytes(app, path, body.encode()), 400)
    assert err["param"] == param
    assert err["code"] == "invalid_unicode"
    assert err["message"].startswith(param)


def test_unpaired_surrogate_in_a_stream_is_400_before_the_stream(app):
    body = b'{"prompt": "Once \\ud800 upon", "max_tokens": 2, "echo": true, "stream": true}'
    r = http_post_bytes(app, "/v1/completions", body)
    assert r.headers["content-type"].startswith("application/json")
    assert _error(r, 400)["param"] == "prompt"
    _still_serving(app)


def test_a_valid_surrogate_pair_is_text_not_an_error(app):
    # "\ud83d\ude00" is the JSON spelling of one emoji: valid, echoed back as that character
    r = http_post_bytes(app, "/v1/completions", b'{"prompt": "Once \\ud83d\\ude00", "max_tokens": 1, "echo": true}')
    assert r.status_code == 200, r.text
    assert strict_json(r.text)["choices"][0]["text"].startswith("Once \U0001F600")


# --------------------------------------------------------------------------- sampling


def test_top_p_that_underflows_float32_samples_the_top_token_and_spares_the_batch(app):
    """top_p=1e-300 is > 0 (valid) but is 0.0 in float32: the nucleus kept no token, the draw
    indexed past the row and the step failed with a 500 for *every* request in the batch."""
    async def go():
        async with client(app) as c:
            tiny = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 24, "temperature": 1.0,
                                                   "top_p": 1e-300, "seed": 7})
            greedy = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
            stream = c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, "temperature": 0.7,
                "top_p": 1e-46, "stream": True})
            return await asyncio.gather(tiny, greedy, stream)

    tiny, greedy, stream = run(go())
    assert tiny.status_code == 200 and greedy.status_code == 200 and stream.status_code == 200
    greedy_text = strict_json(greedy.text)["choices"][0]["text"]
    assert len(greedy_text) > 20 and REFERENCE.startswith(greedy_text)
    # a nucleus of one token is the argmax: the same text as greedy decoding
    assert strict_json(tiny.text)["choices"][0]["text"] == greedy_text
    events = sse_events(stream.text)
    assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
    assert streamed == greedy_text


# --------------------------------------------------------------------------- validation messages


def test_seed_out_of_range_names_the_exact_64_bit_bound(app):
    err = _error(http_post(app, "/v1/completions", {"prompt": PROMPT, "seed": 2**64}), 400)
    assert err["param"] == "seed"
    # pydantic's Field(le=2**64-1) printed the bound as a float: 18446744073709552000
    assert "18446744073709551615" in err["message"] and "-9223372036854775808" in err["message"]
    assert "18446744073709552000" not in err["message"]
    r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "seed": 2**64 - 1, "temperature": 1})
    assert r.status_code == 200, r.text


def test_content_part_that_is_not_an_object_shows_the_expected_shape(app):
    body = {"messages": [{"role": "user", "content": ["hi"]}]}
    err = _error(http_post(app, "/v1/chat/completions", body), 400)
    assert err["param"] == "messages[0].content"
    assert '{"type": "text", "text": "..."}' in err["message"] and "{{" not in err["message"]


# --------------------------------------------------------------------------- admin


@pytest.mark.parametrize("path,body,field", [
    ("/admin/precision", {"mode": "int8", "modle": "light"}, "modle"),
    ("/admin/fault", {"kind": "oom", "cnt": 5}, "cnt"),
    ("/admin/fault", {"prompt": "Once upon a time"}, "prompt"),
    ("/admin/drain", {"drain": True}, "drain"),
    ("/admin/route", {"model": STORIES, "target": "light"}, "target"),
])
def test_admin_body_with_an_unknown_field_is_400_and_changes_nothing(app, engine, path, body, field):
    before = engine.stats()
    err = _error(http_post(app, path, body, headers=auth()), 400)
    assert err["param"] == field and err["code"] == "extra_forbidden"
    after = engine.stats()
    assert after["engine"]["requested_precision"] == before["engine"]["requested_precision"] == "full"
    assert after["faults"]["pending_injected"] == before["faults"]["pending_injected"] == 0
    assert http_get(app, "/health").json()["status"] == "ok"
    assert http_get(app, "/admin/route", headers=auth()).json() == {"routes": {}}


def test_admin_route_to_an_unknown_model_names_the_to_field(engine):
    light = demo_engine("light")
    with engines_running(light):
        app = make_app({STORIES: engine, "light": light})
        err = _error(http_post(app, "/admin/route", {"model": STORIES, "to": "nope"}, headers=auth()), 404)
        assert err["param"] == "to" and err["code"] == "model_not_found"
        assert "'nope'" in err["message"] and "light" in err["message"]
        err = _error(http_post(app, "/admin/route", {"model": "nope", "to": "light"}, headers=auth()), 404)
        assert err["param"] == "model"
        assert http_get(app, "/admin/route", headers=auth()).json() == {"routes": {}}
        assert http_get(app, "/health").json()["status"] == "ok"
