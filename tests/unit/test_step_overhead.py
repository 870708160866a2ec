"""Per-step work outside the linears (issue 12): RoPE from a table built once, batch-1 decode
attention without mask tensors, and the same numbers as the general paths."""

from __future__ import annotations

import pytest
import torch

from inferctl.engine.attention import AttentionMetadata, KVCache, paged_attention
from inferctl.engine.loader import load_llama2c
from inferctl.engine.model import ModelArgs, _rope_cos_sin, rope_tables
from tests.model_helpers import Harness

H, HKV, D, BS, NB = 4, 2, 8, 4, 40


@pytest.fixture(scope="module")
def stories(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin")


def _pool(kv_int8: bool = False) -> KVCache:
    g = torch.Generator().manual_seed(0)
    cache = KVCache.allocate(1, NB, BS, HKV, D, torch.float32, "cpu", kv_int8=kv_int8)
    cache.write(0, torch.arange(NB * BS), torch.randn(NB * BS, HKV, D, generator=g),
                torch.randn(NB * BS, HKV, D, generator=g))
    return cache


@pytest.mark.parametrize("style,scaling", [("interleaved", None), ("half", None), ("half", "llama3"),
                                           ("interleaved", "linear")])
def test_rope_rows_from_the_table_are_bit_identical_to_the_step_computation(stories, style, scaling):
    from inferctl.engine.model import LlamaModel

    args = ModelArgs(**{**stories.args.to_dict(), "rope_style": style, "rope_scaling_type": scaling,
                        "rope_scaling_factor": 8.0 if scaling else 1.0, "rope_original_max_seq_len": 64})
    model = LlamaModel(args, stories.model.export_weights())
    for positions in (torch.tensor([0]), torch.tensor([255]), torch.randint(0, 3000, (37,)),
                      torch.arange(5, 300)):
        n = int(positions.max()) + 1
        cos, sin = model.rope_at(positions, n)
        want = rope_tables(*_rope_cos_sin(positions, args.head_dim, args.rope_theta, args), style)
        assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])
        assert cos.shape == (len(positions), 1, args.head_dim)
    # the table grew to a power of two covering the longest context, and is reused below it
    table = model._rope_table
    assert table[0].shape[0] == 4096
    model.rope_at(torch.tensor([17]), 18)
    assert model._rope_table is table


def test_a_decode_step_computes_no_rope_angles_and_no_mask_at_batch_1(stories):
    from torch.profiler import profile

    h = Harness(stories.model, block_size=16)
    prompt = stories.tokenizer.encode("The cat sat on the mat")
    h.step([(0, prompt, False)])
    with profile() as prof:
        h.step([(0, [400], False)])
    ops = {e.key for e in prof.key_averages()}
    # before: cos/sin/pow of the step's angles and a [1, L] 0/-inf bias (zeros, masked_fill) every step
    assert not ops & {"aten::cos", "aten::sin", "aten::pow", "aten::masked_fill_", "aten::zeros"}, ops
    # the RoPE rows come from the table: two index_select in the per-op path; none where the fused op runs
    # (it reads the table rows and the embedding row of the step's positions and ids itself, issue 12 wave 9)
    assert ("aten::index_select" in ops) == (stories.model.kernel_ops is None)


@pytest.mark.parametrize("table", [[7, 8, 9], [3, 17, 5]])
def test_batch_1_decode_equals_the_same_row_of_a_masked_batch_bit_for_bit(table):
    cache = _pool()
    q = torch.randn(2, H, D, generator=torch.Generator().manual_seed(2))
    one = AttentionMetadata.build([(table, 9, 1, False)], BS)
    two = AttentionMetadata.build([(table, 9, 1, False), ([20, 1, 30], 11, 1, False)], BS)
    assert one.decode_bias is None and two.decode_bias is None      # gather-path fields wait for the plain path
    one.prepare_plain(BS)
    two.prepare_plain(BS)
    assert one.decode_bias is None and one.decode_len == 10 and two.decode_bias is not None
    assert (one.decode_blocks is None) == (table == [7, 8, 9])      # consecutive: read in place
    o1 = paged_attention(q[:1], cache, 0, one, D ** -0.5, "matmul")
    o2 = paged_attention(q, cache, 0, two, D ** -0.5, "matmul")
    assert torch.equal(o1[0], o2[0])
    # sdpa (the CUDA default) reads exactly the context instead of masking: equal within rounding
    s1 = paged_attention(q[:1], cache, 0, one, D ** -0.5, "sdpa")
    assert torch.allclose(s1[0], o2[0], atol=1e-6)


def test_batch_1_decode_over_a_shuffled_int8_pool_matches_the_batched_path():
    cache = _pool(kv_int8=True)
    q = torch.randn(2, H, D, generator=torch.Generator().manual_seed(3))
    one = AttentionMetadata.build([([3, 17, 5], 10, 1, False)], BS)
    two = AttentionMetadata.build([([3, 17, 5], 10, 1, False), ([6], 2, 1, False)], BS)
    assert torch.equal(paged_attention(q[:1], cache, 0, one, D ** -0.5)[0],
                       paged_attention(q, cache, 0, two, D ** -0.5)[0])
