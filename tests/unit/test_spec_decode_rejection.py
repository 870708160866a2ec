"""Speculative decoding's accept/reject rule and proposers, as pure functions.

Statistical checks (fixed seeds, so they are deterministic): the emitted-token distribution of
the rejection sampler must equal the target's ``p`` (Leviathan et al. 2023, theorem 3.5). The
test is Pearson's chi-square goodness of fit against ``N * p``; it fails when the statistic
exceeds the 0.001 critical value of the chi-square distribution with V - 1 degrees of freedom
(NIST/SEMATECH e-Handbook of Statistical Methods, table 1.3.6.7.4: 18.467 for 4 df). A rule
that skips the residual distribution or always accepts is off by thousands at N = 8,000.
"""

from __future__ import annotations

import pytest
import torch

from inferctl.engine.block_manager import BlockManager
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.sequence import Sequence
from inferctl.engine.spec_decode.proposers import NgramProposer
from inferctl.engine.spec_decode.rejection import greedy_accept, rejection_sample, target_probs

CHI2_CRIT_4DF_P001 = 18.467
N = 8_000
P = torch.tensor([[0.05, 0.40, 0.25, 0.20, 0.10], [0.30, 0.10, 0.10, 0.10, 0.40]])
Q = torch.tensor([[0.50, 0.10, 0.10, 0.10, 0.20]])


def chi2(counts: list[int], p: torch.Tensor) -> float:
    exp = (p.double() * sum(counts)).tolist()
    return sum((c - e) ** 2 / e for c, e in zip(counts, exp))


def test_rejection_sampler_with_draft_distribution_emits_p():
    gen = torch.Generator().manual_seed(1234)
    first = [0] * 5
    bonus = [0] * 5
    accepted = 0
    for _ in range(N):
        d = int(torch.multinomial(Q[0], 1, generator=gen))
        toks, a = rejection_sample(P, [d], Q, gen)
        first[toks[0]] += 1
        if a == 1:
            accepted += 1
            bonus[toks[1]] += 1
    assert chi2(first, P[0]) < CHI2_CRIT_4DF_P001, first
    assert chi2(bonus, P[1]) < CHI2_CRIT_4DF_P001, bonus
    # acceptance probability is sum_x min(p, q) (Leviathan et al., section 3.3) = 0.45 here
    assert accepted / N == pytest.approx(float(torch.minimum(P[0], Q[0]).sum()), abs=0.02)


def test_rejection_sampler_point_mass_draft_emits_p():
    """The ngram proposer's draft is deterministic: q is a point mass on the draft token."""
    gen = torch.Generator().manual_seed(99)
    counts = [0] * 5
    accepted = 0
    for _ in range(N):
        toks, a = rejection_sample(P, [1], None, gen)
        counts[toks[0]] += 1
        accepted += a
    assert chi2(counts, P[0]) < CHI2_CRIT_4DF_P001, counts
    assert accepted / N == pytest.approx(0.40, abs=0.02)


def test_rejection_sampler_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="2 drafts"):
        rejection_sample(P, [1, 2], None, torch.Generator())


def test_greedy_accept_stops_at_the_first_mismatch():
    assert greedy_accept([5, 6, 7, 8], [5, 6, 9]) == ([5, 6, 7], 2)
    assert greedy_accept([5, 6, 7, 8], [5, 6, 7]) == ([5, 6, 7, 8], 3)   # bonus token
    assert greedy_accept([1, 2], [3]) == ([1], 0)


def test_target_probs_follows_temperature_and_top_k():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = target_probs(logits, SamplingParams(temperature=0.5, top_k=2))
    ref = torch.softmax(torch.tensor([4.0, 2.0]), dim=0)
    assert p[0, :2].tolist() == pytest.approx(ref.tolist(), rel=1e-5)
    assert p[0, 2:].tolist() == [0.0, 0.0]


def test_ngram_proposer_takes_the_longest_most_recent_match():
    ng = NgramProposer(3, 1)
    #            0  1  2  3  4  5  6  7  8  9
    ctx = [1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3]
    # suffix [7,2,3] has no earlier match; [2,3] last occurred at 5 → followed by 5, 7, 2
    assert ng.propose(ctx, 3) == [5, 7, 2]
    assert ng.propose(ctx, 1) == [5]
    assert ng.propose([1, 2, 3], 4) == []
    assert NgramProposer(2, 2).propose([4, 4, 4], 2) == [4]


def test_block_manager_truncate_gives_back_rejected_slots():
    bm = BlockManager(8, 4)
    seq = Sequence("r", list(range(6)), SamplingParams(), 10, 0.0, 0.0)
    assert bm.allocate(seq, 6)
    seq.num_computed_tokens = 6
    table = seq.block_table
    assert bm.allocate(seq, 1 + 5)           # a decode plus 5 drafts: 12 slots, 3 blocks
    assert len(seq.block_table) == 3 and bm.tokens_stored == 12
    assert bm.truncate(seq, 8) == 1          # 2 accepted: 8 tokens, 2 blocks
    assert seq.block_table is table and len(table) == 2
    assert bm.num_free_blocks == 6 and bm.tokens_stored == 8
    assert bm.truncate(seq, 8) == 0
