"""The C++ greedy pick (``greedy_logprobs`` in engine/csrc/decode_step.cpp, issue 12 wave 9):
``greedy_sample(logits, ops)`` gives exactly what the Python path ``greedy_sample(logits)`` gives —
the same tokens (torch.argmax's first maximal index, ties in the 8-lane body and in the tail), the same
logprobs bit for bit (both read torch's float32 ``log_softmax``), and None for the same non-finite rows —
and the runner's decode fast path hands it the kernels' namespace where they run."""

from __future__ import annotations

import pytest
import torch

from inferctl.engine import cpu_kernels
from inferctl.engine.sampler import greedy_sample

OPS = cpu_kernels.ops_for("cpu", torch.float32)
pytestmark = pytest.mark.skipif(OPS is None, reason="CPU kernels did not build here (no compiler/ninja)")


def _logits(b: int, v: int, seed: int) -> torch.Tensor:
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 4


def _same(x: torch.Tensor) -> None:
    py, cpp = greedy_sample(x), greedy_sample(x, OPS)
    if py is None:
        assert cpp is None
        return
    assert cpp.token_ids == py.token_ids == x.argmax(-1).tolist()
    assert cpp.logprobs == py.logprobs          # bit for bit: Python floats from the same float32 values
    ref = torch.log_softmax(x, -1).gather(1, x.argmax(-1, keepdim=True)).squeeze(1).tolist()
    assert cpp.logprobs == ref
    assert cpp.top_logprobs is None and cpp.nonfinite_rows == []


@pytest.mark.parametrize("batch", [0, 1, 3, 8])
@pytest.mark.parametrize("vocab", [1, 7, 8, 9, 512, 1003, 32000])
def test_equals_the_python_path(batch, vocab):
    _same(_logits(batch, vocab, seed=batch * 7 + vocab))
    _same(_logits(batch, vocab, seed=vocab).round())      # rounding makes ties


@pytest.mark.parametrize("vocab", [5, 16, 37, 512])
def test_ties_take_the_first_maximum_in_the_body_and_the_tail(vocab):
    for first in sorted({0, 3, 7, 8, vocab // 2, vocab - 2, vocab - 1} - {-1}):
        for second in range(first + 1, vocab, max(1, vocab // 5)):
            x = torch.zeros(1, vocab)
            x[0, first] = x[0, second] = 2.5
            _same(x)
            assert greedy_sample(x, OPS).token_ids == [first]
    signed = torch.tensor([[-0.0, 0.0, -1.0] * 5])        # -0.0 == 0.0: the first one
    _same(signed)
    assert greedy_sample(signed, OPS).token_ids == [0]


@pytest.mark.parametrize("vocab", [6, 40, 512])
def test_nonfinite_rows_go_to_the_general_path_as_before(vocab):
    base = _logits(3, vocab, seed=vocab)
    masked = base.clone()
    masked[1, : vocab // 2] = float("-inf")                # a masked vocabulary: finite, stays fast
    _same(masked)
    assert greedy_sample(masked, OPS) is not None
    for row, col, value in ((0, 1, float("nan")), (2, vocab - 1, float("nan")), (1, 4, float("inf")),
                            (2, vocab - 2, float("inf"))):
        bad = base.clone()
        bad[row, col] = value
        assert greedy_sample(bad) is None and greedy_sample(bad, OPS) is None
        # the op's own token is torch.argmax's (a NaN counts as the maximum, the first one wins)
        bad[row, col // 2] = value
        assert OPS.greedy_logprobs(bad).tolist()[0::2] == [float(t) for t in bad.argmax(-1).tolist()]
    dead = base.clone()
    dead[2, :] = float("-inf")
    assert greedy_sample(dead) is None and greedy_sample(dead, OPS) is None
    assert OPS.greedy_logprobs(dead).tolist()[4] == 0.0    # all -inf: index 0, as torch.argmax


def test_non_contiguous_logits_and_bad_input():
    x = _logits(6, 64, seed=5).t().contiguous().t()         # a transposed view
    assert not x.is_contiguous()
    _same(x)
    with pytest.raises(RuntimeError, match="float32"):
        OPS.greedy_logprobs(x.double())
    with pytest.raises(RuntimeError, match="float32"):
        OPS.greedy_logprobs(torch.zeros(2, 0))


def _greedy_tokens(stories_dir, max_tokens: int):
    """One greedy request (16 prompt tokens, EOS ignored) on a fresh stories260K engine: (its generated
    token ids, the runner's ``_greedy_ops``)."""
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.loader import load_model
    from inferctl.engine.sampling_params import SamplingParams

    engine = LLMEngine(load_model(str(stories_dir / "stories260K.bin")), EngineConfig())
    engine.add_request("a", list(range(3, 19)), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                               ignore_eos=True))
    toks = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            toks.extend(o.new_token_ids)
    return toks, engine.runner._greedy_ops


def test_the_runner_takes_the_pick_from_the_op_or_greedy_sample(stories_dir, monkeypatch):
    from inferctl.engine import runner as runner_mod

    calls = []
    picks = []
    real = runner_mod.greedy_sample
    monkeypatch.setattr(runner_mod, "greedy_sample", lambda x, ops=None: calls.append(ops) or real(x, ops))
    real_pairs = runner_mod.greedy_from_pairs
    monkeypatch.setattr(runner_mod, "greedy_from_pairs", lambda p: picks.append(p) or real_pairs(p))

    def run(kernels: bool):
        monkeypatch.setenv(cpu_kernels.ENV, "1" if kernels else "0")
        return _greedy_tokens(stories_dir, 12)

    toks, ops = run(True)
    # wave 10: the fused op writes the pick of every decode step (greedy_out); greedy_sample is not called
    assert ops is OPS and not calls and len(picks) == 11
    assert [int(p[0]) for p in picks] == toks[1:]
    plain, ops = run(False)
    assert ops is None and len(calls) == 11 and all(c is None for c in calls) and len(picks) == 11
    assert toks == plain


def test_the_runner_falls_back_to_greedy_sample_when_the_op_has_no_head(stories_dir, monkeypatch):
    """A fused step whose classifier runs outside the op leaves greedy_out at its sentinel: the runner then
    calls greedy_sample with the kernels, and the tokens are those of the op's own pick."""
    from inferctl.engine import fused_decode
    from inferctl.engine import runner as runner_mod

    calls = []
    real = runner_mod.greedy_sample
    monkeypatch.setattr(runner_mod, "greedy_sample", lambda x, ops=None: calls.append(ops) or real(x, ops))

    def run(no_head: bool):
        if no_head:
            monkeypatch.setattr(fused_decode, "head_tensors", lambda model: None)
        return _greedy_tokens(stories_dir, 10)[0]

    with_head = run(False)
    assert not calls
    assert run(True) == with_head and len(calls) == 9 and all(c is OPS for c in calls)
