"""bench.peer helpers: the greedy-agreement count, the near-tie rule, the q/k row permutation."""

from __future__ import annotations

import numpy as np

from bench import peer


def test_agree_is_the_common_prefix():
    assert peer._agree([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert peer._agree([1, 2], [1, 2, 3]) == 2
    assert peer._agree([], [1]) == 0


def test_near_tie_only_below_the_gap(monkeypatch):
    monkeypatch.setattr(peer, "_top2_gap", lambda model, ids: 2.1e-4)
    assert "near-tie at token 3" in peer._near_tie(None, [5, 6], [7, 8, 9, 10], 3)
    monkeypatch.setattr(peer, "_top2_gap", lambda model, ids: 0.5)
    assert peer._near_tie(None, [5, 6], [7, 8, 9, 10], 3) is None
    monkeypatch.setattr(peer, "_top2_gap", lambda model, ids: None)     # could not check: a mismatch
    assert peer._near_tie(None, [5], [7], 0) is None


def test_permute_half_to_interleaved_pairs_rows():
    # one head of dim 4: rotate-half rows (0, 1 | 2, 3) pair i with i + 2; interleaved wants (0, 2, 1, 3)
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = peer._permute_half_to_interleaved(w, 1)
    assert out[:, 0].tolist() == [0.0, 4.0, 2.0, 6.0]
