"""int8 weight-only quantization (per-output-channel symmetric absmax) and int8 KV helpers.

Weights: each output channel ``j`` of a linear layer gets one float32 scale
``s_j = max_i |W[j, i]| / 127`` and ``Wq[j, i] = round(W[j, i] / s_j)`` clamped to [-127, 127];
``y = x @ Wq.T * s``. This is the symmetric absmax ("vector-wise") weight quantization of
LLM.int8() (Dettmers et al., 2022, arXiv:2208.07339, §3) used weight-only, as in
weight-only int8 inference (e.g. TensorRT-LLM / torchao ``int8_weight_only``): activations stay
in floating point, so there is no outlier decomposition.

The product runs through ``torch._weight_int8pack_mm`` (a fused int8-weight GEMM in
PyTorch ≥ 2.2, weights ``[out, in]`` int8, scales ``[out]``), which reads 1 byte per weight,
with bf16 activations (see ``int8_matmul``); it falls back to dequantize-then-matmul where
the kernel is missing or rejects the input. ``bench_int8_vs_full`` is the measurement that
chose it.
Where the engine's CPU kernels are built (engine.cpu_kernels), ``engine.model.Linear`` runs
batches of up to 64 rows (``cpu_kernels.MAX_BATCH_INT8``) through their ``gemv_int8`` instead
(fp32 activations, the same ``qweight``/``scales``); this module's product serves larger batches
(through the same ``gemv_int8`` in calls of 64 rows where the kernels are built, since wave 9)
and the fallback.

KV: per-token-per-head absmax, ``scale = max_d |x[d]| / 127`` over ``head_dim``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from inferctl.engine import cpu_kernels

QMAX = 127.0
K_ALIGN = 16
"""``torch._weight_int8pack_mm`` on the project CPU (torch 2.13, AVX512 build) segfaults or
returns wrong sums when the inner dimension K is not a multiple of 16 (probed for M 1..33,
K 8..264, N 1..513: every K % 16 == 0 case was right, K ∈ {8, 20, 24, 40, 172, 264…} crashed or
was wrong). Quantized weights are therefore zero-padded along K to a multiple of 16, and the
activations padded to match; zero columns add nothing to the product."""


@dataclass
class Int8Weight:
    """A quantized linear weight: ``qweight`` int8 [out, in_padded], ``scales`` float32 [out].

    ``in_padded`` is ``in_features`` rounded up to a multiple of ``K_ALIGN`` with zero
    columns (see ``K_ALIGN``); ``kernel`` caches whether ``torch._weight_int8pack_mm`` works for this weight's device
    (None = not tried yet); ``unit_scales`` are the bf16 ones handed to the kernel (the real
    float32 scales are applied to its output, so they are not rounded to bf16).
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    in_features: int = -1
    kernel: bool | None = None
    unit_scales: torch.Tensor | None = None

    def nbytes(self) -> int:
        """int8 weight bytes (with K padding) + float32 scales + bf16 unit scales (if any)."""
        n = self.qweight.numel() + self.scales.numel() * self.scales.element_size()
        if self.unit_scales is not None:
            n += self.unit_scales.numel() * self.unit_scales.element_size()
        return n

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W ≈ qweight · scales[:, None] as [out, in] in ``dtype``."""
        q = self.qweight[:, : self.in_features]
        return (q.to(torch.float32) * self.scales[:, None]).to(dtype)

    def __post_init__(self) -> None:
        if self.in_features < 0:
            self.in_features = int(self.qweight.shape[1])


def quantize_per_channel(w_out_in: torch.Tensor) -> Int8Weight:
    """Quantize a weight laid out [out, in] (any float dtype) to int8 with one scale per row.

    All-zero rows get scale 1 (so they dequantize to exact zeros, never NaN). Raises
    ValueError for a non-2-D input.
    """
    if w_out_in.dim() != 2:
        raise ValueError(f"quantize_per_channel expects a 2-D [out, in] weight, got shape {tuple(w_out_in.shape)}")
    w = w_out_in.detach().to(torch.float32)
    absmax = w.abs().amax(dim=1)
    scales = torch.where(absmax > 0, absmax / QMAX, torch.ones_like(absmax))
    q = torch.clamp(torch.round(w / scales[:, None]), -QMAX, QMAX).to(torch.int8)
    k = w.shape[1]
    pad = (-k) % K_ALIGN
    if pad:
        q = torch.nn.functional.pad(q, (0, pad))
    return Int8Weight(qweight=q.contiguous(), scales=scales.contiguous(), in_features=k,
                      unit_scales=torch.ones(scales.shape[0], dtype=torch.bfloat16, device=w.device))


def int8_weight_nbytes(out_features: int, in_features: int) -> int:
    """Bytes of :func:`quantize_per_channel`'s result for an [out, in] weight: int8 weights
    (K padded to ``K_ALIGN``) + float32 scales + the kernel's bf16 unit scales."""
    k = in_features + (-in_features) % K_ALIGN
    return out_features * k + out_features * 4 + out_features * 2


