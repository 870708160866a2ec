"""int4 weight-only linears: group-wise (32 values) scales and zeros in torch's CPU int4 layout.

Where the engine's CPU kernels are built, :func:`int4_weights` keeps every linear in GGUF's own
Q4_1 block layout instead (engine.q4_kernels, fp32 activations); what follows is the layout used
without them.

Kernel: ``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)``
(torch ≥ 2.5, schema in torch 2.13: ``(Tensor self, Tensor mat2, int qGroupSize, Tensor
qScaleAndZeros) -> Tensor``) over weights packed by ``_convert_weight_to_int4pack_for_cpu(q,
innerKTiles)`` from ``q`` int32 ``[N, K]`` in 0..15 (result uint8 ``[N, K/2]``). Its
dequantization, probed on the project CPU (torch 2.13, AVX2) against every other sign/offset
convention, is the "tinygemm" one with the zero in the float domain::

    w[n, k] = (q[n, k] - 8) · scale[k // G, n] + zero[k // G, n]

with ``scales_and_zeros`` ``[K/G, N, 2]`` (``[..., 0]`` scale, ``[..., 1]`` zero) in the
activation dtype. GGUF blocks (ggml ``ggml-quants.c``, ``dequantize_row_q4_0/1``; 32 values per
block, matching ``G = 32``):

* Q4_1 (affine, ``w = d·q + m``): scale ``d``, zero ``m + 8·d`` — equal in real arithmetic.
* Q4_0 (symmetric, ``w = d·(q - 8)``): scale ``d``, zero 0.

Precision: the kernel is vectorized on this CPU only for bf16/fp16 activations (fp32
activations ran 40–100× slower than an fp32 matmul: 14 ms vs 0.2 ms for 1728×576 at batch 1,
one thread), so activations and ``scales_and_zeros`` are bf16 (as int8 mode rounds
activations to bf16). The int4 codes are the file's, bit for bit; the dequantized weights
equal the GGUF values up to the bf16 rounding of ``d`` (Q4_0) and of ``d`` and ``m + 8d``
(Q4_1): relative error ≤ 2⁻⁹ per scale, checked in tests/unit/test_quant_int4.py.

From a float weight (any model): per group of 32 along the input dim, ``d = (max - min) / 15``,
``m = min``, ``q = round((w - m) / d)`` clamped to 0..15 — llama.cpp's ``quantize_row_q4_1``
rule — then the Q4_1 mapping above.

Memory: ``N·K/2`` bytes of codes + ``(K/32)·N·2·2`` bytes of bf16 scales and zeros = 0.625
bytes per weight (fp32: 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from inferctl.engine import cpu_kernels
from inferctl.engine.q4_kernels import Q4Weight, q4_weight_nbytes
from inferctl.engine.q4_kernels import from_gguf as q4_from_gguf
from inferctl.engine.q4_kernels import matmul as q4_matmul
from inferctl.engine.q4_kernels import quantize as q4_quantize
from inferctl.engine.quant import int8_weight_nbytes, quantize_per_channel

GROUP = 32
"""Values per scale/zero group: the GGUF Q4_0/Q4_1 block size (ggml ``QK4_0 = QK4_1 = 32``)."""
INNER_K_TILES = 2
"""``innerKTiles`` argument of the packing op (ignored by the CPU variant in torch 2.13)."""
Q4_TYPES = ("Q4_0", "Q4_1")
#: bytes per 32-value block: fp16 d (+ fp16 m for Q4_1) + 16 bytes of nibbles.
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}
N_ALIGN = 16
"""The packing op requires N % 16 == 0 (torch 2.13: "expect N to be dividable by 16"): extra
output rows (codes 8, scale and zero 0 → weight 0) are packed and sliced off the product."""


@dataclass
class Int4Weight:
    """A packed int4 linear weight of logical shape ``[out_features, in_features]``.

    ``packed`` uint8 ``[out, k_padded/2]`` (torch's CPU int4 layout), ``scales_and_zeros``
    bf16 ``[k_padded/32, out, 2]`` (``out`` padded to 16, :data:`N_ALIGN`); ``k_padded`` =
    ``in_features`` rounded up to 32 (padding columns multiply zero-padded activations).
    """

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    in_features: int
    out_features: int
    k_padded: int

    def nbytes(self) -> int:
        """Bytes of packed codes + bf16 scales and zeros."""
        return (self.packed.numel() * self.packed.element_size()
                + self.scales_and_zeros.numel() * self.scales_and_zeros.element_size())

    def dequantize(self) -> torch.Tensor:
        """The weights the kernel computes with, float32 ``[out, in]`` (via the kernel on an
        identity matrix, so it shows exactly what a matmul uses)."""
        eye = torch.eye(self.k_padded, dtype=torch.bfloat16)
        wt = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scales_and_zeros)
        return wt.t()[: self.out_features, : self.in_features].to(torch.float32).contiguous()


#: The int4 weight types a ``Linear.q`` may hold: torch's kernel layout and the GGUF block layout.
INT4_TYPES = (Int4Weight, Q4Weight)


def int4_weight_nbytes(out_features: int, in_features: int) -> int:
    """Bytes of an :class:`Int4Weight` for an ``[out, in]`` weight (in padded to 32)."""
    k = in_features + (-in_features) % GROUP
    n = out_features + (-out_features) % N_ALIGN
    return n * k // 2 + (k // GROUP) * n * 2 * 2


def pack_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, in_features: int) -> Int4Weight:
    """Pack codes int ``[N, Kp]`` (0..15, ``Kp`` a multiple of 32) with float ``scales``/``zeros``
    ``[N, Kp/32]`` in the kernel convention ``(q - 8)·scale + zero``. ValueError on bad shapes."""
    n, kp = codes.shape
    if kp % GROUP or scales.shape != (n, kp // GROUP) or zeros.shape != scales.shape:
        raise ValueError(f"pack_int4: codes {tuple(codes.shape)} need K % {GROUP} == 0 and scales/zeros "
                         f"[{n}, {kp // GROUP}], got {tuple(scales.shape)} / {tuple(zeros.shape)}")
    npad = (-n) % N_ALIGN
    if npad:
        codes = torch.nn.functional.pad(codes, (0, 0, 0, npad), value=8)
        scales = torch.nn.functional.pad(scales, (0, 0, 0, npad))
        zeros = torch.nn.functional.pad(zeros, (0, 0, 0, npad))
    codes = codes.to(torch.int32).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INNER_K_TILES)
    sz = torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16).contiguous()
    return Int4Weight(packed=packed, scales_and_zeros=sz, in_features=in_features, out_features=n, k_padded=kp)


def _pad_k(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> tuple:
    pad = (-codes.shape[1]) % GROUP
    if pad:
        codes = torch.nn.functional.pad(codes, (0, pad), value=8)
        if scales.shape[1] * GROUP < codes.shape[1]:
            scales = torch.nn.functional.pad(scales, (0, 1), value=0.0)
            zeros = torch.nn.functional.pad(zeros, (0, 1), value=0.0)
    return codes, scales, zeros


def q4_params(ggml_type: str, data: np.ndarray, shape: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """Codes int32 ``[N, K]``, scales and zeros float32 ``[N, K/32]`` (kernel convention) of a
    GGUF Q4_0/Q4_1 tensor given as its raw uint8 blocks ``[N, K/32·block_bytes]``.

    Block layout (ggml ``block_q4_0``/``block_q4_1``): fp16 ``d`` (Q4_1: then fp16 ``m``), 16
    bytes ``qs``; value ``j`` is ``qs[j] & 0xF`` and value ``j + 16`` is ``qs[j] >> 4``.
    ValueError for another type or a size that does not match ``shape``.
    """
    if ggml_type not in Q4_TYPES:
        raise ValueError(f"q4_params: GGML type {ggml_type} is not one of {', '.join(Q4_TYPES)}")
    n, k = shape
    bb = _BLOCK_BYTES[ggml_type]
    if k % GROUP or data.size != n * (k // GROUP) * bb:
        raise ValueError(f"q4_params: {data.size} bytes do not hold a {ggml_type} tensor of shape {shape}")
    blocks = np.ascontiguousarray(data).reshape(n, k // GROUP, bb)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., bb - 16:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, k).astype(np.int32)
    if ggml_type == "Q4_1":
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zeros = m + np.float32(8.0) * d
    else:
        zeros = np.zeros_like(d)
    return torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(zeros)


def int4_from_gguf(raws: list) -> Int4Weight:
    """One :class:`Int4Weight` from GGUF Q4_0/Q4_1 tensors (``engine.gguf.RawTensor``) stacked
    along the output dim (e.g. Q, K and V into one fused matrix). The codes are the file's.
    ValueError for another type or mismatched input dims."""
    parts = [q4_params(r.ggml_type, r.data, r.shape) for r in raws]
    ks = {int(p[0].shape[1]) for p in parts}
    if len(ks) != 1:
        raise ValueError(f"int4_from_gguf: tensors have different input dims {sorted(ks)}")
    codes, scales, zeros = (torch.cat([p[i] for p in parts], dim=0) for i in range(3))
    return pack_int4(codes, scales, zeros, in_features=ks.pop())


def quantize_int4(w_out_in: torch.Tensor) -> Int4Weight:
    """Group-32 affine int4 of a float ``[out, in]`` weight (Q4_1's rule, module docstring).
    A constant group gets ``d`` = 0 and reproduces its value from the zero. ValueError if not 2-D."""
    if w_out_in.dim() != 2:
        raise ValueError(f"quantize_int4 expects a 2-D [out, in] weight, got shape {tuple(w_out_in.shape)}")
    w = w_out_in.detach().to(torch.float32).cpu()
    n, k = w.shape
    pad = (-k) % GROUP
    wp = torch.nn.functional.pad(w, (0, pad)) if pad else w
    g = wp.view(n, -1, GROUP)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    d = (hi - lo) / 15.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    codes = torch.clamp(torch.round((g - lo[..., None]) * inv[..., None]), 0, 15).view(n, -1).to(torch.int32)
    return pack_int4(codes, d, lo + 8.0 * d, in_features=k)


def int4_matmul(x: torch.Tensor, w: Int4Weight | Q4Weight) -> torch.Tensor:
    """y = x @ W.T for x ``[..., in]`` → ``[..., out]`` in x's dtype. :class:`Int4Weight`: the
    product runs in bf16 (activations rounded to bf16, see the module docstring);
    ``Q4Weight``: engine.q4_kernels.matmul (fp32 activations). ValueError on a feature mismatch."""
    if isinstance(w, Q4Weight):
        return q4_matmul(w.ops, x, w)
    if x.shape[-1] != w.in_features:
        raise ValueError(f"int4_matmul: input has {x.shape[-1]} features, weight expects {w.in_features}")
    lead = x.shape[:-1]
    xb = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    if w.k_padded != w.in_features:
        xb = torch.nn.functional.pad(xb, (0, w.k_padded - w.in_features))
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), w.packed, GROUP, w.scales_and_zeros)
    if y.shape[1] != w.out_features:
        y = y[:, : w.out_features]
    return y.to(x.dtype).reshape(*lead, w.out_features)


def q4_ops(device: torch.device | str) -> Any | None:
    """The engine's CPU kernel ops when they run the GGUF-block int4 layout (engine.q4_kernels) for
    a model on ``device``: CPU, kernels switched on and built; else None (torch's int4 kernel
    layout, :class:`Int4Weight`). The one decision both :func:`int4_weights` and the byte
    accounting (``LlamaModel.weight_bytes_by_mode``) follow."""
    ops = cpu_kernels.ops_for(device, torch.float32)
    return ops if ops is not None and hasattr(ops, "q4_matmul") else None


def int4_mode_nbytes(mats: list[tuple[int, int]], n_tables: int, device: torch.device | str) -> int:
    """Weight bytes (norms excluded) of int4 mode for the ``[out, in]`` matrices ``mats`` whose
    first ``n_tables`` are the classifier/embedding tables: the tables int8 per row, the rest
    Q4_1 blocks (0.625 B/weight) where :func:`q4_ops` runs, else :class:`Int4Weight`."""
    per_layer = q4_weight_nbytes if q4_ops(device) is not None else int4_weight_nbytes
    return (sum(int8_weight_nbytes(o, i) for o, i in mats[:n_tables])
            + sum(per_layer(o, i) for o, i in mats[n_tables:]))


def _q4_from(raws: list, float_w) -> Q4Weight:
    """GGUF Q4 tensors kept as they are when every part is Q4_0/Q4_1, else the float weight
    (``float_w()``, [out, in]) quantized to Q4_1."""
    if all(r is not None and r.ggml_type in Q4_TYPES for r in raws):
        return q4_from_gguf(raws)
    return q4_quantize(float_w())


def int4_weights(model, q4_sources: dict | None, current: str) -> None:
    """Switch a ``engine.model.LlamaModel`` in ``"full"`` precision to int4, in place.

    Where the engine's CPU kernels run (:func:`q4_ops`): every layer linear becomes an
    ``engine.q4_kernels.Q4Weight`` (GGUF Q4_1 blocks): the file's Q4_0/Q4_1 tensors as stored
    when every part of the fused matrix is there (``q4_sources``: canonical name →
    ``engine.gguf.RawTensor``), else the float weight quantized to Q4_1. Without the kernels
    (plain-PyTorch fallback): layer linears become :class:`Int4Weight` for torch's int4
    kernel. In both, the classifier and an untied embedding table are int8 per row
    (``engine.quant``; SmolLM2's file keeps its tied embedding as Q8_0). The float weights are
    dropped (no host copy): int4 is a start-time mode with no way back. ValueError when
    ``current`` is not "full" (including int4 → anything) or the model is not on the CPU.
    """
    if current != "full":
        raise ValueError(f"precision int4 is chosen at start from full precision; cannot switch from {current} "
                         "(an int4 model has no full-precision weights to go back to)")
    if model.device.type != "cpu":
        raise ValueError(f"precision int4 runs on the CPU only (torch's int4 CPU kernel), model is on {model.device}")
    src = q4_sources or {}
    ops = q4_ops(model.device)
    parts = {"wqkv": ("attention.wq", "attention.wk", "attention.wv"), "wo": ("attention.wo",),
             "w13": ("feed_forward.w1", "feed_forward.w3"), "w2": ("feed_forward.w2",)}
    for i, blk in enumerate(model.layers):
        for attr, names in parts.items():
            lin = getattr(blk, attr)
            raws = [src.get(f"layers.{i}.{n}.weight") for n in names]
            if ops is not None:
                lin.q = _q4_from(raws, lambda lin=lin: lin.weight_t.t())
                lin.q.ops = ops
            elif all(r is not None and r.ggml_type in Q4_TYPES for r in raws):
                lin.q = int4_from_gguf(raws)
            else:
                lin.q = quantize_int4(lin.weight_t.t())
            lin.weight_t = None
            if hasattr(lin, "_w_np"):
                lin._w_np = None
    tied = model.tok_embeddings is None
    # The classifier and an untied embedding table stay 8-bit (int8 per row) in both layouts:
    # 4-bit codes there cost greedy agreement (SmolLM2, first divergence from fp32 at tokens
    # 10/4/5/0 with a Q4_1 classifier vs 23/12/none/12 with int8, docs/performance.md), and
    # quantized files keep them above 4 bits too (SmolLM2's Q4_1 file: token_embd is Q8_0).
    model.output.quantize_()
    if not tied:
        model.tok_embeddings_q = quantize_per_channel(model.tok_embeddings)
    model.tok_embeddings = None
    model._host_backup = {}
