"""Sampler: CTRL repetition penalty (F19), greedy/top-k/top-p, seeds, raw logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from inferctl.engine.sampler import Sampler, apply_penalties, greedy_sample, make_generator, raw_logprobs_of
from inferctl.engine.sampling_params import SamplingParams


def _logits(batch: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=g) * 3.0


# --- repetition penalty (F19: repetition_penalty 1.2 reaches the sampler) ------------------

def test_repetition_penalty_follows_ctrl_formula_exactly():
    logits = torch.tensor([[2.4, -1.0, 0.5, 3.0, -0.25, 0.0]])
    params = [SamplingParams(repetition_penalty=1.2)]
    out = apply_penalties(logits, params, [[0, 1, 1, 4, 5]])
    # seen ids 0, 1, 4, 5: positive / 1.2, negative * 1.2, 0 stays 0; unseen 2, 3 unchanged
    expected = torch.tensor([[2.4 / 1.2, -1.0 * 1.2, 0.5, 3.0, -0.25 * 1.2, 0.0]])
    assert torch.equal(out, expected)
    assert torch.equal(logits, torch.tensor([[2.4, -1.0, 0.5, 3.0, -0.25, 0.0]]))  # not in place


def test_repetition_penalty_matches_hugging_face_processor():
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = _logits(3, 50, seed=1)
    histories = [[1, 2, 3, 3, 49], [0, 7, 7], [10, 11, 12, 13]]
    pens = [1.2, 1.2, 0.8]
    ours = apply_penalties(logits, [SamplingParams(repetition_penalty=p) for p in pens], histories)
    for row in range(3):
        hf = RepetitionPenaltyLogitsProcessor(pens[row])(
            torch.tensor([histories[row]]), logits[row:row + 1].clone())
        assert torch.allclose(ours[row:row + 1], hf, rtol=0, atol=1e-6)


def test_repetition_penalty_changes_the_greedy_choice():
    sampler = Sampler(seed=0)
    logits = torch.tensor([[3.0, 2.9, 1.0, -0.5, -0.55]])
    history = [[2, 0]]  # tokens 2 and 0 already in the prompt
    plain = sampler(logits, [SamplingParams(temperature=0)], [None], history)
    pen = sampler(logits, [SamplingParams(temperature=0, repetition_penalty=1.2)], [None], history)
    assert plain.token_ids == [0]
    assert pen.token_ids == [1]  # 3.0 / 1.2 = 2.5 < 2.9
    # negative logits are multiplied: -0.5 * 1.2 = -0.6 < -0.55
    neg = torch.tensor([[-0.5, -0.55, -3.0]])
    assert sampler(neg, [SamplingParams(temperature=0)], [None], [[0]]).token_ids == [0]
    assert sampler(neg, [SamplingParams(temperature=0, repetition_penalty=1.2)], [None],
                   [[0]]).token_ids == [1]
    # raw logprobs: the penalty changes the choice, not the model's probability of it
    assert pen.logprobs[0] == pytest.approx(torch.log_softmax(logits, -1)[0, 1].item())


def test_presence_and_frequency_penalties_count_output_only():
    logits = torch.zeros(1, 6)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, [p], [[1, 1, 2, 3, 3, 3]], prompt_lens=[2])
    # output = [2, 3, 3, 3]; token 1 is prompt only
    assert out[0].tolist() == [0.0, 0.0, -0.75, -1.25, 0.0, 0.0]
    whole = apply_penalties(logits, [p], [[1, 1, 2]])
    assert whole[0].tolist() == [0.0, -1.0, -0.75, 0.0, 0.0, 0.0]


def test_history_with_out_of_range_id_raises():
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
        apply_penalties(torch.zeros(1, 4), [SamplingParams(repetition_penalty=1.2)], [[4]])


# --- greedy, top-k, top-p -------------------------------------------------------------------

def test_greedy_fast_path_is_argmax_with_raw_logprobs():
    logits = _logits(8, 512, seed=2)
    res = Sampler()(logits, [SamplingParams(temperature=0)] * 8, [None] * 8, [[]] * 8)
    assert res.token_ids == logits.argmax(-1).tolist()
    ref = torch.log_softmax(logits, -1).gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)
    assert res.logprobs == pytest.approx(ref.tolist(), abs=1e-5)
    assert res.top_logprobs is None and res.nonfinite_rows == []


@pytest.mark.parametrize("batch,vocab", [(1, 512), (1, 32000), (7, 32000), (32, 49152)])
def test_greedy_sample_equals_argmax_and_the_log_softmax_reference(batch, vocab):
    # the all-greedy fast path (issue 12): tokens equal torch.argmax (first maximal index, ties
    # included), logprobs equal log_softmax[argmax] within 1e-5 (float32 rounding of the sum)
    logits = _logits(batch, vocab, seed=vocab + batch).round()    # rounding makes ties
    res = greedy_sample(logits)
    assert res.token_ids == logits.argmax(-1).tolist()
    ref = torch.log_softmax(logits, -1).gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)
    assert res.logprobs == pytest.approx(ref.tolist(), abs=1e-5, rel=0)
    assert res.top_logprobs is None and res.nonfinite_rows == []
    # the Sampler takes it for greedy rows without penalties or top logprobs; logprobs=0 gives {}s
    full = Sampler()(logits, [SamplingParams(temperature=0, logprobs=0)] * batch, [None] * batch, [[]] * batch)
    assert full.token_ids == res.token_ids and full.logprobs == res.logprobs
    assert full.top_logprobs == [{}] * batch


def test_greedy_sample_leaves_nonfinite_rows_to_the_general_path():
    logits = _logits(3, 64, seed=21)
    masked = logits.clone()
    masked[1, :40] = float("-inf")              # a masked vocabulary: finite logprob, stays fast
    res = greedy_sample(masked)
    ref = torch.log_softmax(masked, -1)
    assert res.token_ids == masked.argmax(-1).tolist()
    assert res.logprobs == pytest.approx(ref.gather(1, masked.argmax(-1, keepdim=True)).squeeze(1).tolist(),
                                         abs=1e-5)
    for row, value in ((0, float("nan")), (2, float("inf"))):
        bad = logits.clone()
        bad[row, 7] = value
        assert greedy_sample(bad) is None
    dead = logits.clone()
    dead[2, :] = float("-inf")
    assert greedy_sample(dead) is None
    out = Sampler()(dead, [SamplingParams(temperature=0)] * 3, [None] * 3, [[]] * 3)
    assert out.nonfinite_rows == [2]        # the general path still finds the dead row
    assert out.token_ids[:2] == logits[:2].argmax(-1).tolist()


def test_top_k_1_and_tiny_top_p_equal_greedy():
    logits = _logits(16, 300, seed=3)
    greedy = logits.argmax(-1).tolist()
    sampler = Sampler(seed=3)
    for params in (SamplingParams(temperature=1.5, top_k=1),
                   SamplingParams(temperature=1.0, top_p=1e-6)):
        for _ in range(5):
            res = sampler(logits, [params] * 16, [None] * 16, [[]] * 16)
            assert res.token_ids == greedy


def test_top_k_and_top_p_truncate_the_distribution():
    # probs 0.5, 0.3, 0.15, 0.05
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    sampler = Sampler(seed=4)

    def freqs(params):
        res = sampler(logits, [params] * 4000, [None] * 4000, [[]] * 4000)
        return torch.bincount(torch.tensor(res.token_ids), minlength=4).double() / 4000

    plain = freqs(SamplingParams(temperature=1.0))
    assert torch.allclose(plain, torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.double),
                          atol=0.03)
    k2 = freqs(SamplingParams(temperature=1.0, top_k=2))
    assert k2[2] == 0 and k2[3] == 0 and k2[0] == pytest.approx(0.625, abs=0.03)
    p7 = freqs(SamplingParams(temperature=1.0, top_p=0.7))  # 0.5 < 0.7 <= 0.8: keep 2
    assert p7[2] == 0 and p7[3] == 0 and p7[0] == pytest.approx(0.625, abs=0.03)
    p8 = freqs(SamplingParams(temperature=1.0, top_p=0.8))  # exactly 0.8 reached with 2
    assert p8[2] == 0 and p8[3] == 0
    cold = freqs(SamplingParams(temperature=0.5))  # p^2 renormalised: 0.25/0.3650 = 0.685
    assert cold[0] == pytest.approx(0.685, abs=0.03)


# --- seeds ----------------------------------------------------------------------------------

def _run(rows, steps=20, vocab=64):
    """rows: list of (params, seed or None); returns the tokens of every row over steps."""
    sampler = Sampler(seed=123)
    gens = [make_generator(seed) if seed is not None else None for _, seed in rows]
    out = [[] for _ in rows]
    for step in range(steps):
        base = _logits(1, vocab, seed=1000 + step)
        logits = base.repeat(len(rows), 1)
        res = sampler(logits, [p for p, _ in rows], gens, [o[:] for o in out])
        for i, t in enumerate(res.token_ids):
            out[i].append(t)
    return out


def test_seeded_request_is_reproducible_alone_and_in_any_batch():
    target = (SamplingParams(temperature=1.0, seed=42), 42)
    alone = _run([target])[0]
    batch = _run([
        (SamplingParams(temperature=0.7, top_k=5), None),
        (SamplingParams(temperature=0), None),
        target,
        (SamplingParams(temperature=1.2, top_p=0.9, repetition_penalty=1.2, seed=7), 7),
        (SamplingParams(temperature=1.0), None),
    ])[2]
    assert alone == batch
    assert len(set(alone)) > 3  # it really sampled
    other_seed = _run([(SamplingParams(temperature=1.0, seed=43), 43)])[0]
    assert other_seed != alone


def test_seeded_top_p_request_is_reproducible_in_a_batch():
    target = (SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=5), 5)
    alone = _run([target])[0]
    batch = _run([(SamplingParams(temperature=0.3), None), target,
                  (SamplingParams(temperature=0), None)])[1]
    assert alone == batch


# --- logprobs -------------------------------------------------------------------------------

def test_logprobs_are_raw_and_top_logprobs_per_row():
    logits = _logits(3, 40, seed=9)
    raw = torch.log_softmax(logits, -1)
    params = [SamplingParams(temperature=0.5, top_k=3, repetition_penalty=1.3, logprobs=4),
              SamplingParams(temperature=0),
              SamplingParams(temperature=1.0, logprobs=0)]
    res = Sampler(seed=1)(logits, params, [None, None, None], [[1, 2], [], []])
    for r, tok in enumerate(res.token_ids):
        assert res.logprobs[r] == pytest.approx(raw[r, tok].item(), abs=1e-6)
    assert res.top_logprobs is not None
    top_vals, top_ids = raw[0].topk(4)
    assert list(res.top_logprobs[0]) == top_ids.tolist()
    assert list(res.top_logprobs[0].values()) == pytest.approx(top_vals.tolist())
    assert res.top_logprobs[1] == {} and res.top_logprobs[2] == {}


@pytest.mark.parametrize("fused", [False, True])
def test_raw_logprobs_of_equal_the_log_softmax_reference(fused, monkeypatch):
    # logsumexp + one gather (no [B, V] log_softmax: issue 12) or the fused CPU kernel: the
    # same numbers within 1e-5; top-k only when asked.
    logits = _logits(6, 32000, seed=13)
    raw = torch.log_softmax(logits, -1)
    tokens = torch.tensor([0, 5, 31999, 77, 1234, 9])
    if not fused:
        def forbidden(*_a, **_k):
            raise AssertionError("log_softmax over the vocabulary was materialised")

        monkeypatch.setattr(torch, "log_softmax", forbidden)
        monkeypatch.setattr(torch.Tensor, "log_softmax", forbidden)
    chosen, vals, ids = raw_logprobs_of(logits, tokens, 0, fused_log_softmax=fused)
    assert vals is None and ids is None
    assert chosen.tolist() == pytest.approx(raw.gather(1, tokens[:, None]).squeeze(1).tolist(), abs=1e-5)
    chosen, vals, ids = raw_logprobs_of(logits, tokens, 5, fused_log_softmax=fused)
    ref_vals, ref_ids = raw.topk(5, dim=-1)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(vals, ref_vals, atol=1e-5, rtol=0)


def test_sampler_logprobs_equal_the_reference_on_32000_tokens():
    logits = _logits(6, 32000, seed=14)
    raw = torch.log_softmax(logits, -1)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=5),
              SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0, logprobs=2),
              SamplingParams(temperature=0, repetition_penalty=1.3), SamplingParams(temperature=0)]
    res = Sampler(seed=4)(logits, params, [None] * 6, [[1, 2]] * 6)
    for r, tok in enumerate(res.token_ids):
        assert res.logprobs[r] == pytest.approx(raw[r, tok].item(), abs=1e-5)
    for r, k in ((1, 5), (3, 2)):
        vals, ids = raw[r].topk(k)
        assert list(res.top_logprobs[r]) == ids.tolist()
        assert list(res.top_logprobs[r].values()) == pytest.approx(vals.tolist(), abs=1e-5)
    assert res.top_logprobs[0] == {}


def test_nonfinite_logits_do_not_crash():
    logits = _logits(3, 10, seed=11)
    logits[0, 3] = float("nan")
    logits[1, :] = float("nan")
    logits[2, :] = float("-inf")
    logits[2, 5] = float("inf")
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0),
              SamplingParams(temperature=0.8)]
    res = Sampler(seed=2)(logits, params, [None] * 3, [[]] * 3)
    assert res.token_ids[0] != 3
    assert math.isnan(res.logprobs[0])  # counted as non-finite by engine.quality.perplexity
    assert res.nonfinite_rows == [1]
    assert res.token_ids[2] == 5


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="params has 1 entries, logits has 2 rows"):
        Sampler()(torch.zeros(2, 4), [SamplingParams()], [None, None], [[], []])
    with pytest.raises(ValueError, match="2-D"):
        Sampler()(torch.zeros(4), [SamplingParams()], [None], [[]])
    assert Sampler()(torch.zeros(0, 4), [], [], []).token_ids == []


# --- truncation against a plain sort-based reference ---------------------------------------

def _reference_keep(probs_row: torch.Tensor, top_k: int, top_p: float) -> set[int]:
    """HF/vLLM order in float64: top-k, renormalise, keep until the mass before reaches top_p."""
    vals, order = probs_row.double().sort(descending=True, stable=True)
    k = top_k if 0 < top_k < len(vals) else len(vals)
    vals, order = vals[:k], order[:k]
    vals = vals / vals.sum()
    before = vals.cumsum(0) - vals
    return set(order[before < top_p].tolist())


@pytest.mark.parametrize("vocab,top_k,top_p,temp", [
    (512, -1, 0.9, 1.0), (512, 40, 0.95, 0.7), (4000, -1, 0.95, 1.5), (4000, 300, 1.0, 1.0),
    (4000, 1000, 0.5, 2.0), (32000, -1, 0.9, 2.0),
])
def test_top_k_top_p_mask_matches_reference(vocab, top_k, top_p, temp):
    from inferctl.engine.sampler import top_k_top_p_mask

    probs = torch.softmax(_logits(4, vocab, seed=vocab + top_k) / temp, -1)
    keep = top_k_top_p_mask(probs, [top_k] * 4, [top_p] * 4)
    for r in range(4):
        got = set(keep[r].nonzero().flatten().tolist())
        ref = _reference_keep(probs[r], top_k, top_p)
        assert len(got ^ ref) <= 1, (len(got), len(ref))  # float32 vs float64 at the edge
    if vocab == 32000:
        assert keep.sum(-1).min() > 256  # the nucleus lay beyond the candidates: full sort


def test_wide_nucleus_sampling_stays_inside_the_nucleus():
    vocab = 2000
    logits = (-torch.arange(vocab, dtype=torch.float32) * 1e-4).repeat(3000, 1)
    res = Sampler(seed=8)(logits, [SamplingParams(temperature=1.0, top_p=0.9)] * 3000,
                          [None] * 3000, [[]] * 3000)
    kept = len(_reference_keep(torch.softmax(logits[0], -1), -1, 0.9))
    assert 1750 < kept < 1800  # earlier tokens are a little likelier: fewer than 90 %
    assert max(res.token_ids) < kept
    assert sum(t >= 1000 for t in res.token_ids) > 1000  # far past the 256 candidates


# --- the two-level inverse-CDF draw -------------------------------------------------------

def test_inverse_cdf_edges_and_zero_probability_tokens():
    from inferctl.engine.sampler import _inverse_cdf

    probs = torch.zeros(4, 768)
    probs[:, 10], probs[:, 256], probs[:, 300], probs[:, 767] = 0.3, 0.1, 0.2, 0.4
    u = torch.tensor([0.0, 0.2999, 0.35, 1.0 - 2**-53], dtype=torch.float64)
    assert _inverse_cdf(probs, u).tolist() == [10, 10, 256, 767]
    tiny = torch.zeros(1, 512)
    tiny[0, 511] = 1e-30  # the only token with mass, in the last block
    assert _inverse_cdf(tiny, torch.tensor([0.5], dtype=torch.float64)).tolist() == [511]


def test_sampled_frequencies_follow_the_distribution_across_blocks():
    logits = torch.full((8000, 768), float("-inf"))
    for tok, p in ((10, 0.3), (256, 0.1), (300, 0.2), (767, 0.4)):
        logits[:, tok] = math.log(p)
    res = Sampler(seed=12)(logits, [SamplingParams(temperature=1.0)] * 8000, [None] * 8000,
                           [[]] * 8000)
    counts = torch.bincount(torch.tensor(res.token_ids), minlength=768).double() / 8000
    assert set(torch.tensor(res.token_ids).unique().tolist()) == {10, 256, 300, 767}
    for tok, p in ((10, 0.3), (256, 0.1), (300, 0.2), (767, 0.4)):
        assert counts[tok] == pytest.approx(p, abs=0.02)


@pytest.mark.parametrize("batch,vocab", [(1, 512), (5, 4096)])
def test_greedy_sample_cpu_numpy_path_equals_the_torch_ops_exactly(batch, vocab):
    # wave 7 (issue 12): on CPU the argmax and the gather read log_softmax's numpy view; the tokens
    # and the logprobs must be the very numbers of torch.argmax + raw_logprobs_of (bitwise equal),
    # for a strided view too (the runner may hand a row selection or a slice)
    base = _logits(2 * batch, vocab, seed=batch + vocab).round()          # ties: first maximal index
    for logits in (base[:batch], base[::2]):
        tokens = logits.argmax(dim=-1)
        ref, _, _ = raw_logprobs_of(logits, tokens, fused_log_softmax=True)
        res = greedy_sample(logits)
        assert res.token_ids == tokens.tolist()
        assert res.logprobs == ref.tolist()
        assert all(type(t) is int for t in res.token_ids) and all(type(v) is float for v in res.logprobs)
    # a tensor that requires grad cannot be viewed through numpy: the torch ops serve it, same numbers
    grad = base[:batch].clone().requires_grad_(True)
    with torch.no_grad():
        ref = greedy_sample(base[:batch])
    res = greedy_sample(grad)
    assert res.token_ids == ref.token_ids and res.logprobs == pytest.approx(ref.logprobs, abs=0, rel=0)
