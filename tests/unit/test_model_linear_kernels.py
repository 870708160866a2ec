"""The batch-1 fp32 kernel choice of engine.linear_kernels and its use by engine.model.Linear."""

from __future__ import annotations

import time

import torch

from inferctl.engine import linear_kernels as lk
from inferctl.engine import model as model_mod
from inferctl.engine.model import Linear


def _big_weight() -> torch.Tensor:
    n_in = 256
    return torch.randn(lk.MIN_BYTES // 4 // n_in + 1, n_in)  # [out, in], just over MIN_BYTES


def test_small_weight_keeps_torch_without_measuring(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("measured a small weight")

    monkeypatch.setattr(lk, "numpy_matmul", boom)
    assert lk.choose_batch1_kernel(torch.randn(64, 128)) == "torch"
    assert lk.choose_batch1_kernel(torch.randn(256, 8192, dtype=torch.bfloat16)) == "torch"


def test_choice_follows_the_measurement(monkeypatch):
    w_t = _big_weight().t().contiguous()

    def slow(x, w_np):
        time.sleep(0.05)
        return torch.zeros(1, w_np.shape[1])

    monkeypatch.setattr(lk, "numpy_matmul", slow)
    assert lk.choose_batch1_kernel(w_t, trials=2) == "torch"
    monkeypatch.setattr(lk, "numpy_matmul", lambda x, w_np: None)   # "instant" numpy
    assert lk.choose_batch1_kernel(w_t, trials=2) == "numpy"


def test_numpy_kernel_matches_torch_and_is_used_at_batch_1_only(monkeypatch):
    monkeypatch.setenv("INFERCTL_CPU_KERNELS", "0")   # the numpy choice is the fallback layout's ("in_out")
    w = _big_weight()
    lin = Linear(w)
    lin.batch1_kernel = "numpy"
    calls = []
    real = model_mod.numpy_matmul
    monkeypatch.setattr(model_mod, "numpy_matmul", lambda x, w_np: calls.append(1) or real(x, w_np))
    x = torch.randn(1, w.shape[1])
    with torch.inference_mode():
        y = lin(x)
        assert calls == [1] and y.dtype == torch.float32 and y.shape == (1, w.shape[0])
        torch.testing.assert_close(y, x @ w.t(), rtol=1e-4, atol=1e-4)
        y2 = lin(torch.randn(2, w.shape[1]))          # batch 2: torch
    assert calls == [1] and y2.shape == (2, w.shape[0])


def test_quantize_and_restore_drop_the_numpy_view(monkeypatch):
    monkeypatch.setenv("INFERCTL_CPU_KERNELS", "0")
    lin = Linear(_big_weight())
    lin.batch1_kernel = "numpy"
    with torch.inference_mode():
        lin(torch.randn(1, lin.in_features))
    assert lin._w_np is not None
    full = lin.quantize_()
    assert lin._w_np is None
    lin.restore_(full)
    assert lin._w_np is None


def test_int8_fast_path_is_bit_identical_and_padded_weights_still_work():
    from inferctl.engine.quant import int8_matmul, quantize_per_channel

    g = torch.Generator().manual_seed(0)   # unseeded data failed the padded bf16-vs-fp32 comparison now and then
    q = quantize_per_channel(torch.randn(48, 64, generator=g))
    x = torch.randn(3, 64, generator=g)
    with torch.inference_mode():
        first = int8_matmul(x, q)              # checked path; caches that the kernel runs
        if q.kernel is not True:
            return                              # no int8 kernel in this torch build: nothing to compare
        fast = int8_matmul(x, q)
        ref = torch.mul(torch._weight_int8pack_mm(x.to(torch.bfloat16), q.qweight, q.unit_scales), q.scales)
        assert torch.equal(first, fast) and torch.equal(fast, ref) and fast.dtype == torch.float32
        qp = quantize_per_channel(torch.randn(8, 40, generator=g))   # K padded to 48: the checked path pads x
        xp = torch.randn(2, 40, generator=g)
        int8_matmul(xp, qp)
        torch.testing.assert_close(int8_matmul(xp, qp), xp @ qp.dequantize().t(), rtol=2e-2, atol=2e-2)
