"""GGUF-block int4 linears (engine/q4_kernels.py, engine/csrc/q4_kernels.cpp): the blocks are the
file's, the C++ kernel equals dequantize + matmul, and int4 mode keeps every layer linear 4-bit
(the classifier int8)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from inferctl.engine import cpu_kernels
from inferctl.engine import q4_kernels as q4
from inferctl.engine.quant_int4 import Int4Weight, q4_ops

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def ops():
    o = q4_ops("cpu")
    if o is None:
        pytest.skip("engine CPU kernels not built here (no compiler or INFERCTL_CPU_KERNELS=0)")
    return o


def _gguf_weight(qtype: str, n: int, k: int, seed: int = 1):
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    t = gguf.GGMLQuantizationType[qtype]
    data = gguf.quants.quantize(w, t)
    return q4.from_gguf([SimpleNamespace(ggml_type=qtype, data=data, shape=w.shape)]), gguf.quants.dequantize(data, t)


def _bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 summation-order tolerance: 1e-5 · Σ|x·w| per output (the two sums differ only in the
    order of K fp32 additions, error ≤ K·2⁻²⁴·Σ|x·w| ≈ 1e-4 at K = 1536 in the worst case, ~1e-6
    typical; 1e-5 is far below any weight change: one code step moves an output by d·|x|)."""
    return 1e-5 * (x.abs() @ w.abs().t()) + 1e-30


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_blocks_dequantize_exactly_as_gguf(qtype):
    w, ref = _gguf_weight(qtype, 24, 576)   # K = 576: a multiple of 32, not of 256
    assert w.blocks.shape == (24, 18 * 20) and w.nbytes() == q4.q4_weight_nbytes(24, 576) == 24 * 18 * 20
    assert np.array_equal(w.dequantize().numpy(), ref)     # d·q + m in fp32, bit for bit


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("k", [96, 576, 1536])
def test_kernel_equals_dequantize_matmul(ops, qtype, k):
    w, ref = _gguf_weight(qtype, 40, k)
    wf = torch.from_numpy(ref)
    for b in (1, 2, 3, 4, 5, 8, 13, 32, q4.GEMM_ROWS + 1):
        x = torch.randn(b, k, generator=torch.Generator().manual_seed(b))
        want = (x.double() @ wf.double().t()).float()
        got = q4.matmul(ops, x, w)
        assert got.shape == (b, 40) and got.dtype == torch.float32
        assert ((got - want).abs() <= _bound(x, wf)).all(), (b, (got - want).abs().max())
        # the plain-PyTorch fallback computes the same product
        assert ((q4.matmul(None, x, w) - want).abs() <= _bound(x, wf)).all()


def test_k_not_a_multiple_of_32(ops):
    wf = torch.randn(20, 70, generator=torch.Generator().manual_seed(3))
    w = q4.quantize(wf)                      # K padded to 96 in the blocks, 3 blocks per row
    assert w.blocks.shape == (20, 60) and w.in_features == 70
    deq = w.dequantize()
    # half a step (max - min)/30 per group, plus fp16 rounding of d and m
    assert (deq - wf).abs().max() <= (wf.max() - wf.min()) / 30 * 1.05
    x = torch.randn(3, 70, generator=torch.Generator().manual_seed(4))
    assert ((q4.matmul(ops, x, w) - x @ deq.t()).abs() <= _bound(x, deq)).all()
    assert torch.equal(ops.q4_dequant(w.blocks, 70), deq)   # the long-prefill path's weight, bit for bit


def test_kernel_checks_its_inputs(ops):
    w, _ = _gguf_weight("Q4_1", 8, 64)
    with pytest.raises(RuntimeError, match="features"):
        ops.q4_matmul(torch.randn(1, 32), w.blocks, 64)
    with pytest.raises(RuntimeError, match="bytes per row"):
        ops.q4_matmul(torch.randn(1, 96), w.blocks, 96)
    with pytest.raises(RuntimeError, match="float32"):
        ops.q4_matmul(torch.randn(1, 64, dtype=torch.float64), w.blocks, 64)
    with pytest.raises(ValueError, match="features"):
        q4.matmul(ops, torch.randn(2, 63), w)
    with pytest.raises(ValueError, match="Q8_0"):
        q4.from_gguf([SimpleNamespace(ggml_type="Q8_0", data=np.zeros(34, np.uint8), shape=(1, 32), name="t")])


def test_int4_mode_keeps_layer_linears_4bit_and_the_tied_classifier_int8(ops):
    from inferctl.engine.loader import build_demo_model
    from inferctl.engine.quant import Int8Weight, int8_weight_nbytes

    m = build_demo_model().model
    ids = torch.tensor([5, 9, 200])
    cls = m.output.weight_t.t().clone()
    by_mode = m.weight_bytes_by_mode()
    m.set_precision("int4")
    lins = [getattr(b, a) for b in m.layers for a in ("wqkv", "wo", "w13", "w2")]
    assert all(isinstance(lin.q, q4.Q4Weight) and lin.weight_t is None for lin in lins)
    assert isinstance(m.output.q, Int8Weight) and m.output.weight_t is None
    assert m.tok_embeddings is None and m.tok_embeddings_q is None     # tied: rows of the int8 classifier
    assert m.weight_bytes() == by_mode["int4"] < by_mode["int8"]
    assert m.output.nbytes() == int8_weight_nbytes(*cls.shape)
    emb = m.embed(ids)
    # int8 per row: |error| <= half a step of the row's absmax/127
    step = cls[ids].abs().amax(dim=1, keepdim=True) / 127
    assert ((emb - cls[ids]).abs() <= step / 2 * 1.001 + 1e-7).all()


def test_without_kernels_int4_mode_is_torchs_int4_layout(monkeypatch):
    from inferctl.engine.loader import build_demo_model
    from inferctl.engine.quant import Int8Weight

    monkeypatch.setenv(cpu_kernels.ENV, "0")
    assert q4_ops("cpu") is None
    m = build_demo_model().model
    by_mode = m.weight_bytes_by_mode()
    m.set_precision("int4")
    assert isinstance(m.layers[0].wqkv.q, Int4Weight) and isinstance(m.output.q, Int8Weight)
    assert m.weight_bytes() == by_mode["int4"]
