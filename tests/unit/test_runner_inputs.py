"""ModelRunner._inputs: a CPU step's input_ids/positions come from persistent tensors of its size,
filled in place (no torch.tensor per decode step), with the step's values; big steps convert."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from inferctl.engine.runner import _MAX_BUFFERED_TOKENS, ModelRunner


def _runner() -> ModelRunner:
    args = SimpleNamespace(dim=8, hidden_dim=16, n_heads=2, n_kv_heads=2, vocab_size=32)
    model = SimpleNamespace(args=args, dtype=torch.float32, device="cpu")
    return ModelRunner(model, kv_cache=None, block_size=16, accountant=None, sampler=None)


def test_decode_steps_reuse_one_pair_per_size_with_the_new_values():
    r = _runner()
    ids1, pos1 = r._inputs([7], [16])
    assert ids1.tolist() == [7] and pos1.tolist() == [16]
    assert ids1.dtype == pos1.dtype == torch.long
    ids2, pos2 = r._inputs([9], [17])
    assert ids2 is ids1 and pos2 is pos1            # same tensors, refilled
    assert ids2.tolist() == [9] and pos2.tolist() == [17]
    ids3, pos3 = r._inputs([1, 2, 3], [4, 5, 6])
    assert ids3 is not ids1 and ids3.tolist() == [1, 2, 3] and pos3.tolist() == [4, 5, 6]
    assert ids1.tolist() == [9]                      # another size leaves the pair of size 1 alone
    assert ids3.data_ptr() != pos3.data_ptr()


def test_a_step_over_the_limit_converts_fresh_tensors():
    r = _runner()
    n = _MAX_BUFFERED_TOKENS + 1
    ids, pos = r._inputs(list(range(n)), list(range(100, 100 + n)))
    assert ids.tolist() == list(range(n)) and pos.tolist() == list(range(100, 100 + n))
    again, _ = r._inputs(list(range(n)), list(range(n)))
    assert again is not ids and ids.tolist() == list(range(n))   # not overwritten
    assert n not in r._input_buffers