def int8_matmul(x: torch.Tensor, w: Int8Weight, use_kernel: bool = True) -> torch.Tensor:
    """y = x @ dequant(w).T for x [..., in] → [..., out] in x's dtype.

    Engine kernel path (``use_kernel``, a contiguous 2-D float32 CPU ``x`` of more than
    ``cpu_kernels.MAX_BATCH_INT8`` rows — the prefill chunks ``engine.model.Linear`` sends here —
    and the CPU kernels built): ``cpu_kernels.gemv_int8`` in calls of ``MAX_BATCH_INT8`` rows
    (activations rounded per block of 32, llama.cpp Q8_0; measured 2026-12-02, wave 9, 65-256 rows:
    2.1-3.5× less CPU than the bf16 kernel below on the synthetic model's shapes, and the 32-mixed
    int8 run spent about a third of its CPU in that kernel's prefills). Raises RuntimeError (from the
    op) on bad input there.
    Torch kernel path (``use_kernel``, where it runs, e.g. without the CPU kernels or on CUDA):
    ``_weight_int8pack_mm(x.bf16, qweight, ones) · scales``. On the project CPU the kernel is
    vectorized only for bf16/fp16 activations (with float32 activations it was 5–30× slower than an
    fp32 matmul: 250 µs vs 19 µs for [1×384]@[384×1024], 8.4 ms vs 0.29 ms at batch 32), so
    activations are rounded to bf16 for this product. Fallback: dequantize-then-matmul in x's dtype.
    """
    if (use_kernel and x.dim() == 2 and x.shape[0] > cpu_kernels.MAX_BATCH_INT8 and x.shape[1] == w.in_features
            and w.qweight.device.type == "cpu" and cpu_kernels.eligible(x)):
        ops = cpu_kernels.ops_for(x.device, x.dtype)
        if ops is not None:   # prefill chunks of more than 64 rows: the engine's Q8_0 kernel, 64 rows a call
            step = cpu_kernels.MAX_BATCH_INT8
            return torch.cat([cpu_kernels.gemv_int8(ops, x[i:i + step], w.qweight, w.scales, w.in_features)
                              for i in range(0, x.shape[0], step)])
    if (w.kernel is True and use_kernel and x.dtype is torch.float32 and x.dim() == 2
            and x.shape[1] == w.qweight.shape[1] == w.in_features and x.is_contiguous()):
        # Fast path once the kernel has run for this weight: the same three ops as below (cast,
        # kernel, fp32 scales), without the per-call checks (~20 µs of Python per call measured).
        return torch.mul(torch._weight_int8pack_mm(x.to(torch.bfloat16), w.qweight, w.unit_scales), w.scales)
    if x.shape[-1] != w.in_features:
        raise ValueError(f"int8_matmul: input has {x.shape[-1]} features, weight expects {w.in_features}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    y = None
    kpad = w.qweight.shape[1]
    if (use_kernel and w.kernel is not False and kpad % K_ALIGN == 0
            and hasattr(torch, "_weight_int8pack_mm")):
        xb = x2.to(torch.bfloat16)
        if kpad != w.in_features:
            xb = torch.nn.functional.pad(xb, (0, kpad - w.in_features))
        xb = xb.contiguous()
        if w.unit_scales is None or w.unit_scales.device != x2.device:
            w.unit_scales = torch.ones(w.scales.shape[0], dtype=torch.bfloat16, device=x2.device)
        if w.kernel is None:
            try:
                y = torch._weight_int8pack_mm(xb, w.qweight, w.unit_scales)
                w.kernel = True
            except (RuntimeError, NotImplementedError):
                w.kernel = False
                w.unit_scales = None
        else:
            y = torch._weight_int8pack_mm(xb, w.qweight, w.unit_scales)
        if y is not None:
            y = torch.mul(y, w.scales)  # bf16 · fp32 → fp32
            if y.dtype != x.dtype:
                y = y.to(x.dtype)
    if y is None:
        y = (x2 @ w.qweight[:, : w.in_features].to(x2.dtype).t()) * w.scales.to(x2.dtype)
    return y.reshape(*lead, y.shape[-1])


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-per-head int8: x [..., head_dim] → (int8 [..., head_dim], float32 scale [...])."""
    xf = x.to(torch.float32)
    absmax = xf.abs().amax(dim=-1)
    scale = torch.where(absmax > 0, absmax / QMAX, torch.ones_like(absmax))
    q = torch.clamp(torch.round(xf / scale[..., None]), -QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize_kv`: int8 [..., D] · scale [...] → ``dtype``."""
    return (q.to(torch.float32) * scale[..., None]).to(dtype)


def bench_int8_vs_full(in_features: int = 384, out_features: int = 1024, batch: int = 1,
                       iters: int = 200, dtype: torch.dtype = torch.float32) -> dict:
    """Seconds per call of the three CPU linears on one random weight (measurement helper).

    Returns ``{"full_out_in": s, "full_in_out": s, "int8_kernel": s, "int8_dequant": s}``:
    ``x @ W.T`` with the nn.Linear [out, in] layout, ``x @ Wt`` with a contiguous [in, out]
    copy, ``_weight_int8pack_mm``, and dequantize-matmul.
    """
    w = torch.randn(out_features, in_features, dtype=dtype)
    wt = w.t().contiguous()
    qw = quantize_per_channel(w)
    x = torch.randn(batch, in_features, dtype=dtype)
    cases = {
        "full_out_in": lambda: x @ w.t(),
        "full_in_out": lambda: x @ wt,
        "int8_kernel": lambda: int8_matmul(x, qw, use_kernel=True),
        "int8_dequant": lambda: int8_matmul(x, qw, use_kernel=False),
    }
    res = {}
    for name, fn in cases.items():
        for _ in range(5):
            fn()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        res[name] = (time.perf_counter() - t0) / iters
    return res
