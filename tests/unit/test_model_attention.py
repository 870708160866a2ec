"""Paged attention reads K/V blocks in place (issue 12): views of the pool, block-granular gathers."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from inferctl.engine.attention import AttentionMetadata, KVCache, paged_attention

H, HKV, D, BS, NB = 4, 2, 8, 4, 40


def _cache(kv_int8: bool = False) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(NB * BS, HKV, D, generator=g)
    v = torch.randn(NB * BS, HKV, D, generator=g)
    cache = KVCache.allocate(1, NB, BS, HKV, D, torch.float32, "cpu", kv_int8=kv_int8)
    cache.write(0, torch.arange(NB * BS), k, v)
    return cache, k, v


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: list[int], length: int) -> torch.Tensor:
    slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(length)])
    kk = k[slots].transpose(0, 1).repeat_interleave(H // HKV, 0)   # [H, L, D]
    vv = v[slots].transpose(0, 1).repeat_interleave(H // HKV, 0)
    p = torch.softmax((q[:, None, :] @ kk.transpose(-1, -2))[:, 0] * D ** -0.5, -1)
    return (p[:, None, :] @ vv)[:, 0]


def test_consecutive_blocks_are_read_as_a_view_of_the_pool():
    cache, _, _ = _cache()
    k, v = cache.read_blocks(0, torch.tensor([3, 4, 5]), 3, torch.float32)
    assert k.shape == (HKV, 3 * BS, D)
    assert k.untyped_storage().data_ptr() == cache.k.untyped_storage().data_ptr()   # no copy
    assert v.untyped_storage().data_ptr() == cache.v.untyped_storage().data_ptr()
    gathered, _ = cache.read_blocks(0, torch.tensor([3, 4, 5]), None, torch.float32)
    assert torch.equal(k, gathered)


@pytest.mark.parametrize("impl", ["matmul", "sdpa"])
@pytest.mark.parametrize("kv_int8", [False, True])
def test_decode_over_shuffled_and_consecutive_tables_equals_the_reference(impl, kv_int8):
    cache, k, v = _cache(kv_int8)
    if kv_int8:   # the reference reads what the int8 pool holds
        k, v = (cache.read_blocks(0, torch.arange(NB), 0, torch.float32)[i].transpose(0, 1) for i in (0, 1))
    rng = random.Random(1)
    for tables in ([list(range(7, 12))], [rng.sample(range(NB), 5), rng.sample(range(NB), 3), [9]]):
        lens = [len(t) * BS - rng.randrange(BS) for t in tables]
        meta = AttentionMetadata.build([(t, n - 1, 1, False) for t, n in zip(tables, lens)], BS)
        meta.prepare_plain(BS)
        assert (meta.decode_first_block == 7) == (len(tables) == 1)
        q = torch.randn(len(tables), H, D, generator=torch.Generator().manual_seed(2))
        out = paged_attention(q, cache, 0, meta, D ** -0.5, impl)
        for b, (t, n) in enumerate(zip(tables, lens)):
            assert torch.allclose(out[b], _reference(q[b], k, v, t, n), atol=1e-5), (tables, b)


def test_prefill_chunk_over_a_shuffled_table_equals_sdpa():
    cache, k, v = _cache()
    table, cached, new = [17, 3, 30], 5, 6
    meta = AttentionMetadata.build([(table, cached, new, True)], BS)
    q = torch.randn(new, H, D, generator=torch.Generator().manual_seed(3))
    out = paged_attention(q, cache, 0, meta, D ** -0.5)
    slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(cached + new)])
    mask = torch.arange(cached + new)[None, :] <= torch.arange(cached, cached + new)[:, None]
    ref = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[slots].transpose(0, 1)[None],
                                         v[slots].transpose(0, 1)[None], attn_mask=mask, enable_gqa=True)
    assert torch.allclose(out, ref[0].transpose(0, 1), atol=1e-5)


@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_in_four_ops_is_bit_identical_to_the_reference(style, dtype):
    from inferctl.engine.model import _rope_cos_sin, apply_rope, apply_rope_tables, rope_tables

    x = torch.randn(7, 5, 64, generator=torch.Generator().manual_seed(4)).to(dtype)
    cos, sin = _rope_cos_sin(torch.arange(1000, 1007), 64, 10000.0)
    assert torch.equal(apply_rope_tables(x, *rope_tables(cos, sin, style), style), apply_rope(x, cos, sin, style))


def test_cpu_bf16_support_is_read_from_the_cpu_flags():
    from inferctl.engine.model import cpu_bf16_supported

    assert cpu_bf16_supported("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_bf16_supported("flags : sse avx2 amx_bf16 amx_tile\n")
    assert not cpu_bf16_supported("flags\t\t: fpu avx2 avx512f avx512bw\n")
