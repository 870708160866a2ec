"""Quality measures on real stories260K generations (greedy, 400 tokens, EOS ignored)."""

from __future__ import annotations

import pytest

from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_llama2c
from inferctl.engine.quality import is_degenerate, repetition_loop, seq_rep_n
from inferctl.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def bundle(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin", stories_dir / "tok512.bin")


def _greedy(bundle, prompt: str, **kw) -> list[int]:
    engine = LLMEngine(bundle, EngineConfig())
    params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True, **kw)
    engine.add_request("r", bundle.tokenizer.encode(prompt), params)
    out: list[int] = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            out += o.new_token_ids
    return out


def test_greedy_story_that_loops_is_degenerate_and_its_loop_found(bundle):
    out = _greedy(bundle, "Tom")
    assert len(out) == 400
    assert seq_rep_n(out, 4) > 0.5 and is_degenerate(out)
    found = [repetition_loop(out[:n]) for n in range(1, len(out) + 1)]
    first = next(i for i, f in enumerate(found) if f is not None)
    n, repeats = found[first]
    assert n > 8 and repeats == 4  # a looping sentence: longer than 8 tokens
    assert all(repetition_loop(out[:k], max_ngram=8) is None for k in range(1, len(out) + 1))


def test_greedy_story_without_loop_is_not_degenerate(bundle):
    out = _greedy(bundle, "Once upon a time")
    assert seq_rep_n(out, 4) < 0.5 and not is_degenerate(out)
    assert all(repetition_loop(out[:k]) is None for k in range(1, len(out) + 1))


def test_repetition_penalty_reduces_repetition_on_the_looping_prompt(bundle):
    plain = _greedy(bundle, "Tom")
    penalised = _greedy(bundle, "Tom", repetition_penalty=1.2)
    assert penalised != plain
    assert seq_rep_n(penalised, 4) < seq_rep_n(plain, 4)
