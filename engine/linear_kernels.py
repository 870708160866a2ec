"""The fp32 CPU kernel of a batch-1 linear, chosen per weight by measuring both at first use.

At batch 1 a linear is a matrix-vector product that streams its weight once, so its speed is
the kernel's streaming rate. On the project CPU the torch path (``x @ W``, MKL/oneDNN) read
the 384×32000 output layer at ~31 GB/s where numpy's OpenBLAS (``np.matmul`` on a shared-memory
view of the same tensor, no copy) ran 2.4× faster (docs/performance.md, "Kernels on the same
shapes"); on other shapes and CPUs torch wins. So the engine measures, per weight, once:
:func:`choose_batch1_kernel` times both kernels on the real weight (alternating, best of
``trials``) and keeps the faster. Weights under :data:`MIN_BYTES` stay on torch (per-call
overhead decides there, and the models the tests' greedy references come from stay on the
kernel they were made with).

The two kernels sum in different orders, so their results differ in the last bits (fp32
rounding, ~1e-6 relative); greedy outputs of a model whose top-2 logits are that close can
differ between the kernels, as they already can between torch's batch-1 and batch-N kernels.

This choice applies to the plain-PyTorch layout only (``Linear.layout == "in_out"``): where the
engine's own CPU kernels are built (engine.cpu_kernels), small batches run their GEMV instead.
"""

from __future__ import annotations

import time

import numpy as np
import torch

#: Weights smaller than this (bytes) are not measured and keep the torch kernel: the numpy
#: kernel runs on OpenBLAS's own thread pool, and handing every layer's small linears back and
#: forth between that pool and torch's (each spins a while after its call) cost more than it
#: saved on the shared 2-core machine (step CPU 17.4 vs 15.2 ms with the 1.6-3.1 MB layer
#: linears eligible). The output layer of a 32k vocabulary (49 MB at dim 384) qualifies.
MIN_BYTES = 16 * 1024 * 1024
#: numpy must beat torch by this factor to be chosen (measurement noise must not flip the kernel).
MARGIN = 1.2
KERNELS = ("torch", "numpy")


def numpy_matmul(x: torch.Tensor, w_np: np.ndarray) -> torch.Tensor:
    """``x [1, in] float32 (CPU, contiguous) @ w_np [in, out]`` → torch float32 [1, out] via numpy's BLAS.

    ``w_np`` is a numpy view sharing the weight tensor's memory (``weight_t.numpy()``)."""
    return torch.from_numpy(np.matmul(x.numpy(), w_np))


def numpy_eligible(x: torch.Tensor, weight_t: torch.Tensor) -> bool:
    """Whether the numpy kernel can run this product: fp32 CPU tensors, x [1, in] contiguous."""
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.float32 and weight_t.dtype == torch.float32
            and x.device.type == "cpu" and weight_t.device.type == "cpu" and x.is_contiguous()
            and not x.requires_grad)


def choose_batch1_kernel(weight_t: torch.Tensor, trials: int = 5) -> str:
    """"torch" or "numpy": the faster batch-1 kernel for ``weight_t`` [in, out] fp32 on CPU.

    Times ``x @ weight_t`` and :func:`numpy_matmul` on a random ``x`` [1, in], alternating, the
    best of ``trials`` wall-clock times each (the least disturbed run on a shared machine);
    numpy only when :data:`MARGIN` times faster. Weights under :data:`MIN_BYTES`, non-fp32 or
    non-CPU weights → "torch" without measuring."""
    if (weight_t.device.type != "cpu" or weight_t.dtype != torch.float32
            or weight_t.numel() * weight_t.element_size() < MIN_BYTES):
        return "torch"
    w_np = weight_t.numpy()
    x = torch.randn(1, weight_t.shape[0], dtype=torch.float32)
    runs = {"torch": lambda: x @ weight_t, "numpy": lambda: numpy_matmul(x, w_np)}
    best = {k: float("inf") for k in runs}
    for fn in runs.values():
        fn()
    for _ in range(max(1, trials)):
        for k, fn in runs.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return "numpy" if best["numpy"] * MARGIN < best["torch"] else "torch"
