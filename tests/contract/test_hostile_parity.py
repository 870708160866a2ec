"""Hostile bodies through the router and straight to the engine (stories260K, ASGI, no ports):
the same 4xx, the same error object naming the field, never a 5xx, and the router sends none of
them to a replica (it validates with the engine's request models, contract/openai.py); the
tokenizer routes (``/tokenize``, ``/detokenize``) likewise, with contract/tokenize.py."""

from __future__ import annotations

import json

import httpx
import pytest

from inferctl.router.app import create_app
from inferctl.router.config import EngineSpec, RouterConfig
from tests.server_helpers import STORIES, engines_running, make_app, run, stories_engine

J = {"content-type": "application/json"}
BASE = {"model": STORIES, "prompt": "Once upon a time", "max_tokens": 3}
CHAT = {"model": STORIES, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _j(doc: dict) -> bytes:
    return json.dumps(doc).encode()


#: (name, path, body, status, param): the engine's answer, which the router must repeat
CASES = [
    ("deep JSON", "/v1/completions", b'{"prompt": "a", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None),
    ("bad UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 2}', 400, None),
    ("Infinity", "/v1/completions", b'{"prompt": "a", "top_p": Infinity}', 400, "top_p"),
    ("1e400", "/v1/completions", b'{"prompt": "a", "temperature": 1e400}', 400, "temperature"),
    ("max_tokens 10^30", "/v1/completions", _j({**BASE, "max_tokens": 10 ** 30}), 400, "max_tokens"),
    ("max_tokens bool", "/v1/completions", _j({**BASE, "max_tokens": True}), 400, "max_tokens"),
    ("seed 2^70", "/v1/completions", _j({**BASE, "seed": 2 ** 70}), 400, "seed"),
    ("stop 10^4", "/v1/completions", _j({**BASE, "stop": ["x"] * 10_000}), 400, "stop"),
    ("stop 10^5 chars", "/v1/completions", _j({**BASE, "stop": "x" * 100_000}), 400, "stop"),
    ("stop_token_ids 10^5", "/v1/completions", _j({**BASE, "stop_token_ids": list(range(100_000))}), 400,
     "stop_token_ids"),
    ("stop_token_ids 10^30", "/v1/completions", _j({**BASE, "stop_token_ids": [10 ** 30]}), 400, "stop_token_ids"),
    ("logprobs 100", "/v1/completions", _j({**BASE, "logprobs": 100}), 400, "logprobs"),
    ("prompt_logprobs -1", "/v1/completions", _j({**BASE, "prompt_logprobs": -1}), 400, "prompt_logprobs"),
    ("n 1000", "/v1/completions", _j({**BASE, "n": 1000}), 400, "n"),
    ("token id 2^70", "/v1/completions", _j({**BASE, "prompt": [2 ** 70]}), 400, "prompt"),
    ("10^4 prompts", "/v1/completions", _j({**BASE, "prompt": ["a"] * 10_000}), 400, "prompt"),
    ("prompt 500k chars", "/v1/completions", _j({**BASE, "prompt": "Once " * 100_000}), 400, "prompt"),
    ("unknown model 100k", "/v1/completions", _j({**BASE, "model": "m" * 100_000}), 404, "model"),
    ("chat top_logprobs 50", "/v1/chat/completions", _j({**CHAT, "logprobs": True, "top_logprobs": 50}), 400,
     "top_logprobs"),
    ("chat top_logprobs without logprobs", "/v1/chat/completions", _j({**CHAT, "top_logprobs": 3}), 400,
     "top_logprobs"),
    ("chat role", "/v1/chat/completions", _j({**CHAT, "messages": [{"role": "r" * 10_000, "content": "x"}]}), 400,
     "messages[0].role"),
    ("chat 10^4 messages", "/v1/chat/completions",
     _j({**CHAT, "messages": [{"role": "user", "content": "hi"}] * 10_000}), 400, "messages"),
    ("chat n 0", "/v1/chat/completions", _j({**CHAT, "n": 0}), 400, "n"),
]


@pytest.fixture(scope="module")
def engine_app(stories_dir):
    eng = stories_engine(stories_dir)
    with engines_running(eng):
        yield make_app({STORIES: eng})


async def _both(engine_app, path: str, body: bytes, headers: dict) -> tuple[httpx.Response, httpx.Response, int]:
    posts = []

    class Recording(httpx.AsyncBaseTransport):
        inner = httpx.ASGITransport(app=engine_app)

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            posts.extend([request] if request.method == "POST" else [])
            return await self.inner.handle_async_request(request)

    client = httpx.AsyncClient(mounts={"http://a.test": Recording()}, timeout=60.0)
    router = create_app(RouterConfig(engines=(EngineSpec("a", "http://a.test"),)), client=client)
    await router.state.router.prober.round()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=router), base_url="http://r.test",
                                 timeout=60.0) as c:
        via = await c.post(path, content=body, headers=headers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=engine_app), base_url="http://e.test",
                                 timeout=60.0) as c:
        direct = await c.post(path, content=body, headers=headers)
    await client.aclose()
    return via, direct, len(posts)


