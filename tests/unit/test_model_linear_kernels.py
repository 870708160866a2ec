"""engine.model.Linear's kernel choice without the CPU kernels (torch only, never numpy's BLAS) and
the int8 fast path of engine.quant."""

from __future__ import annotations

import numpy as np
import torch

from inferctl.engine import cpu_kernels as ck
from inferctl.engine.model import Linear


def test_fallback_layout_runs_torch_at_batch_1_never_numpy(monkeypatch):
    """A weight over the old 16 MiB numpy threshold, kernels off: batch 1 is ``x @ W`` on torch's pool.

    numpy's OpenBLAS pool spinning beside torch's OpenMP pool made a 2-thread step 2.75× slower
    (docs/performance.md); this fails if any Linear path reaches np.matmul again."""
    monkeypatch.setenv("INFERCTL_CPU_KERNELS", "0")

    def boom(*a, **k):
        raise AssertionError("numpy BLAS on the hot path")

    monkeypatch.setattr(np, "matmul", boom)
    monkeypatch.setattr(np, "dot", boom)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16 * 1024 * 1024 // 4 // 256 + 1, 256, generator=g)   # [out, in], just over 16 MiB
    lin = Linear(w)
    assert lin.layout == "in_out"
    x = torch.randn(1, 256, generator=g)
    with torch.inference_mode():
        for _ in range(2):
            y = lin(x)
            assert y.shape == (1, w.shape[0]) and torch.equal(y, x @ lin.weight)
    torch.testing.assert_close(y, x @ w.t(), rtol=1e-4, atol=1e-4)


def test_one_predicate_decides_every_kernel_input():
    x = torch.randn(3, 8)
    assert ck.eligible(x) and ck.eligible(x, 3) and not ck.eligible(x, 2)
    assert not ck.eligible(x.t())                       # not contiguous
    assert not ck.eligible(x.to(torch.bfloat16))
    assert not ck.eligible(x[None])                     # 3-D
    assert not ck.eligible(x.clone().requires_grad_())
    assert ck.eligible(torch.randn(ck.MAX_BATCH, 4), ck.MAX_BATCH)
    assert not ck.eligible(torch.randn(ck.MAX_BATCH + 1, 4), ck.MAX_BATCH)


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
