"""The fused decode op's attention: blocks within paged_attention.h's bounds go through
``inferctl_attn::attend_tile`` (a decode token as a tile of one, the prefill op's code); larger
blocks keep the two-pass loop. Both give the per-op path's logits, K/V and greedy tokens.

Tolerance as in test_fused_decode.py: the op sums in its own order (8-lane partial sums, online
softmax with an 8-lane exp), so logits agree to fp32 rounding, ``TOL_REL`` of the largest |logit|.
"""

from __future__ import annotations

import pytest
import torch

from inferctl.engine import cpu_kernels, fused_decode
from inferctl.engine.model import LlamaModel, ModelArgs, canonical_weight_names
from tests.model_helpers import decode_steps

OPS = cpu_kernels.ops_for("cpu", torch.float32)
needs_ops = pytest.mark.skipif(OPS is None, reason="CPU kernels did not build here (no compiler/ninja)")
TOL_REL = 1e-5
#: paged_attention.h's MAX_BLOCK_SIZE: one block's scores per head live on the stack
MAX_BLOCK_SIZE = 256


def _model(n_heads: int, n_kv_heads: int) -> LlamaModel:
    args = ModelArgs(dim=64, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads, vocab_size=97, hidden_dim=96,
                     max_seq_len=1024, rope_style="interleaved", tie_embeddings=True)
    g = torch.Generator().manual_seed(5)
    w = {n: torch.randn(s, generator=g) * (1.0 if n.endswith("norm.weight") else 0.3)
         for n, s in canonical_weight_names(args).items()}
    return LlamaModel(args, w)


def _decode(model, fused: bool, monkeypatch, prompts, n_decode: int, block_size: int):
    """tests.model_helpers.decode_steps, all sequences together, plus the number of fused-op calls."""
    calls = []
    real = fused_decode.decode_tokens
    with monkeypatch.context() as mp:
        mp.setattr(fused_decode, "decode_tokens", lambda *a, **k: calls.append(1) or real(*a, **k))
        logits, toks, h = decode_steps(model, fused, mp, prompts, n_decode, block_size)
    return logits, toks, h, len(calls)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    diff = (a - b).abs().max().item()
    assert diff <= TOL_REL * max(1.0, b.abs().max().item()), diff


@needs_ops
@pytest.mark.parametrize("block_size", [4, 16, MAX_BLOCK_SIZE, MAX_BLOCK_SIZE + 44])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (8, 1)])
def test_fused_attention_equals_per_op(monkeypatch, block_size, heads):
    """Three sequences of 3 / 40 / 290 prompt tokens (several blocks, a partial last block; past one
    block of MAX_BLOCK_SIZE), GQA groups of 2, 1 and 8 query heads per KV head; block sizes within
    the tile's bounds and past them (the two-pass loop)."""
    model = _model(*heads)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (3, 40, 290)]
    fused, ft, hf, calls = _decode(model, True, monkeypatch, prompts, 6, block_size)
    plain, pt, hp, plain_calls = _decode(model, False, monkeypatch, prompts, 6, block_size)
    assert (calls, plain_calls) == (6, 0)      # every decode step took the fused op; none on the per-op side
    assert ft == pt
    _close(fused, plain)
    _close(hf.cache.k, hp.cache.k)
    _close(hf.cache.v, hp.cache.v)
