"""The engine's own CPU kernels for small-batch decode, compiled at first use, with a PyTorch fallback.

Batch-1 decode streams every weight once per token, so its speed is the rate at which a kernel
reads the weights (docs/performance.md). torch's fp32 GEMV on the ``[in, out]`` layout and the
int8 product through ``torch._weight_int8pack_mm`` (bf16 activations, emulated on a CPU
without bf16 hardware) read far below the copy bandwidth; ``csrc/cpu_kernels.cpp`` holds four
small ops that do not:

- ``gemv_f32``  ``y[B, N] = x[B, K] @ W[N, K]ᵀ`` where :func:`f32_kernel_wins`: each output row is a dot
  product over one contiguous weight row (the ``[out, in]`` layout, chosen at load by
  :class:`inferctl.engine.model.Linear` when the kernels are there and the weight is under
  :data:`GEMV_F32_MAX_BYTES`), the layout llama.cpp's ``ggml_vec_dot_f32`` streams;
- ``gemv_int8`` the same over int8 weights ``[N, K_padded]`` with one fp32 scale per output row
  (engine.quant's per-channel absmax): ``y = scale · Σ q·x``; with AVX2 the activations are
  quantized per block of 32 (absmax/127, round half to even: llama.cpp's Q8_0, ``ggml_vec_dot_q8_0_q8_0``)
  and each block is an exact int8·int8 integer dot product (columns past the last whole block in
  fp32); without AVX2 the weights are widened to fp32 against fp32 activations;
- ``rms_norm``  ``x / sqrt(mean(x²) + eps) · w`` (Zhang & Sennrich 2019), one pass per row;
- ``silu_mul``  ``silu(gu[:, :H]) · gu[:, H:]`` (SwiGLU, Shazeer 2020), one op instead of three.

Build: ``torch.utils.cpp_extension.load`` with ``-O3 -march=native`` at the first call of
:func:`load_ops` in a process (never at ``pip install``), cached by torch in
``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``) under a name that includes the
CPU's flags, the torch version, the compiler flags and the sources (bytes and paths), so a cache
shared by different machines never loads code built for another CPU and two installs never rebuild
over each other (:func:`_cpu_tag`); a build lock left by a build that was killed is removed after
:data:`STALE_LOCK_SECONDS`. The ops register as ``torch.ops.inferctl_cpu.*`` (no pybind: that
doubled the compile time). First build measured at 44 s wall / 20 s CPU on the 2-core
project machine under load; later processes load the cached library in well under a second.
Threads: ``at::parallel_for`` over output rows on torch's own OpenMP pool (built with ``-fopenmp``,
:data:`CFLAGS`), so ``torch.set_num_threads`` applies.

Fallback: no compiler, no ninja, a failed build or ``INFERCTL_CPU_KERNELS=0`` (also ``false``,
``no``, ``off``) → :func:`ops_for` returns None, one warning is logged (build failures only), and
every caller keeps its plain-PyTorch path. CUDA tensors and non-fp32 dtypes always take the
PyTorch path (on a GPU the same model code runs torch's kernels; decode there is meant for CUDA
graphs, not these ops).

Numerics: the kernels sum in a different order from torch's (8-lane partial sums, then a
horizontal add), so results differ in the last bits (measured max |Δ| ≈ 1e-4 on
``[1, 1024] @ [1024, 384]`` of N(0,1) data, i.e. ~1e-6 relative); tests/unit/test_cpu_kernels.py
bounds each op against its torch reference.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from pathlib import Path
from typing import Any

import torch

from inferctl.contract.envflags import switch_or_default

from inferctl.engine import onednn

log = logging.getLogger("inferctl.engine.cpu_kernels")

#: Environment switch: "0", "false", "no" or "off" keeps every op on plain PyTorch.
ENV = "INFERCTL_CPU_KERNELS"
#: Largest activation batch sent to ``gemv_f32`` at 1 thread (:func:`f32_kernel_wins`); larger fp32
#: batches are GEMMs and stay on MKL. Measured 2026-12-02 (wave 6, CPU time under load, ``python -m
#: bench.kernels_ab --ops``): on the synthetic and SmolLM2 layer shapes ``gemv_f32`` ran 1-2.2x faster than
#: MKL up to 8 rows, about even at 16, and MKL 1.6-2x faster at 32-64 rows (a register-tiled variant
#: of the kernel, 4 rows x 3 weight rows, reached only 20-28 GFLOP/s vs MKL's 50-68 and was dropped).
MAX_BATCH = 8
#: The same limit at 2 or more threads: MKL's multi-threaded GEMM spent 1.3-100x the CPU time of
#: ``gemv_f32`` on those shapes at 8-16 rows (its OpenMP workers spin while the other core is busy),
#: 0.5-10x at 32 rows (measured the same day, under load).
MAX_BATCH_MT = 16
#: Largest decode-only batch :mod:`engine.fused_decode` runs in one C++ call (``decode_step.cpp``'s
#: ``MAX_B``, the GEMV kernels' own limit): above :data:`MAX_BATCH` its fp32 linears call torch's GEMM
#: from inside the op (:func:`f32_kernel_wins` decides), int8 and Q4_1 linears their own kernels.
MAX_DECODE_BATCH = 64
#: Largest activation batch sent to ``gemv_int8`` (the C++ ``MAX_B``): torch's int8 kernel
#: (``_weight_int8pack_mm``) takes bf16 activations, emulated on a CPU without bf16 hardware, and
#: read 16-64 rows 2.5-8x slower in CPU time than ``gemv_int8`` on the engine's shapes (wave 5,
#: docs/performance.md); above 64 rows (long prefills) ``quant.int8_matmul`` calls it 64 rows at a time
#: (since wave 9: 2.1-3.5x less CPU than torch's kernel at 65-256 rows), torch only without the kernels.
MAX_BATCH_INT8 = 64
#: fp32 weights of this many bytes or more keep torch's ``[in, out]`` layout and kernel (MKL, on
#: torch's own thread pool) instead of ``gemv_f32``: measured 2026-12-01 under load (memory
#: bus saturated by other work), MKL read the DRAM-resident 384×32000 output layer (49 MB) at
#: batch 1 in 2.7–2.9 ms of CPU vs 3.6–4.7 ms for ``gemv_f32``, and its GEMM on the ``[in, out]``
#: layout ran 1.1× faster at 32–128 rows than on ``W.T``; the layer linears (≤ 3.1 MB, cache
#: resident) were equal or faster through the GEMV.
#: int8 weights take ``gemv_int8`` at any size (1.5× faster than the bf16 kernel on that layer).
#: Since wave 7 (the GEMV reads 4 streams at once and runs on torch's OpenMP threads) it read that
#: layer faster than MKL at every row count up to 64 (1 thread, CPU time under load, ``python -m
#: bench.kernels_ab --ops --rows 1,2,16,32``: 3.7 vs 4.1 ms at 1 row, 12.4 vs 26.3 at 16, 23.3 vs 33.6 at
#: 32), so no fp32 weight keeps the ``[in, out]`` layout for its size any more: the limit stays as a
#: switch (tests set it low) at a size no model reaches.
GEMV_F32_MAX_BYTES = 1 << 40
#: fp32 weights of this many bytes or more (beyond any L2, streamed from L3/DRAM: the classifier) take
#: ``gemv_f32`` up to :data:`MAX_DECODE_BATCH` rows (:func:`f32_kernel_wins`); the figures above.
GEMV_F32_ALL_ROWS_BYTES = 16 * 1024 * 1024
SOURCE = Path(__file__).resolve().parent / "csrc" / "cpu_kernels.cpp"
#: every C++ file of the one extension (the ops of engine.fused_decode and engine.q4_kernels too)
SOURCES = (SOURCE, *(SOURCE.with_name(f) for f in ("decode_step.cpp", "q4_kernels.cpp", "paged_attention.cpp")))
#: headers the sources include: hashed into the build name with them (torch's own rebuild check
#: sees the listed sources only)
HEADERS = (SOURCE.with_name("simd.h"), SOURCE.with_name("paged_attention.h"))
#: ``-fopenmp``: ``at::parallel_for`` is a header template that runs its chunks on torch's OpenMP pool only
#: when the including file is compiled with OpenMP; without it every op ran on the calling thread
#: whatever ``torch.set_num_threads`` said (waves 4-6 measured "2 threads" on one). The library then
#: needs ``libgomp.so.1``, which the process already holds from torch (torch/lib's copy, found by its
#: soname): one OpenMP runtime, one pool.
#: A compiler without OpenMP (e.g. Apple clang without libomp) gets a second try with
#: :data:`CFLAGS_SERIAL` (the ops then run on the calling thread).
CFLAGS = ("-O3", "-march=native", "-fopenmp")
LDFLAGS = ("-fopenmp",)
CFLAGS_SERIAL = ("-O3", "-march=native")


def enabled() -> bool:
    """False when ``INFERCTL_CPU_KERNELS`` is off (0/false/no/off/f/n, any case; contract/envflags.py's
    rule: any other word than those and 1/true/yes/on/t/y logs a warning once and keeps them on)."""
    return switch_or_default(ENV)


def _cpu_tag(flags_used: tuple[str, ...] = CFLAGS + LDFLAGS) -> str:
    """8 hex digits of sha256 over the CPU's flags line, the torch version, the compiler flags, the bytes of
    :data:`SOURCES` and :data:`HEADERS` and the sources' paths (the build-cache key: a changed kernel or
    header builds under a new name, never over a library another process may have loaded; two installs
    of the same code — a checkout and a venv, two venvs — get one build each: with one shared name the
    source paths in torch's ``build.ninja`` differed, so each load by one rebuilt over the other's, ~45 s
    under the build lock, and an engine starting meanwhile waited for it)."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    flags = line
                    break
    except OSError:
        pass
    h = hashlib.sha256((flags + torch.__version__ + " ".join(flags_used)).encode())
    for f in SOURCES + HEADERS:
        h.update(str(f).encode())
        try:
            h.update(f.read_bytes())
        except OSError:
            pass   # a missing file fails the build itself, with its own message
    return h.hexdigest()[:8]


