"""oneDNN's fp32 GEMM for the engine's CPU linears (``torch.ops.mkldnn._linear_pointwise``).

torch's default fp32 GEMM on CPU is MKL's ``sgemm``. On the project's AMD EPYC host (Zen 4,
AVX-512) it ran the 99.5 MB benchmark model's linears at 16-64 rows at 79-190 GFLOP/s (2 threads),
while oneDNN — which torch ships in the same wheel, runs on torch's own OpenMP pool, and torch's
inductor calls for its CPU linears — ran the same products at 146-364 GFLOP/s, the margin growing with
the batch (measured 2026-12-04, ``python -m bench.kernels_ab --ops --threads 2``; docs/performance.md
"Wave 15"): its 384→32000 classifier at 32 rows 114 against 231 GFLOP/s.

:func:`linear` is ``x @ w.T`` through oneDNN where :func:`wins` (oneDNN usable, :func:`linear_op`, and a
product of at least :data:`MIN_FLOPS`: oneDNN costs ~10 µs a call, so tiny products stay on MKL), else
through torch's ``mm`` (MKL). :data:`GEMV_MAX_ROWS` is where the engine's own ``gemv_f32`` (one pass over
each weight row) stops beating oneDNN: the crossover :func:`inferctl.engine.cpu_kernels.f32_kernel_wins`
uses where oneDNN wins.

Cost: oneDNN makes (JIT-compiles) one primitive per shape the first time it sees it, about 2 ms
(measured: 399 distinct row counts of a 384→1024 product, 863 ms the first pass, 150 ms the
second, MKL 326 ms), and keeps it in its primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``,
1,024 by default). Decode batches (1-64 rows) are a handful of shapes; prefill token counts vary,
and each new one pays that once.

Numerics: float32 throughout (no bf16 or TF32 down-conversion: torch's default fp32 math mode),
summed in another order than MKL's: max |Δ| about 1e-4 on products of N(0, 1) data of inner size
384-1024, i.e. ~1e-6 relative (tests/unit/test_onednn.py bounds it).

Switch: ``INFERCTL_ONEDNN=0`` (also ``false``, ``no``, ``off``) keeps MKL. A torch built without
oneDNN, an op that is missing or that fails its first-use check: MKL too, logged once.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from inferctl.contract.envflags import switch_or_default

log = logging.getLogger("inferctl.engine.onednn")

#: Environment switch: "0", "false", "no" or "off" keeps torch's default GEMM (MKL).
ENV = "INFERCTL_ONEDNN"
#: With oneDNN, the largest fp32 batch the engine's ``gemv_f32`` runs. Measured 2026-12-04 on the project
#: host (``python -m bench.kernels_ab --ops --threads 2``, 09:27 and 09:30 UTC; GFLOP/s gemv / oneDNN on the
#: 99.5 MB model's 640×384, 2048×384, 384×1024 and 32000×384 products and SmolLM2's): at 7 rows gemv
#: 113-122 / oneDNN 71-102 everywhere; at 8 rows 91-123 / 82-199 (oneDNN ahead on 7 of 8 shapes in one
#: run, behind on 3 of 4 in the other); at 10 rows 97-123 / 121-227 and at 16 rows 114-124 / 146-198:
#: oneDNN ahead everywhere.
GEMV_MAX_ROWS = 8
#: Smallest product (2·rows·N·K floating-point operations) sent to oneDNN: below it torch's ``mm`` (MKL)
#: is as fast or faster, oneDNN spending ~10 µs a call whatever the size (stories260K's 64-wide layers,
#: 0.1-2.8 MFLOP: oneDNN 3-38 µs against MKL's 2-36 µs at 1-64 rows, the same runs); the 99.5 MB model's
#: smallest layer at 9 rows (384→640) is 4.4 MFLOP.
MIN_FLOPS = 3_000_000


def enabled() -> bool:
    """False when ``INFERCTL_ONEDNN`` is off (0/false/no/off/f/n, any case; contract/envflags.py's rule:
    an unknown word logs a warning once and keeps it on)."""
    return switch_or_default(ENV)


@functools.cache
def linear_op() -> Any | None:
    """``torch.ops.mkldnn._linear_pointwise`` when this torch has oneDNN, the switch is on and the op
    gives ``x @ w.T`` on a small check (9×40 by 24×40, within 1e-4), else None. Cached per process;
    never raises (a failure is one warning)."""
    if not enabled() or not torch.backends.mkldnn.is_available():
        return None
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if op is None:
        return None
    try:
        gen = torch.Generator().manual_seed(0)
        x, w = (torch.randn(9, 40, generator=gen, dtype=torch.float32, device="cpu"),
                torch.randn(24, 40, generator=gen, dtype=torch.float32, device="cpu"))
        with torch.inference_mode():
            got = op(x, w, None, "none", [], "")
        if got.shape != (9, 24) or not torch.allclose(got, x @ w.t(), rtol=1e-4, atol=1e-4):
            raise ValueError("its result differs from x @ w.T")
    except Exception as exc:  # noqa: BLE001 - any failure means "no oneDNN", never a crash
        log.warning("oneDNN's fp32 linear is unusable here, using torch's default GEMM (%s: %s)",
                    type(exc).__name__, exc)
        return None
    return op


def available() -> bool:
    """Whether :func:`linear` runs through oneDNN in this process."""
    return linear_op() is not None


def wins(rows: int, weight_numel: int) -> bool:
    """Whether a ``rows``-row product with a weight of ``weight_numel`` elements goes to oneDNN: it is
    usable here and the product has at least :data:`MIN_FLOPS` operations (2·rows·numel). The one
    predicate (the fused decode op's mask bits and :func:`linear` both ask it)."""
    return 2 * rows * weight_numel >= MIN_FLOPS and linear_op() is not None


def linear(x: torch.Tensor, w_out_in: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ w_out_in[N, K]ᵀ`` → ``[..., N]``: oneDNN for float32 CPU tensors where :func:`wins`
    says so, else torch's ``x @ w.T``. Raises RuntimeError (from torch) on mismatched shapes."""
    if (x.dtype == torch.float32 and w_out_in.dtype == torch.float32 and x.device.type == "cpu"
            and w_out_in.device.type == "cpu" and wins(x.numel() // max(x.shape[-1], 1), w_out_in.numel())):
        return linear_op()(x, w_out_in, None, "none", [], "")
    return x @ w_out_in.t()
