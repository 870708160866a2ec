"""POST /tokenize and /detokenize (vLLM's tokenizer API) on the engine server, over stories260K."""

from __future__ import annotations

import pytest

from tests.server_helpers import (ADMIN_TOKEN, STORIES, demo_engine, engines_running, http_get, http_post,
                            http_post_bytes, make_app, stories_app_fixture, stories_engine_fixture)

engine = stories_engine_fixture
app = stories_app_fixture

TEXT = "Once upon a time, there was a little girl named Lily."


def _err(r, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_tokenize_matches_the_tokenizer_and_what_completions_feed(app, engine):
    tok = engine.engine.tokenizer
    r = http_post(app, "/tokenize", {"model": STORIES, "prompt": TEXT})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["tokens"] == tok.encode(TEXT, bos=True) and doc["tokens"][0] == tok.bos_id
    assert doc["count"] == len(doc["tokens"]) > 10
    assert doc["max_model_len"] == engine.engine.config.max_model_len == 512
    assert "token_strs" not in doc
    # no special tokens: the same ids without BOS (what inferctl longtext detects BOS with)
    plain = http_post(app, "/tokenize", {"prompt": TEXT, "add_special_tokens": False}).json()
    assert plain["tokens"] == doc["tokens"][1:] and plain["count"] == doc["count"] - 1
    # the count is what a completions request with the same text is billed for
    comp = http_post(app, "/v1/completions", {"prompt": TEXT, "max_tokens": 1}).json()
    assert comp["usage"]["prompt_tokens"] == doc["count"]
    # token texts, joined, give the text back (the first piece keeps its dummy-prefix space)
    strs = http_post(app, "/tokenize", {"prompt": TEXT, "return_token_strs": True,
                                        "add_special_tokens": False}).json()["token_strs"]
    assert len(strs) == plain["count"] and "".join(strs).strip() == TEXT
    # unknown fields are ignored, as on the completions route
    assert http_post(app, "/tokenize", {"prompt": TEXT, "add_generation_prompt": True}).json() == doc
    # an empty prompt is just BOS (tokenizing is not generating)
    assert http_post(app, "/tokenize", {"prompt": ""}).json()["tokens"] == [tok.bos_id]


def test_tokenize_chat_messages_like_the_chat_route(app, engine):
    msgs = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Once upon a time"}]
    doc = http_post(app, "/tokenize", {"messages": msgs}).json()
    assert doc["tokens"] == engine.engine.tokenizer.encode("Be kind.\nOnce upon a time", bos=True)
    chat = http_post(app, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == doc["count"]


def test_tokenize_errors_name_the_field(app):
    err = _err(http_post(app, "/tokenize", {"model": "nope", "prompt": "a"}), 404)
    assert (err["param"], err["code"]) == ("model", "model_not_found") and STORIES in err["message"]
    err = _err(http_post(app, "/tokenize", {"model": STORIES}), 400)
    assert err["param"] == "prompt" and "messages" in err["message"]
    err = _err(http_post(app, "/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}), 400)
    assert err["param"] == "messages"
    err = _err(http_post(app, "/tokenize", {"prompt": [1, 2, 3]}), 400)
    assert err["param"] == "prompt"
    err = _err(http_post(app, "/tokenize", {"prompt": "a", "add_special_tokens": "yes"}), 400)
    assert err["param"] == "add_special_tokens"
    err = _err(http_post(app, "/tokenize", {"messages": [{"role": "robot", "content": "b"}]}), 400)
    assert err["param"] == "messages[0].role"
    err = _err(http_post_bytes(app, "/tokenize", b'{"prompt": "a"'), 400)
    assert err["code"] == "invalid_json"
    err = _err(http_post_bytes(app, "/tokenize", b'{"prompt": "\\ud800"}'), 400)
    assert (err["param"], err["code"]) == ("prompt", "invalid_unicode")
    err = _err(http_post(app, "/tokenize", ["a"]), 400)
    assert "JSON object" in err["message"]


def test_tokenize_body_limit_is_a_413(engine):
    small = make_app({STORIES: engine}, max_body_bytes=200)
    assert http_post(small, "/tokenize", {"prompt": "a" * 150}).status_code == 200
    err = _err(http_post(small, "/tokenize", {"prompt": "a" * 250}), 413)
    assert err["code"] == "request_too_large" and "200" in err["message"]
    err = _err(http_post(small, "/detokenize", {"tokens": [1] * 200}), 413)


def test_detokenize_round_trip_and_vocabulary_check(app, engine):
    ids = http_post(app, "/tokenize", {"prompt": TEXT}).json()["tokens"]
    r = http_post(app, "/detokenize", {"model": STORIES, "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": TEXT}
    assert http_post(app, "/detokenize", {"tokens": []}).json() == {"prompt": ""}
    vocab = engine.engine.args.vocab_size
    err = _err(http_post(app, "/detokenize", {"tokens": [1, 2, vocab]}), 400)
    assert (err["param"], err["code"]) == ("tokens[2]", "invalid_token_id") and str(vocab) in err["message"]
    err = _err(http_post(app, "/detokenize", {"tokens": [-1]}), 400)
    assert err["param"] == "tokens[0]"
    err = _err(http_post(app, "/detokenize", {"tokens": [1, "2"]}), 400)
    assert err["param"] == "tokens[1]"
    err = _err(http_post(app, "/detokenize", {"tokens": [1, 2.5]}), 400)
    assert err["param"] == "tokens[1]"
    err = _err(http_post(app, "/detokenize", {}), 400)
    assert err["param"] == "tokens"
    err = _err(http_post(app, "/detokenize", {"model": "nope", "tokens": [1]}), 404)
    assert err["code"] == "model_not_found"


def test_model_cards_carry_max_model_len(app, engine):
    cards = http_get(app, "/v1/models").json()["data"]
    assert [(c["id"], c["max_model_len"]) for c in cards] == [(STORIES, engine.engine.config.max_model_len)]


@pytest.mark.parametrize("route", ["/tokenize", "/detokenize"])
def test_tokenizer_routes_follow_the_model_route_and_ignore_drain(engine, route):
    light = demo_engine("light", max_model_len=256)
    with engines_running(light):
        two = make_app({STORIES: engine, "light": light})
        body = {"model": STORIES, "prompt": "Hi"} if route == "/tokenize" else {"model": STORIES, "tokens": [1, 300]}
        before = http_post(two, route, body).json()
        hdr = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert http_post(two, "/admin/route", {"model": STORIES, "to": "light"}, headers=hdr).status_code == 200
        routed_r = http_post(two, route, body)
        routed = routed_r.json()
        assert http_post(two, "/admin/drain", {"draining": True}, headers=hdr).status_code == 200
        drained = http_post(two, route, body)
    lt = light.engine.tokenizer
    if route == "/tokenize":
        assert before["tokens"] == engine.engine.tokenizer.encode("Hi", bos=True)
        assert routed["tokens"] == lt.encode("Hi", bos=True) and routed["max_model_len"] == 256
        assert routed["tokens"] != before["tokens"]
        assert drained.status_code == 200 and drained.json() == routed
    else:
        # id 300 is a stories260K piece; the light model (bytes, 259 ids) has no such id
        assert before["prompt"] == engine.engine.tokenizer.decode([1, 300]) != ""
        err = _err(routed_r, 400)
        assert err["param"] == "tokens[1]" and "259 tokens" in err["message"]
        assert drained.status_code == 400 and drained.json() == routed
