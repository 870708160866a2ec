"""Breaker regression for engine.sampler: a top_p that underflows float32 keeps the top token.

``top_p = 1e-300`` passes validation (0 < top_p <= 1) but is 0.0 once the mask compares in
float32; the nucleus then kept no token, the inverse-CDF draw indexed past the row, and the
engine failed the whole step (every request in the batch) with a 500.
"""

from __future__ import annotations

import pytest
import torch

from inferctl.engine.sampler import Sampler, top_k_top_p_mask
from inferctl.engine.sampling_params import SamplingParams


@pytest.mark.parametrize("top_p", [1e-300, 1e-46, 5e-324])
@pytest.mark.parametrize("top_k", [-1, 1, 3])
def test_underflowing_top_p_keeps_exactly_the_most_likely_token(top_p, top_k):
    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(4, 512, generator=gen) * 3, dim=-1)
    keep = top_k_top_p_mask(probs, [top_k] * 4, [top_p] * 4)
    assert keep.sum(dim=-1).tolist() == [1, 1, 1, 1]
    assert keep.float().argmax(dim=-1).tolist() == probs.argmax(dim=-1).tolist()


def test_underflowing_top_p_row_samples_the_argmax_beside_other_rows():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 512, generator=gen) * 4
    params = [SamplingParams(max_tokens=4, temperature=1.0, top_p=1e-300),
              SamplingParams(max_tokens=4, temperature=0.0),
              SamplingParams(max_tokens=4, temperature=1.0, top_p=0.9, seed=11)]
    res = Sampler(seed=0)(logits, params, [None, None, torch.Generator().manual_seed(11)], [[], [], []])
    argmax = logits.argmax(dim=-1).tolist()
    assert res.token_ids[0] == argmax[0]
    assert res.token_ids[1] == argmax[1]
    assert 0 <= res.token_ids[2] < 512
    assert res.nonfinite_rows == []


def test_ordinary_top_p_mask_is_unchanged():
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps the two whose preceding mass < 0.7
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    assert top_k_top_p_mask(probs, [-1], [0.7]).tolist() == [[False, True, False, True]]
    assert top_k_top_p_mask(probs, [-1], [0.5]).tolist() == [[False, True, False, False]]
    assert top_k_top_p_mask(probs, [-1], [0.81]).tolist() == [[True, True, False, True]]


@pytest.mark.parametrize("penalty", [1e39, 1e308])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_repetition_penalty_beyond_float32_keeps_zero_logits_finite(penalty, temperature):
    """repetition_penalty 1e39 passes validation (> 0) but is inf in float32: a seen token with
    a logit of exactly 0 became 0 * inf = NaN, so greedy argmax *chose* that penalised token
    and a sampled row failed the step for the whole batch."""
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(2, 512, generator=gen)
    logits[:, 5] = 0.0
    logits[:, 7] = 50.0  # seen too: divided by inf -> 0
    params = [SamplingParams(max_tokens=4, temperature=temperature, repetition_penalty=penalty),
              SamplingParams(max_tokens=4, temperature=0.0)]
    res = Sampler(seed=0)(logits.clone(), params, [None, None], [[5, 7], []])
    assert res.token_ids[0] not in (5, 7)
    if temperature == 0.0:
        masked = logits[0].clone()
        masked[[5, 7]] = float("-inf")
        assert res.token_ids[0] == int(masked.argmax())
    assert res.token_ids[1] == int(logits[1].argmax())


def test_row_with_every_logit_penalised_away_does_not_fail_the_batch():
    # every token seen, every logit negative, penalty inf: the row has no finite logit left
    gen = torch.Generator().manual_seed(2)
    logits = -torch.rand(2, 16, generator=gen) - 0.1
    params = [SamplingParams(max_tokens=4, temperature=1.0, repetition_penalty=1e39),
              SamplingParams(max_tokens=4, temperature=1.0, top_k=1)]
    res = Sampler(seed=0)(logits.clone(), params, [None, None], [list(range(16)), []])
    assert 0 <= res.token_ids[0] < 16
    assert res.token_ids[1] == int(logits[1].argmax())
