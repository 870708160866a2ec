"""The C++ paged_attention op's stack bounds are in its one predicate (engine.attention.kernel_eligible):
a cache past them keeps the plain path instead of failing the step. Before, an engine with
``block_size`` 512 failed every request at its prefill ("block_size 512 > 256" from the op)."""

from __future__ import annotations

import pytest
import torch

from inferctl.engine import cpu_kernels
from inferctl.engine.attention import KERNEL_MAX_BLOCK_SIZE, KVCache, kernel_eligible
from tests.core_helpers import drain

OPS = cpu_kernels.ops_for("cpu", torch.float32)
needs_ops = pytest.mark.skipif(OPS is None, reason="CPU kernels did not build here (no compiler/ninja)")


def _cache(block_size: int, kv_heads: int = 2, head_dim: int = 8) -> KVCache:
    shape = (1, kv_heads, 2, block_size, head_dim)
    return KVCache(torch.zeros(shape), torch.zeros(shape))


@needs_ops
def test_the_predicate_stops_at_the_ops_own_bounds():
    q = torch.zeros(3, 4, 8)
    assert kernel_eligible(OPS, q, _cache(KERNEL_MAX_BLOCK_SIZE))
    assert not kernel_eligible(OPS, q, _cache(KERNEL_MAX_BLOCK_SIZE + 1))
    assert kernel_eligible(OPS, torch.zeros(3, 128, 8), _cache(16, kv_heads=2))       # 64 per KV head
    assert not kernel_eligible(OPS, torch.zeros(3, 130, 8), _cache(16, kv_heads=2))   # 65 per KV head
    # the constant is the op's: one past it, the op itself refuses
    c = _cache(KERNEL_MAX_BLOCK_SIZE + 1)
    one = torch.zeros(1, dtype=torch.long)
    with pytest.raises(RuntimeError, match="block_size"):
        OPS.paged_attention(torch.zeros(1, 4, 8), c.k, c.v, 0, one.view(1, 1), torch.tensor([0, 1]),
                            torch.ones(1, dtype=torch.long), 1.0)


@needs_ops
def test_an_engine_with_large_blocks_serves_the_same_tokens(stories_dir):
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.loader import load_model
    from inferctl.engine.sampling_params import SamplingParams

    def tokens(block_size: int) -> list[int]:
        engine = LLMEngine(load_model(str(stories_dir / "stories260K.bin")), EngineConfig(block_size=block_size))
        engine.add_request("a", list(range(3, 19)), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        return drain(engine)[0]["a"]

    small = tokens(16)
    assert len(small) == 8
    assert tokens(512) == small