#: A build lock (torch's ``FileBaton``: a ``lock`` file in the build directory, created with
#: ``O_EXCL``, removed when the build ends) older than this is stale: its holder was killed (SIGKILL,
#: the OOM killer) mid-build, and torch would wait for it forever — every later engine start hung.
#: A first build takes ~45 s on the 2-core project machine; 10 minutes leaves a wide margin.
STALE_LOCK_SECONDS = 600.0


def clear_stale_lock(build_dir: Path, now: float, max_age: float = STALE_LOCK_SECONDS) -> bool:
    """Remove ``build_dir/lock`` when its mtime is more than ``max_age`` seconds before ``now``
    (seconds since the epoch); True when it removed one (logged as a warning). A younger lock (a
    build in progress) or none: False. Never raises (a lock that vanished or cannot be read or removed
    is left to torch)."""
    lock = build_dir / "lock"
    try:
        age = now - lock.stat().st_mtime
        if age <= max_age:
            return False
        lock.unlink()
    except OSError:
        return False
    log.warning("removed a stale build lock %s (%.0f s old: its build was killed; torch would wait for it "
                "forever)", lock, age)
    return True


@functools.cache
def load_ops() -> Any | None:
    """Build (first time on this machine) and load the ops; ``torch.ops.inferctl_cpu`` or None.

    Cached per process (the one loaded library). Never raises: a missing compiler or ninja, a
    compile error or a load error logs one warning with the reason and returns None. A build with
    :data:`CFLAGS` that fails is tried once more with :data:`CFLAGS_SERIAL` (no OpenMP) first."""
    err: Exception | None = None
    for cflags, ldflags in ((CFLAGS, LDFLAGS), (CFLAGS_SERIAL, ())):
        try:
            from torch.utils.cpp_extension import _get_build_directory, load

            name = f"inferctl_cpu_kernels_{_cpu_tag(cflags + ldflags)}"
            try:
                build_dir = Path(_get_build_directory(name, False))
            except Exception:  # noqa: BLE001 - a torch without this helper: no stale-lock check, the build goes on
                build_dir = None
            if build_dir is not None:
                clear_stale_lock(build_dir, time.time())
                if not (build_dir / f"{name}.so").exists():   # say why the first start is quiet for a minute
                    log.info("building the CPU kernels (first start with these sources and flags: 30-90 s "
                             "on 2 cores; cached in %s; INFERCTL_CPU_KERNELS=0 skips it)", build_dir)
            load(name=name, sources=[str(f) for f in SOURCES],
                 extra_cflags=list(cflags), extra_ldflags=list(ldflags), is_python_module=False, verbose=False)
            ops = torch.ops.inferctl_cpu
            ops.has_avx2()  # the library answers
            if cflags is CFLAGS_SERIAL:
                log.info("inferctl CPU kernels built without OpenMP (one thread per op): %s", err)
            return ops
        except Exception as exc:  # noqa: BLE001 — any build/load failure means "no kernels", never a crash
            err = exc
    log.warning("inferctl CPU kernels unavailable, using plain PyTorch ops (%s: %s)",
                type(err).__name__, (str(err).strip().splitlines() or [""])[-1])
    return None