@pytest.mark.parametrize("name, path, body, status, param", CASES, ids=[c[0] for c in CASES])
def test_router_and_engine_give_the_same_4xx_naming_the_field(engine_app, name, path, body, status, param):
    via, direct, posts = run(_both(engine_app, path, body, J))
    assert direct.status_code == status, direct.text[:300]
    err = direct.json()["error"]
    assert err["param"] == param and len(err["message"]) < 400
    assert via.status_code == direct.status_code and via.json() == direct.json()
    # the router refuses what its own models can tell; what needs the tokenizer or the served
    # models (prompt length, unknown model) is the engine's answer passed through unchanged
    assert posts <= 1


#: (name, path, body, status, param, router_refuses): the tokenizer routes' hostile bodies. The
#: router refuses what the contract models tell (no replica asked); token ids against the
#: vocabulary and an unknown model are the replica's answer passed through.
TOKENIZER_CASES = [
    ("no input", "/tokenize", _j({"model": STORIES}), 400, "prompt", True),
    ("prompt and messages", "/tokenize",
     _j({"prompt": "a", "messages": [{"role": "user", "content": "hi"}]}), 400, "messages", True),
    ("prompt a number", "/tokenize", _j({"prompt": 5}), 400, "prompt", True),
    ("bad UTF-8", "/tokenize", b'{"prompt": "\xff\xfe"}', 400, None, True),
    ("deep JSON", "/tokenize", b'{"prompt": "a", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None, True),
    ("chat role", "/tokenize", _j({"messages": [{"role": "r" * 10_000, "content": "x"}]}), 400,
     "messages[0].role", True),
    ("unknown model", "/tokenize", _j({"model": "m" * 1000, "prompt": "a"}), 404, "model", False),
    ("tokens a string", "/detokenize", _j({"tokens": "abc"}), 400, "tokens", True),
    ("token id 2^70", "/detokenize", _j({"tokens": [2 ** 70]}), 400, "tokens[0]", False),
    ("token id -1", "/detokenize", _j({"tokens": [1, -1]}), 400, "tokens[1]", False),
    ("token id past the vocabulary", "/detokenize", _j({"tokens": [10 ** 6]}), 400, "tokens[0]", False),
]


@pytest.mark.parametrize("name, path, body, status, param, router_refuses", TOKENIZER_CASES,
                         ids=[c[0] for c in TOKENIZER_CASES])
def test_the_tokenizer_routes_give_the_engines_4xx(engine_app, name, path, body, status, param, router_refuses):
    via, direct, posts = run(_both(engine_app, path, body, J))
    assert direct.status_code == status, direct.text[:300]
    assert direct.json()["error"]["param"] == param
    assert via.status_code == direct.status_code and via.json() == direct.json()
    assert posts == (0 if router_refuses else 1)


def test_the_tokenizer_routes_are_answered_alike(engine_app):
    tok = _j({"model": STORIES, "prompt": "Once upon a time", "return_token_strs": True})
    via, direct, posts = run(_both(engine_app, "/tokenize", tok, J))
    assert via.status_code == direct.status_code == 200 and posts == 1
    assert via.json() == direct.json() and via.json()["count"] == len(via.json()["tokens"]) > 1
    assert via.headers["x-inferctl-replica"] == "a"
    ids = via.json()["tokens"]
    back, direct_back, _ = run(_both(engine_app, "/detokenize", _j({"tokens": ids}), J))
    assert back.status_code == 200 and back.json() == direct_back.json()
    assert "Once upon a time" in back.json()["prompt"]
    chat = _j({"messages": [{"role": "user", "content": "hi"}]})
    via, direct, _ = run(_both(engine_app, "/tokenize", chat, J))
    assert via.status_code == 200 and via.json() == direct.json()
    router = create_app(RouterConfig(engines=(EngineSpec("a", "http://a.test"),)))
    assert {"/tokenize", "/detokenize"} <= {getattr(r, "path", None) for r in router.routes}
    assert {"/tokenize", "/detokenize"} <= set(router.openapi()["paths"])


#: repeated request headers: the engine reads the first of each (Starlette's ``Headers.get``)
REPEATED_HEADERS = [
    ("Content-Type json then text", [("content-type", "application/json"), ("content-type", "text/plain")], 200),
    ("Content-Type text then json", [("content-type", "text/plain"), ("content-type", "application/json")], 415),
    ("X-Request-Id twice", [("content-type", "application/json"), ("x-request-id", "first-id"),
                            ("x-request-id", "second-id")], 200),
]


@pytest.mark.parametrize("name, headers, status", REPEATED_HEADERS, ids=[c[0] for c in REPEATED_HEADERS])
def test_a_repeated_header_counts_by_its_first_value_through_the_router_as_on_the_engine(engine_app, name, headers,
                                                                                           status):
    via, direct, posts = run(_both(engine_app, "/v1/completions", _j(BASE), headers))
    assert direct.status_code == via.status_code == status, (direct.text[:300], via.text[:300])
    if status != 200:
        assert via.json() == direct.json() and posts == 0
    if name.startswith("X-Request-Id"):
        assert via.headers["x-request-id"] == direct.headers["x-request-id"] == "first-id"
