"""Output quality: F18 (non-finite logprobs), F19 (degenerate repetition), F20 buckets."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from inferctl.engine.quality import (
    PROMPT_LEN_BUCKETS,
    detect_repetition_loop,
    distinct_n,
    is_degenerate,
    json_safe,
    perplexity,
    prompt_len_bucket,
    repetition_loop,
    score_output,
    seq_rep_n,
)
from inferctl.engine.sampler import Sampler
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.tokenizer import Llama2cTokenizer

A = "the the the the the the the the the the"
B = "Paris is the capital of France."


@pytest.fixture(scope="module")
def tok(stories_dir):
    return Llama2cTokenizer(stories_dir / "tok512.bin")


# --- F18 ----------------------------------------------------------------------------------

def test_f18_perplexity_of_finite_logprobs():
    ppl, nonfinite = perplexity([-0.3755025565624237, 0.0, 0.0])
    assert round(ppl, 4) == 1.1333
    assert ppl == pytest.approx(math.exp(0.3755025565624237 / 3), rel=1e-12)
    assert nonfinite == 0


def test_f18_response_with_minus_inf_top_logprob_is_strict_json():
    body = {"choices": [{"logprobs": {
        "tokens": ["a", "b", "c"],
        "token_logprobs": [-0.3755025565624237, 0.0, 0.0],
        "top_logprobs": [{"a": -0.3755025565624237, "z": float("-inf")}, {"b": 0.0}, {"c": 0.0}],
    }}], "usage": {"perplexity": perplexity([-0.3755025565624237, 0.0, 0.0])[0]}}
    with pytest.raises(ValueError):
        json.dumps(body, allow_nan=False)
    text = json.dumps(json_safe(body), allow_nan=False)
    assert "Infinity" not in text and "NaN" not in text
    back = json.loads(text)
    assert back["choices"][0]["logprobs"]["top_logprobs"][0] == {"a": -0.3755025565624237,
                                                                 "z": None}
    assert back["choices"][0]["logprobs"]["token_logprobs"] == [-0.3755025565624237, 0.0, 0.0]
    assert round(back["usage"]["perplexity"], 4) == 1.1333


def test_f18_nan_request_is_excluded_and_counted():
    ppl, nonfinite = perplexity([-0.2, float("nan"), -0.1])
    assert ppl is None and nonfinite == 1
    # aggregate over requests: the NaN one is left out, its non-finite value counted
    requests = [[-0.3755025565624237, 0.0, 0.0], [-0.2, float("nan"), -0.1]]
    scored = [perplexity(r) for r in requests]
    included = [p for p, _ in scored if p is not None]
    assert included == [pytest.approx(1.1333, abs=5e-5)]
    assert sum(n for _, n in scored) == 1
    assert json.dumps(json_safe({"token_logprobs": requests[1]}), allow_nan=False) == \
        '{"token_logprobs": [-0.2, null, -0.1]}'


def test_perplexity_infinities_excluded_but_counted_and_edge_cases():
    ppl, n = perplexity([-1.0, float("-inf"), -3.0])
    assert ppl == pytest.approx(math.exp(2.0)) and n == 1
    assert perplexity([]) == (None, 0)
    assert perplexity([float("-inf")]) == (None, 1)
    assert perplexity([None, -1.0]) == (None, 1)


def test_json_safe_handles_numpy_and_nesting():
    x = {"a": (np.float32("nan"), np.float64(1.5), np.int64(3)), "b": [[float("inf")]], "c": True}
    out = json_safe(x)
    assert out == {"a": [None, 1.5, 3], "b": [[None]], "c": True}
    assert type(out["a"][2]) is int
    json.dumps(out, allow_nan=False)


# --- F19 ----------------------------------------------------------------------------------

def test_f19_words():
    a, b = A.split(), B.split()
    assert seq_rep_n(a, 1) == pytest.approx(0.9)
    assert round(seq_rep_n(a, 2), 3) == 0.889
    assert is_degenerate(a)
    assert seq_rep_n(b, 1) == 0.0 and seq_rep_n(b, 2) == 0.0
    assert not is_degenerate(b)
    assert distinct_n(a, 1) == pytest.approx(0.1) and distinct_n(b, 2) == 1.0


def test_f19_on_stories260k_token_ids(tok):
    a = tok.encode(A, bos=False)
    b = tok.encode(B, bos=False)
    assert len(a) == 10 and len(set(a)) == 1  # " the" is one token
    assert seq_rep_n(a, 1) == pytest.approx(0.9)
    assert round(seq_rep_n(a, 2), 3) == 0.889
    assert is_degenerate(a)
    assert seq_rep_n(b, 4) == 0.0 and not is_degenerate(b)
    q = score_output(a, [-0.1] * 10, prompt_tokens=5, finish_reason="length")
    assert q.degenerate and q.seq_rep["1"] == pytest.approx(0.9)
    assert q.perplexity == pytest.approx(math.exp(0.1)) and q.prompt_len_bucket == "<512"
    qb = score_output(b, [-0.5] * len(b), prompt_tokens=9000, finish_reason="stop")
    assert not qb.degenerate and qb.prompt_len_bucket == ">=8k"
    json.dumps(qb.to_dict(), allow_nan=False)


def test_f19_repetition_penalty_reaches_the_sampler(tok):
    """With the CTRL penalty at 1.2 the greedy pick moves off the token already repeated."""
    the = tok.encode("the", bos=False)[0]
    logits = torch.zeros(1, tok.vocab_size)
    logits[0, the] = 2.0
    logits[0, 300] = 1.8
    hist = [tok.encode(A)]
    sampler = Sampler(seed=0)
    assert sampler(logits, [SamplingParams(temperature=0)], [None], hist).token_ids == [the]
    res = sampler(logits, [SamplingParams(temperature=0, repetition_penalty=1.2)], [None], hist)
    assert res.token_ids == [300]  # 2.0 / 1.2 = 1.667 < 1.8


def test_degenerate_threshold_and_minimum_length():
    assert not is_degenerate([1, 1, 1, 1, 1, 1, 1])  # 7 tokens: too short to judge
    assert is_degenerate([1] * 8)
    # 8 tokens, 5 four-grams, 2 distinct -> seq-rep-4 0.6
    assert is_degenerate([1, 2, 1, 2, 1, 2, 1, 2])
    # a repeated unigram in normal text does not count
    assert not is_degenerate("the cat and the dog and the bird sat on the mat".split())
    assert seq_rep_n([1, 2, 3], 4) is None and distinct_n([], 1) is None
    with pytest.raises(ValueError):
        seq_rep_n([1, 2], 0)
    with pytest.raises(ValueError):
        is_degenerate([1, 2], threshold=1.5)


# --- repetition stop --------------------------------------------------------------------------

def test_repetition_loop_needs_enough_copies():
    assert repetition_loop([5, 6] + [9] * 15) is None
    assert repetition_loop([5, 6] + [9] * 16) == (1, 16)
    assert repetition_loop([0] + [3, 4] * 7) is None
    assert repetition_loop([0] + [3, 4] * 8) == (2, 8)
    assert repetition_loop([0] + [1, 2, 3, 4, 5] * 4) == (5, 4)
    assert repetition_loop([0] + [1, 2, 3, 4, 5] * 3 + [1, 2, 3, 4]) is None
    assert detect_repetition_loop([7, 8, 9] * 6, min_ngram=3, max_ngram=3, min_repeats=6,
                                  min_span=1)
    assert not detect_repetition_loop(list(range(100)))
    with pytest.raises(ValueError, match="min_ngram"):
        repetition_loop([1], min_ngram=3, max_ngram=2)


def test_repetition_loop_on_a_looping_story(tok):
    ids = tok.encode("Once upon a time" + " the cat sat on the mat." * 6, bos=False)
    assert detect_repetition_loop(ids)
    assert not detect_repetition_loop(tok.encode("Once upon a time, there was a little girl "
                                                 "named Lily. She loved to play outside.",
                                                 bos=False))


# --- F20 buckets ----------------------------------------------------------------------------

@pytest.mark.parametrize("n,label", [
    (0, "<512"), (511, "<512"), (512, "512-2k"), (1200, "512-2k"), (2047, "512-2k"),
    (2048, "2k-8k"), (2500, "2k-8k"), (4000, "2k-8k"), (8191, "2k-8k"), (8192, ">=8k"),
    (9000, ">=8k"), (15000, ">=8k"),
])
def test_prompt_len_bucket_edges(n, label):
    assert prompt_len_bucket(n) == label
    assert label in PROMPT_LEN_BUCKETS


def test_f20_degenerate_by_bucket():
    records = [(1200, 0.05), (2500, 0.04), (4000, 0.06), (9000, 0.85), (12000, 0.91),
               (15000, 0.88)]
    below = [rep for n, rep in records if prompt_len_bucket(n) != ">=8k"]
    above = [rep for n, rep in records if prompt_len_bucket(n) == ">=8k"]
    # the same threshold is_degenerate applies to seq-rep-4
    from inferctl.engine.quality import DEGENERATE_THRESHOLD
    assert sum(r >= DEGENERATE_THRESHOLD for r in below) == 0 and len(below) == 3
    assert sum(r >= DEGENERATE_THRESHOLD for r in above) == 3 and len(above) == 3
    with pytest.raises(ValueError, match="n_tokens"):
        prompt_len_bucket(-1)
