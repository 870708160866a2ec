"""stories260K greedy output against llama2.c's documented output and an independent reference."""

from __future__ import annotations

import pytest
import torch

from inferctl.engine.loader import load_llama2c
from tests.model_helpers import Harness, RefLlama

README_CONTINUATION = (", there was a little girl named Lily. She loved to play outside in the park. One day, she "
                       "saw a big, red ball. She wanted to play with it, but it was too high.")


@pytest.fixture(scope="module")
def stories(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin")


@pytest.fixture(scope="module")
def ref(stories_dir):
    return RefLlama(stories_dir / "stories260K.bin")


def test_greedy_once_upon_a_time_matches_llama2c_readme(stories):
    tok = stories.tokenizer
    prompt = tok.encode("Once upon a time")
    assert prompt == [1, 403, 407, 261, 378]  # BOS, " Once", " upon", " a", " time" in tok512
    out, _ = Harness(stories.model).greedy(0, prompt, 64)
    text = tok.decode(prompt + out)
    assert text.startswith("Once upon a time" + README_CONTINUATION), text
    # the reference sentence is covered within the 64 generated tokens, token by token
    n_ref = next(k for k in range(1, 65) if tok.decode(prompt + out[:k]).endswith("too high."))
    assert 40 <= n_ref <= 64
    # llama2.c-style incremental decode: each prefix extends the previous one
    prev = ""
    for k in range(len(out) + 1):
        cur = tok.decode(prompt + out[:k])
        assert cur.startswith(prev)
        prev = cur


@pytest.mark.parametrize("prompt_text", ["Lily and Tom went to the park", "The dog was very", "One day, a little bird"])
def test_greedy_matches_independent_reference(stories, ref, prompt_text):
    tok = stories.tokenizer
    prompt = tok.encode(prompt_text)
    ours, rows = Harness(stories.model, block_size=16, shuffle=True).greedy(0, prompt, 40)
    theirs = ref.greedy(prompt, 40)
    assert ours == theirs
    # and the logits themselves agree at every step (teacher-forced on the shared tokens)
    ref_logits = ref.logits(prompt + ours)[len(prompt) - 1:-1]
    diff = (torch.stack(rows) - ref_logits).abs().max().item()
    assert diff < 1e-4, diff


def test_reference_is_sensitive_to_rope_layout(stories, ref):
    """The cross-check can fail: the same weights with the wrong RoPE pairing diverge."""
    from inferctl.engine.model import LlamaModel
    wrong = LlamaModel(stories.args.__class__(**{**stories.args.to_dict(), "rope_style": "half"}),
                       stories.model.export_weights())
    prompt = stories.tokenizer.encode("Once upon a time")
    ours, _ = Harness(wrong).greedy(0, prompt, 40)
    assert ours != ref.greedy(prompt, 40)
