"""4-bit linears kept in GGUF's own Q4_1 block layout, computed by the engine's C++ kernel.

Layout (chosen at load by :func:`inferctl.engine.quant_int4.int4_weights` when the engine's CPU
kernels are built, engine.cpu_kernels): one row of ``nb = ceil(K / 32)`` ggml ``block_q4_1``
blocks per output feature, uint8 ``[N, nb · 20]``: fp16 ``d``, fp16 ``m``, 16 bytes of nibbles
(value ``j`` = ``qs[j] & 0xF``, value ``j + 16`` = ``qs[j] >> 4``). The weight is ``d·q + m`` in
fp32 exactly as ggml's ``dequantize_row_q4_1`` (ggml-quants.c) computes it, so a Q4_1 file's
tensors are used byte for byte (copied out of the memory map, no conversion). Q4_0 blocks
(``w = d·(q - 8)``) become Q4_1 blocks with ``m = -8·d`` (exact in fp16: a power-of-two
multiple). Float weights (a non-GGUF model, or a tensor the file keeps at 8 bits, e.g.
SmolLM2's Q8_0 tied embedding) are quantized with ``gguf.quants.quantize(w, Q4_1)``, the
reference implementation of llama.cpp's ``quantize_row_q4_1`` (K zero-padded to 32).

Memory: 20 bytes per 32 weights = 0.625 bytes per weight (fp32: 4), no padding of N.

Kernel: ``torch.ops.inferctl_cpu.q4_matmul(x [B, K] fp32, blocks, K) → [B, N]`` dequantizes each
weight row in AVX2 registers and multiplies with fp32 activations (no bf16 rounding), at any
B (activation rows in groups of 4 per pass over a weight row, so the weights stream once);
``q4_dequant(blocks, K)`` the whole weight for a long prefill (:data:`GEMM_ROWS`). Without the
kernels :func:`matmul` computes the same in plain PyTorch (dequantize + matmul),
which the tests hold the kernel to; the engine itself keeps torch's int4 kernel layout then
(engine.quant_int4.Int4Weight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

QK = 32
"""Values per block (ggml ``QK4_1``)."""
BLOCK_BYTES = 20
"""Bytes of a ``block_q4_1``: fp16 d, fp16 m, 16 bytes of nibbles."""
_Q4_0_BYTES = 18
#: Above this many activation rows (long prefills) a weight of at most :data:`DEQUANT_MAX_BYTES` in
#: fp32 is dequantized (``q4_dequant``) and multiplied by torch's GEMM (MKL): measured 2026-12-02,
#: 1 thread, CPU time under load, SmolLM2 shapes 1728×576 / 576×1536: 128 rows 5.7 / 4.2 ms vs
#: 7.5 / 7.4 for ``q4_matmul``, 512 rows 17.2 / 16.7 vs 37.5 / 36.0; at 32 rows ``q4_matmul`` won
#: (1.9 / 1.4 vs 3.4 / 1.8), at 64 it was a tie.
GEMM_ROWS = 64
#: Largest fp32 temporary the long-prefill path makes (the 49152×576 classifier, 113 MB, never).
DEQUANT_MAX_BYTES = 16 * 1024 * 1024


@dataclass
class Q4Weight:
    """A ``[out_features, in_features]`` linear weight as Q4_1 blocks ``uint8 [out, nb·20]``."""

    blocks: torch.Tensor
    in_features: int
    out_features: int
    #: the kernels' op namespace (``torch.ops.inferctl_cpu``) :func:`matmul` runs, or
    #: None for plain PyTorch; set by engine.quant_int4.int4_weights
    ops: Any = field(default=None, repr=False, compare=False)

    def nbytes(self) -> int:
        """Bytes held: the blocks (0.625 per weight)."""
        return self.blocks.numel()

    def dequantize(self) -> torch.Tensor:
        """float32 ``[out, in]``: ``d·q + m`` per block (plain PyTorch, the reference)."""
        return dequantize_blocks(self.blocks, self.in_features)


def q4_weight_nbytes(out_features: int, in_features: int) -> int:
    """Bytes of a :class:`Q4Weight` for an ``[out, in]`` weight."""
    return out_features * -(-in_features // QK) * BLOCK_BYTES


def dequantize_blocks(blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    """float32 ``[rows, in_features]`` of Q4_1 block rows ``uint8 [rows, nb·20]`` (plain PyTorch,
    ggml's formula: fp32(d)·q + fp32(m)). ValueError when the row length does not match."""
    rows, width = blocks.shape
    nb = -(-in_features // QK)
    if width != nb * BLOCK_BYTES:
        raise ValueError(f"Q4 blocks have {width} bytes per row; {in_features} features need {nb * BLOCK_BYTES}")
    b = blocks.reshape(rows, nb, BLOCK_BYTES)
    dm = b[..., :4].contiguous().view(torch.float16).to(torch.float32)    # [rows, nb, 2]
    qs = b[..., 4:]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).to(torch.float32)         # [rows, nb, 32]
    w = q * dm[..., :1] + dm[..., 1:]
    return w.reshape(rows, nb * QK)[:, :in_features].contiguous()


def from_gguf(raws: list) -> Q4Weight:
    """One :class:`Q4Weight` from GGUF Q4_0/Q4_1 tensors (``engine.gguf.RawTensor``) stacked along
    the output dim (Q, K and V into one fused matrix). Q4_1 bytes are copied unchanged.
    ValueError for another type, a size that does not match the shape, or mismatched input dims."""
    parts, ks = [], set()
    for r in raws:
        n, k = r.shape
        ks.add(k)
        bb = {"Q4_1": BLOCK_BYTES, "Q4_0": _Q4_0_BYTES}.get(r.ggml_type)
        if bb is None:
            raise ValueError(f"Q4 weight: GGML type {r.ggml_type} of {getattr(r, 'name', '?')} is not Q4_0 or Q4_1")
        if k % QK or r.data.size != n * (k // QK) * bb:
            raise ValueError(f"Q4 weight: {r.data.size} bytes do not hold a {r.ggml_type} tensor of shape {r.shape}")
        blk = np.ascontiguousarray(r.data).reshape(n, k // QK, bb)
        if r.ggml_type == "Q4_0":
            d = blk[..., 0:2].copy().view(np.float16)
            m = (d * np.float16(-8.0)).view(np.uint8).reshape(n, k // QK, 2)
            blk = np.concatenate([blk[..., 0:2], m, blk[..., 2:]], axis=-1)
        parts.append(blk.reshape(n, -1))
    if len(ks) != 1:
        raise ValueError(f"Q4 weight: tensors have different input dims {sorted(ks)}")
    blocks = torch.from_numpy(np.concatenate(parts, axis=0).copy())
    return Q4Weight(blocks=blocks, in_features=ks.pop(), out_features=int(blocks.shape[0]))


def quantize(w_out_in: torch.Tensor) -> Q4Weight:
    """Q4_1 of a float ``[out, in]`` weight by ``gguf.quants.quantize`` (llama.cpp's rule: per 32,
    ``d = (max - min)/15``, ``m = min``, both stored fp16); the input dim is zero-padded to 32.
    ValueError if not 2-D."""
    import gguf

    if w_out_in.dim() != 2:
        raise ValueError(f"Q4 quantize expects a 2-D [out, in] weight, got shape {tuple(w_out_in.shape)}")
    w = w_out_in.detach().to(device="cpu", dtype=torch.float32)
    n, k = w.shape
    if k % QK:
        w = torch.nn.functional.pad(w, (0, QK - k % QK))
    data = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_1)
    return Q4Weight(blocks=torch.from_numpy(np.ascontiguousarray(data)), in_features=k, out_features=n)


def matmul(ops: Any | None, x: torch.Tensor, w: Q4Weight) -> torch.Tensor:
    """``x [..., in] @ Wᵀ`` → ``[..., out]`` in x's dtype: the C++ kernel when ``ops`` is given
    and ``x`` is float32 on the CPU (above :data:`GEMM_ROWS` rows its dequantized weight and torch's
    GEMM), else dequantize + matmul (plain PyTorch, fp32).
    ValueError on a feature mismatch."""
    if x.shape[-1] != w.in_features:
        raise ValueError(f"Q4 matmul: input has {x.shape[-1]} features, weight expects {w.in_features}")
    if ops is not None and x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous() and x.device.type == "cpu":
        if x.shape[0] > GEMM_ROWS and w.out_features * w.in_features * 4 <= DEQUANT_MAX_BYTES:
            return x @ ops.q4_dequant(w.blocks, w.in_features).t()   # long prefill: torch's GEMM
        return ops.q4_matmul(x, w.blocks, w.in_features)   # the decode hot path: no reshapes, no casts
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features)
    if ops is not None and x2.dtype == torch.float32 and x2.device.type == "cpu" and not x2.requires_grad:
        y = ops.q4_matmul(x2.contiguous(), w.blocks, w.in_features)
    else:
        y = x2.to(torch.float32) @ w.dequantize().t()
    return y.to(x.dtype).reshape(*lead, w.out_features)
