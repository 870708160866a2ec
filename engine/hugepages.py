"""Model weights in transparent huge pages (Linux).

A batch-1 decode step streams every weight once; the 99.5 MB fp32 ``synthetic`` model does not fit
the 32 MiB L3, so each step walks ~24,000 4 KiB pages (a TLB miss per page) but only ~50 2 MiB pages.
Weights loaded from safetensors are file-backed mmap pages and the fused ``wqkv``/``w13`` are fresh
4 KiB-page allocations (torch's allocator only advises huge pages with ``THP_MEM_ALLOC_ENABLE=1`` in
the environment before its first allocation). :func:`move_weights` copies the full-precision linear
weights (and an untied embedding table) into one anonymous buffer advised ``MADV_HUGEPAGE``
(madvise(2); honoured when ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or
``madvise``) before its first touch, each weight at a 64-byte aligned offset, values copied bit for bit.

Switch: ``INFERCTL_HUGEPAGES=0`` turns it off (default on where ``mmap.MADV_HUGEPAGE`` exists).
"""

from __future__ import annotations

import mmap
from typing import Any

import torch

from inferctl.contract.envflags import switch_or_default

#: Huge page size the buffer's start is aligned to (x86-64 and arm64 with 4 KiB base pages: 2 MiB).
HUGE_PAGE_BYTES = 2 * 1024 * 1024
#: Alignment of each weight inside the buffer (one cache line; the kernels' SIMD loads need ≤ 64).
WEIGHT_ALIGN = 64


def enabled() -> bool:
    """Whether :func:`move_weights` acts: ``INFERCTL_HUGEPAGES`` is not off (0/false/no/off/f/n, any case:
    contract/envflags.py's rule; before, only ``"0"`` turned it off) and this platform's ``mmap`` module
    has ``MADV_HUGEPAGE`` (Linux)."""
    return switch_or_default("INFERCTL_HUGEPAGES") and hasattr(mmap, "MADV_HUGEPAGE")


def huge_buffer(nbytes: int) -> torch.Tensor:
    """An untouched uint8 CPU tensor of ``nbytes`` whose first byte is 2 MiB aligned, in an anonymous
    mapping advised ``MADV_HUGEPAGE``. The tensor keeps the mapping alive. Raises ValueError for
    ``nbytes`` < 1 and OSError when the mapping or the advice fails."""
    if nbytes < 1:
        raise ValueError(f"huge_buffer needs nbytes >= 1, got {nbytes}")
    size = nbytes + HUGE_PAGE_BYTES
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(mm, dtype=torch.uint8)     # holds a reference to mm
    skip = (-whole.data_ptr()) % HUGE_PAGE_BYTES
    return whole[skip:skip + nbytes]


def _targets(model: Any) -> list[tuple[Any, str, torch.Tensor]]:
    """(owner, attribute, tensor) for every CPU full-precision weight :func:`move_weights` moves."""
    out: list[tuple[Any, str, torch.Tensor]] = []
    linears = getattr(model, "_linears", None)
    for lin in (linears().values() if linears is not None else ()):
        w = getattr(lin, "weight", None)
        if isinstance(w, torch.Tensor) and w.device.type == "cpu" and w.is_contiguous():
            out.append((lin, "weight", w))
    emb = getattr(model, "tok_embeddings", None)
    if isinstance(emb, torch.Tensor) and emb.device.type == "cpu" and emb.is_contiguous():
        out.append((model, "tok_embeddings", emb))
    return out


def move_weights(model: Any) -> int:
    """Copy ``model``'s CPU full-precision linear weights (``engine.model.Linear.weight``, any layout)
    and its untied ``tok_embeddings`` into one huge-page buffer (:func:`huge_buffer`) and point the
    model at the copies (same shapes, dtypes and values). Returns the bytes moved (0 when
    :func:`enabled` is false or there is nothing to move). Call before the first forward pass (the
    fused decode op caches its weight lists; ``Linear.weight`` assignments invalidate that cache)."""
    if not enabled():
        return 0
    targets = _targets(model)
    offsets, total = [], 0
    for _, _, t in targets:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // WEIGHT_ALIGN) * WEIGHT_ALIGN
    if total == 0:
        return 0
    buf = huge_buffer(total)
    for (owner, attr, t), off in zip(targets, offsets):
        n = t.numel() * t.element_size()
        dst = buf[off:off + n].view(t.dtype).view(t.shape)
        dst.copy_(t)
        setattr(owner, attr, dst)
    return total


def anon_huge_kb() -> int | None:
    """This process's ``AnonHugePages`` in KiB from ``/proc/self/smaps_rollup`` (None where the file
    or the field is missing)."""
    try:
        with open("/proc/self/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
