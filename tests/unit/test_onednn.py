"""engine.onednn: oneDNN's fp32 GEMM for the CPU linears — the same products as torch's within fp32
rounding, the switch, the gemv crossover it sets, and the fused decode op honouring its mask bit."""

from __future__ import annotations

import pytest
import torch

from inferctl.engine import cpu_kernels, fused_decode, onednn
from inferctl.engine.attention import AttentionMetadata
from inferctl.engine.model import LlamaModel, ModelArgs, canonical_weight_names
from tests.model_helpers import Harness

needs_onednn = pytest.mark.skipif(not onednn.available(), reason="this torch has no usable oneDNN")
OPS = cpu_kernels.ops_for("cpu", torch.float32)


@pytest.fixture
def fresh_switch(monkeypatch):
    """``linear_op``'s per-process cache cleared before and after (the switch is read at first use)."""
    onednn.linear_op.cache_clear()
    yield monkeypatch
    onednn.linear_op.cache_clear()


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 64, 96), (7, 288, 768), (32, 384, 1024), (130, 1024, 384)])
def test_linear_is_x_times_w_transposed(shape):
    rows, k, n = shape
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    got, want = onednn.linear(x, w), x @ w.t()
    assert got.shape == (rows, n) and got.dtype == torch.float32
    # fp32 sums in another order: |Δ| within ~1e-6 of the products' scale (sqrt(k) for N(0, 1) data)
    assert (got - want).abs().max().item() <= 1e-6 * k


@needs_onednn
def test_batched_input_keeps_its_leading_dims():
    x, w = torch.randn(3, 5, 40), torch.randn(24, 40)
    got = onednn.linear(x, w)
    assert got.shape == (3, 5, 24)
    assert torch.allclose(got, x @ w.t(), rtol=1e-5, atol=1e-5)


def test_switch_off_is_torch_bit_for_bit(fresh_switch):
    fresh_switch.setenv(onednn.ENV, "off")
    assert onednn.linear_op() is None and not onednn.available()
    x, w = torch.randn(32, 384), torch.randn(1024, 384)
    assert torch.equal(onednn.linear(x, w), x @ w.t())


def test_a_failing_op_is_not_used(fresh_switch, caplog):
    """An op whose first-use check fails (here: raises) leaves torch's GEMM, with one warning."""
    class Broken:
        def _linear_pointwise(self, *a):
            raise RuntimeError("no primitive for this CPU")

    fresh_switch.setattr(torch.ops, "mkldnn", Broken())
    with caplog.at_level("WARNING", logger="inferctl.engine.onednn"):
        assert onednn.linear_op() is None
    assert "no primitive for this CPU" in caplog.text


def test_gemv_crossover_follows_onednn(fresh_switch):
    """Where oneDNN takes the product the gemv runs up to GEMV_MAX_ROWS rows whatever the weight size;
    a product under MIN_FLOPS, or no oneDNN: the MKL rules (gemv up to 16 rows at 2 threads, 64 for a
    DRAM-sized weight)."""
    fresh_switch.setattr(torch, "get_num_threads", lambda: 2)
    big, layer, tiny = cpu_kernels.GEMV_F32_ALL_ROWS_BYTES, 1024 * 384 * 4, 64 * 64 * 4
    assert not onednn.wins(16, tiny // 4)       # 0.13 MFLOP: MKL's
    assert cpu_kernels.f32_kernel_wins(16, tiny) and not cpu_kernels.f32_kernel_wins(17, tiny)
    if onednn.available():
        assert onednn.wins(onednn.GEMV_MAX_ROWS + 1, layer // 4)
        assert cpu_kernels.f32_kernel_wins(onednn.GEMV_MAX_ROWS, layer)
        assert not cpu_kernels.f32_kernel_wins(onednn.GEMV_MAX_ROWS + 1, layer)
        assert not cpu_kernels.f32_kernel_wins(onednn.GEMV_MAX_ROWS + 1, big)
    fresh_switch.setenv(onednn.ENV, "0")
    onednn.linear_op.cache_clear()
    assert not onednn.wins(64, layer // 4)
    assert cpu_kernels.f32_kernel_wins(cpu_kernels.MAX_BATCH_MT, layer)
    assert cpu_kernels.f32_kernel_wins(cpu_kernels.MAX_DECODE_BATCH, big)
    assert not cpu_kernels.f32_kernel_wins(cpu_kernels.MAX_DECODE_BATCH + 1, big)


@needs_onednn
def test_a_small_product_stays_on_torch_bit_for_bit():
    """Under MIN_FLOPS (stories260K's 64-wide layers) ``linear`` is torch's ``x @ w.T`` exactly."""
    x, w = torch.randn(32, 64), torch.randn(172, 64)
    assert 2 * 32 * w.numel() < onednn.MIN_FLOPS
    assert torch.equal(onednn.linear(x, w), x @ w.t())


@needs_onednn
@pytest.mark.skipif(OPS is None, reason="CPU kernels did not build here (no compiler/ninja)")
def test_fused_decode_runs_its_gemms_through_onednn_with_the_bit():
    """decode_layers with the oneDNN bits gives torch's GEMM result within fp32 rounding but not bit for bit
    (at these sizes oneDNN and MKL sum in different orders: the bit reached the C++)."""
    args = ModelArgs(dim=288, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=97, hidden_dim=768, max_seq_len=64)
    g = torch.Generator().manual_seed(3)
    model = LlamaModel(args, {n: torch.randn(s, generator=g) * (1.0 if n.endswith("norm.weight") else 0.05)
                              for n, s in canonical_weight_names(args).items()})
    h = Harness(model, block_size=4, num_blocks=32)
    n = 12
    meta = AttentionMetadata.build([([i], 0, 1, False) for i in range(n)], 4)
    meta.prepare(4)
    an, fn, w, s = fused_decode.layer_weights(model, h.cache, meta, n)
    x = torch.randn(n, args.dim, generator=g)
    cos, sin = model.rope_at(torch.zeros(n, dtype=torch.long), 6)
    mkl, dnn = (OPS.decode_layers(x, cos, sin, h.cache.k.clone(), h.cache.v.clone(), meta.slot_mapping,
                                  meta.block_tables, meta.seq_lens, an, fn, w, s, args.n_heads, args.n_kv_heads, 0,
                                  args.norm_eps, model.scale, mask)
                for mask in (0b1111, 0b1111 | 0b1111 << fused_decode.ONEDNN_SHIFT))
    assert not torch.equal(mkl, dnn)
    assert (mkl - dnn).abs().max().item() <= 1e-5 * max(1.0, mkl.abs().max().item())
