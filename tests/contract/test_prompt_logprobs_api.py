"""``prompt_logprobs`` on POST /v1/completions (vLLM's shape), served by stories260K.

Values are checked against teacher forcing with the engine's own model (a plain full forward,
``model_helpers.Harness``), and the perplexity of ``tests/data/eval_stories.txt`` through the
API against the model-level number.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
import torch

from inferctl.tools.longtext import parse_prompt_logprobs
from inferctl.engine.entrypoints.logprobs import prompt_logprobs_json as _prompt_logprobs_json
from inferctl.engine.entrypoints.sse import dumps as _dumps
from inferctl.engine.sequence import Logprob
from tests.model_helpers import Harness
from tests.server_helpers import STORIES, client, engines_running, http_post, make_app, run, stories_engine

EVAL = Path(__file__).resolve().parents[1] / "data" / "eval_stories.txt"
TOL = 1e-4


@pytest.fixture(scope="module")
def engine(stories_dir):
    """stories260K with a 40-token step budget, so a long prompt spans several prefill chunks."""
    eng = stories_engine(stories_dir, max_num_batched_tokens=40)
    with engines_running(eng):
        yield eng


@pytest.fixture()
def app(engine):
    return make_app({STORIES: engine})


def strict(text: str):
    """Parse strictly valid JSON (NaN/Infinity literals are an error)."""
    def bad(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=bad)


def ref_logprobs(model, ids: list[int]) -> torch.Tensor:
    return torch.log_softmax(Harness(model, num_blocks=64).step([(0, ids, True)]).float(), dim=-1)


def test_prompt_logprobs_match_teacher_forcing_while_other_requests_run(app, engine):
    tok = engine.engine.tokenizer
    text = " ".join(EVAL.read_text(encoding="utf-8").split()[:120])
    ids = tok.encode(text)
    assert len(ids) > 4 * 40                                   # several 40-token chunks

    async def go():
        async with client(app) as c:
            others = [c.post("/v1/completions", json={"prompt": p, "max_tokens": 24, "temperature": 0})
                      for p in ("Once upon a time", "The sun was shining")]
            scored = c.post("/v1/completions", json={"prompt": ids, "max_tokens": 2, "temperature": 0,
                                                     "prompt_logprobs": 3, "logprobs": 0})
            return await asyncio.gather(scored, *others)

    r, *others = run(go())
    assert r.status_code == 200 and all(o.status_code == 200 for o in others)
    assert all("prompt_logprobs" not in o.json()["choices"][0] for o in others)
    choice = strict(r.text)["choices"][0]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    ref = ref_logprobs(engine.engine.model, ids)
    worst = 0.0
    for t in range(1, len(ids)):
        entry, row, actual = entries[t], ref[t - 1], ids[t]
        assert str(actual) in entry and len(entry) <= 4
        item = entry[str(actual)]
        worst = max(worst, abs(item["logprob"] - float(row[actual])))
        assert item["rank"] == int((row >= row[actual]).sum())
        assert item["decoded_token"] == tok.token_bytes(actual).decode("utf-8", errors="replace")
        top_v, top_i = row.topk(3)
        for r_, (v, i) in enumerate(zip(top_v.tolist(), top_i.tolist()), start=1):
            alt = entry[str(i)]
            worst = max(worst, abs(alt["logprob"] - v))
            assert i == actual or alt["rank"] == r_
    assert worst <= TOL, worst
    # the generated text is the greedy continuation (the last prompt row was sampled, not scored)
    best = int(ref[-1].argmax())
    assert choice["logprobs"]["tokens"][0] == tok.token_bytes(best).decode("utf-8", errors="replace")
    assert abs(choice["logprobs"]["token_logprobs"][0] - float(ref[-1, best])) <= TOL


def test_eval_stories_perplexity_through_the_api_equals_the_model(app, engine):
    tok, model = engine.engine.tokenizer, engine.engine.model
    lines = [ln for ln in EVAL.read_text(encoding="utf-8").splitlines() if ln.strip()]
    nll_model = nll_api = 0.0
    n_model = n_api = 0
    for ln in lines:
        ids = tok.encode(ln)
        lp = ref_logprobs(model, ids)[:-1].gather(1, torch.tensor(ids[1:])[:, None])
        nll_model -= lp.sum().item()
        n_model += len(ids) - 1
    for start in range(0, len(lines), 16):                     # max_batch_prompts = 16
        batch = lines[start:start + 16]
        r = http_post(app, "/v1/completions", {"prompt": batch, "max_tokens": 1, "prompt_logprobs": 0})
        assert r.status_code == 200, r.text
        for choice in sorted(strict(r.text)["choices"], key=lambda c: c["index"]):
            ids = tok.encode(batch[choice["index"]])
            lps = parse_prompt_logprobs(choice["prompt_logprobs"], ids)   # the longtext client's parser
            assert lps is not None and lps[0] is None and len(lps) == len(ids)
            nll_api -= math.fsum(lps[1:])
            n_api += len(ids) - 1
    assert n_api == n_model > 500
    ppl_model, ppl_api = math.exp(nll_model / n_model), math.exp(nll_api / n_api)
    assert ppl_model < 8.0                                     # the model really predicts the text
    assert abs(ppl_api - ppl_model) <= 1e-4 * ppl_model, (ppl_api, ppl_model)


def test_echo_batch_and_usage_with_prompt_logprobs(app, engine):
    r = http_post(app, "/v1/completions", {"prompt": ["Once upon a time", "Tom had a truck"], "max_tokens": 1,
                                            "prompt_logprobs": 1, "echo": True, "logprobs": 0})
    assert r.status_code == 200, r.text
    doc = strict(r.text)
    tok = engine.engine.tokenizer
    for choice, text in zip(doc["choices"], ["Once upon a time", "Tom had a truck"]):
        ids = tok.encode(text)
        assert choice["text"].startswith(text)
        assert [int(k) for k in choice["prompt_logprobs"][1]][0] == ids[1]   # the actual token first
        assert len(choice["prompt_logprobs"]) == len(ids)
        assert len(choice["logprobs"]["token_logprobs"]) == 1
    assert doc["usage"]["prompt_tokens"] == sum(len(tok.encode(t)) for t in ("Once upon a time", "Tom had a truck"))


@pytest.mark.parametrize("body, param, needle", [
    ({"prompt_logprobs": 6}, "prompt_logprobs", "between 0 and 5"),
    ({"prompt_logprobs": -1}, "prompt_logprobs", "greater than or equal to 0"),
    ({"prompt_logprobs": "1"}, "prompt_logprobs", "not a string"),
    ({"prompt_logprobs": True}, "prompt_logprobs", "not a boolean"),
    ({"prompt_logprobs": 1.5}, "prompt_logprobs", "integer"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "not supported with stream"),
])
def test_prompt_logprobs_validation(app, body, param, needle):
    r = http_post(app, "/v1/completions", {"prompt": "Once", "max_tokens": 1, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err


def test_chat_refuses_prompt_logprobs_and_null_means_none(app):
    r = http_post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                 "prompt_logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
    assert "/v1/completions" in r.json()["error"]["message"]
    r = http_post(app, "/v1/completions", {"prompt": "Once", "max_tokens": 1, "prompt_logprobs": None})
    assert r.status_code == 200 and "prompt_logprobs" not in r.json()["choices"][0]


def test_non_finite_prompt_logprobs_become_null(engine):
    tok = engine.engine.tokenizer
    doc = _prompt_logprobs_json(tok, [None, {5: Logprob(float("-inf"), 512), 7: Logprob(float("nan"), 1)},
                                      {9: Logprob(-0.5, 1)}])
    text = _dumps({"prompt_logprobs": doc})
    parsed = strict(text)["prompt_logprobs"]
    assert parsed[0] is None
    assert parsed[1]["5"] == {"logprob": None, "rank": 512,
                              "decoded_token": tok.token_bytes(5).decode("utf-8", "replace")}
    assert parsed[1]["7"]["logprob"] is None and parsed[2]["9"]["logprob"] == -0.5