def ops_for(device: torch.device | str, dtype: torch.dtype) -> Any | None:
    """The one decision: the kernels' op namespace when they run for tensors on ``device`` in
    ``dtype`` (CPU, float32, switch on, build succeeded), else None (plain PyTorch)."""
    if torch.device(device).type != "cpu" or dtype != torch.float32 or not enabled():
        return None
    return load_ops()


def eligible(x: torch.Tensor, max_rows: int | None = None) -> bool:
    """Whether ``x`` can feed a kernel: a contiguous 2-D float32 CPU tensor without grad, with at
    most ``max_rows`` rows when given (the GEMVs pass :data:`MAX_BATCH`). The one predicate every
    op's caller uses (the C++ TORCH_CHECKs the same)."""
    return (x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()
            and not x.requires_grad and (max_rows is None or x.shape[0] <= max_rows))


def f32_kernel_wins(rows: int, weight_bytes: int = 0) -> bool:
    """The one predicate for fp32 linears on the ``[out, in]`` layout: True when ``gemv_f32`` runs a
    ``rows``-row product (``rows ≤`` :data:`MAX_BATCH` at 1 thread, :data:`MAX_BATCH_MT` at more, per
    ``torch.get_num_threads()``; ``rows ≤`` :data:`MAX_DECODE_BATCH` for a weight of
    :data:`GEMV_F32_ALL_ROWS_BYTES` or more), False when torch's GEMM (MKL) does. The layer shapes'
    crossovers did not depend on (N, K) within the noise (see the constants). Where oneDNN's GEMM
    would run the product (:func:`inferctl.engine.onednn.wins` for ``rows`` and the weight's
    ``weight_bytes // 4`` elements), its crossover instead: ``rows ≤``
    :data:`inferctl.engine.onednn.GEMV_MAX_ROWS` at any thread count."""
    if onednn.wins(rows, weight_bytes // 4):
        return rows <= onednn.GEMV_MAX_ROWS
    if weight_bytes >= GEMV_F32_ALL_ROWS_BYTES:
        return rows <= MAX_DECODE_BATCH
    return rows <= (MAX_BATCH if torch.get_num_threads() <= 1 else MAX_BATCH_MT)


def gemv_f32(ops: Any, x: torch.Tensor, w_out_in: torch.Tensor) -> torch.Tensor:
    """``x [B, K] @ w_out_in[N, K]ᵀ`` → float32 [B, N] (B ≤ MAX_DECODE_BATCH, both contiguous float32 CPU).

    Raises RuntimeError (from the op) on a wrong shape or dtype."""
    return ops.gemv_f32(x, w_out_in)


def gemv_int8(ops: Any, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
              in_features: int) -> torch.Tensor:
    """``(x [B, K] @ qweight[N, :K]ᵀ) · scales[N]`` → float32 [B, N]; ``qweight`` int8 [N, K_padded]
    (columns past ``in_features`` are ignored); B ≤ MAX_BATCH_INT8. Activations are rounded per block of
    32 (Q8_0, see the module doc): each moves by at most its block's absmax/254. Raises RuntimeError
    (from the op) on bad input."""
    return ops.gemv_int8(x, qweight, scales, in_features)


def rms_norm(ops: Any | None, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` [T, D] with ``weight`` [D]: the kernel when ``ops`` is
    given and ``x`` is a contiguous 2-D float32 CPU tensor, else ``F.rms_norm`` (same formula)."""
    if ops is not None and eligible(x):
        return ops.rms_norm(x, weight, eps)
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def silu_mul(ops: Any | None, gu: torch.Tensor) -> torch.Tensor:
    """``silu(gu[:, :H]) · gu[:, H:]`` for ``gu`` [T, 2H] → [T, H]: the kernel when ``ops`` is given
    and ``gu`` is a contiguous 2-D float32 CPU tensor, else three torch ops."""
    if ops is not None and eligible(gu):
        return ops.silu_mul(gu)
    h = gu.shape[-1] // 2
    return torch.nn.functional.silu(gu[..., :h]) * gu[..., h:]
