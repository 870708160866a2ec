"""The in-process long-text backend (bench/longtext_inproc.py) on the real stories260K."""

from __future__ import annotations

import math

import pytest

from bench.longtext_inproc import EngineBackend
from inferctl.tools.longtext import LongTextConfig, read_book, run_longtext


@pytest.fixture(scope="module")
def backend(stories_dir):
    return EngineBackend(stories_dir / "stories260K.bin", threads=1, pack=3)


def test_scores_match_the_engines_own_logprobs(backend):
    """Teacher forcing over prompt + greedy output gives the logprobs the engine reported
    while generating (same model, same positions) — the scorer reads the right rows."""
    prompt = [backend.bos_id] + backend.tokenize("Once upon a time")
    gen = backend.generate([prompt], [40], LongTextConfig(repetition_penalty=1.0, max_new_tokens=40))[0]
    text = backend.bundle.tokenizer.decode(gen.tokens)
    assert text.startswith(", there was a little girl named Lily")       # the README's reference output
    window = prompt + gen.tokens
    scored = backend.score([window, prompt, window])        # packed with windows of other lengths
    assert scored[0][0] is None and len(scored[0]) == len(window)
    got = scored[0][len(prompt):]
    assert got == pytest.approx(gen.logprobs, abs=2e-4)
    assert scored[2] == pytest.approx(scored[0], abs=1e-5)  # packing does not mix windows
    assert all(lp <= 0 for lp in got)


def test_book_run_on_real_gutenberg_text(backend, gutenberg_dir):
    book = read_book(gutenberg_dir / "pg84.txt")
    rep = run_longtext(book, backend, LongTextConfig(max_chunks=3, max_new_tokens=16, concurrency=3))
    assert rep.total_chunks > 500 and len(rep.chunks) == 3
    s = rep.summary()
    assert 5 < s["ppl"] < 500                    # a real perplexity, not 0/inf
    assert all(c.gen_tokens <= 16 and c.prompt_tokens + c.gen_tokens <= 512 for c in rep.chunks)
    assert all(math.isfinite(b.ppl) for b in rep.positions if b.tokens)
