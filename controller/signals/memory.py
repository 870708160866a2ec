"""Memory signals: allocator fragmentation, free and used memory, KV-block waste.

Formulas and their sources:

* allocator fragmentation = (reserved − allocated) / reserved bytes, the PyTorch caching
  allocator's "reserved but unallocated" share (``torch.cuda.memory_reserved`` /
  ``memory_allocated``); from an OOM message, U / (A + U). This is *not* free memory:
  ``100 − used/total·100`` (the original design notes' query) is :func:`free_memory_ratio`.
* KV waste = 1 − tokens stored / (blocks used × block size) (internal fragmentation of paged
  KV blocks, vLLM/PagedAttention, Kwon et al. 2023).
"""

from __future__ import annotations

from typing import Any

from inferctl.controller.gpu.base import MEMORY_ROUNDING_TOLERANCE_BYTES
from inferctl.controller.signals.validation import validate_nonneg
from inferctl.controller.signals.values import (InvalidSampleCounter, Signal, first_missing,
                                                invalid_signal, no_data)


def fragmentation_ratio(reserved_bytes: Any, allocated_bytes: Any,
                        counter: InvalidSampleCounter | None = None) -> Signal:
    """Allocator fragmentation = (reserved − allocated) / reserved, in 0..1.

    ``reserved_bytes`` is what the caching allocator holds from the device,
    ``allocated_bytes`` what tensors use of it (PyTorch ``memory_reserved`` /
    ``memory_allocated``). None when reserved is missing or 0; invalid (counted) when
    negative/NaN or allocated > reserved.
    """
    name = "fragmentation_ratio"
    r = validate_nonneg(reserved_bytes, name, counter)
    a = validate_nonneg(allocated_bytes, name, counter)
    inputs = {"reserved_bytes": reserved_bytes, "allocated_bytes": allocated_bytes}
    if r.value is None or a.value is None:
        bad = r if r.value is None else a
        which = "reserved_bytes" if bad is r else "allocated_bytes"
        return Signal(name, None, f"{which}: {bad.reason}", bad.invalid, inputs)
    if r.value == 0:
        return no_data(name, "nothing reserved (reserved_bytes is 0)", **inputs)
    if a.value > r.value:
        return invalid_signal(name, "inconsistent",
                        f"allocated {a.value:.0f} B > reserved {r.value:.0f} B", counter, **inputs)
    frag = (r.value - a.value) / r.value
    inputs["unallocated_bytes"] = r.value - a.value
    return Signal(name, frag, None, False, inputs)


def fragmentation_from_oom(allocated_bytes: Any, reserved_unallocated_bytes: Any,
                           counter: InvalidSampleCounter | None = None) -> Signal:
    """Fragmentation from an OOM record: U / (A + U), where A is "allocated by PyTorch" and U
    "reserved by PyTorch but unallocated" (the same formula as :func:`fragmentation_ratio`
    with reserved = A + U). docs/field-cases.md F13: (a) A 13.73 GiB, U 736.86 MiB → 4.98 %."""
    a = validate_nonneg(allocated_bytes, "fragmentation_ratio", counter)
    u = validate_nonneg(reserved_unallocated_bytes, "fragmentation_ratio", counter)
    raw = {"allocated_bytes": allocated_bytes,
           "reserved_unallocated_bytes": reserved_unallocated_bytes}
    if (missing := first_missing("fragmentation_ratio", raw, a, u)) is not None:
        return missing
    return fragmentation_ratio(a.value + u.value, a.value, counter)


def free_memory_ratio(used_bytes: Any, total_bytes: Any,
                      counter: InvalidSampleCounter | None = None) -> Signal:
    """Free memory = 1 − used / total: what the original design notes called
    "fragmentation" (``100 − used/total·100``). It measures head-room, not fragmentation —
    see docs/signals.md. None if total is missing/0; invalid if used > total."""
    name = "free_memory_ratio"
    u = validate_nonneg(used_bytes, name, counter)
    t = validate_nonneg(total_bytes, name, counter)
    inputs = {"used_bytes": used_bytes, "total_bytes": total_bytes}
    if (missing := first_missing(name, inputs, u, t)) is not None:
        return missing
    if t.value == 0:
        return no_data(name, "total_bytes is 0", **inputs)
    if u.value > t.value:
        return invalid_signal(name, "inconsistent", f"used {u.value:.0f} B > total {t.value:.0f} B",
                        counter, **inputs)
    return Signal(name, 1.0 - u.value / t.value, None, False, inputs)


def memory_used_ratio(used_bytes: Any, total_bytes: Any, reserved_bytes: Any = None,
                      *, count_reserved: bool = False, free_bytes: Any = None,
                      tolerance_bytes: int = MEMORY_ROUNDING_TOLERANCE_BYTES,
                      counter: InvalidSampleCounter | None = None) -> Signal:
    """used / total, by default NVML v2 "used" (allocations only); with
    ``count_reserved=True`` the driver-reserved bytes are added (docs/field-cases.md F11: RTX 3060, 116 MiB used,
    368 MiB reserved of 12288 MiB → 0.94 %, or 3.94 % counting reserved).

    nvidia-smi and DCGM round each MiB value on its own, so the parts may add up to a few MiB
    more than the total (docs/field-cases.md F11: used 116 + free 11806 + reserved 368 = 12290 of 12288 MiB).
    Differences up to ``tolerance_bytes`` (``controller.gpu.base.MEMORY_ROUNDING_TOLERANCE_BYTES``,
    4 MiB) are rounding, not invalid: used (+ reserved) over total by at most that much reads
    1.0, and with ``free_bytes`` given, ``used + free + reserved`` must equal total within it
    (``inputs["accounting_gap_bytes"]`` carries the difference). Beyond it the sample is
    inconsistent: ``None``, counted as invalid."""
    name = "memory_used_ratio"
    u = validate_nonneg(used_bytes, name, counter)
    t = validate_nonneg(total_bytes, name, counter)
    if u.value is None or t.value is None or t.value == 0:
        bad = u if u.value is None else t
        return Signal(name, None, bad.reason or "total_bytes is 0", bad.invalid,
                      {"used_bytes": used_bytes, "total_bytes": total_bytes})
    used = u.value
    reserved = None
    if count_reserved or (free_bytes is not None and reserved_bytes is not None):
        r = validate_nonneg(reserved_bytes, name, counter)
        if r.value is None:
            return Signal(name, None, f"reserved_bytes: {r.reason}", r.invalid,
                          {"reserved_bytes": reserved_bytes})
        reserved = r.value
    if count_reserved:
        used += reserved
    inputs: dict[str, Any] = {"used_bytes": used, "total_bytes": t.value,
                              "count_reserved": count_reserved}
    if free_bytes is not None:
        f = validate_nonneg(free_bytes, name, counter)
        if f.value is None:
            return Signal(name, None, f"free_bytes: {f.reason}", f.invalid,
                          {"free_bytes": free_bytes})
        gap = u.value + f.value + (reserved or 0.0) - t.value
        if abs(gap) > tolerance_bytes:
            return invalid_signal(name, "inconsistent",
                            f"used + free + reserved is {gap:+.0f} B off total {t.value:.0f} B "
                            f"(more than the {tolerance_bytes} B of MiB rounding)", counter,
                            used_bytes=used_bytes, free_bytes=free_bytes,
                            reserved_bytes=reserved_bytes, total_bytes=t.value)
        inputs["accounting_gap_bytes"] = gap
    if used > t.value + tolerance_bytes:
        return invalid_signal(name, "inconsistent", f"used {used:.0f} B > total {t.value:.0f} B "
                        f"(more than the {tolerance_bytes} B of MiB rounding)",
                        counter, used_bytes=used, total_bytes=t.value)
    return Signal(name, min(used / t.value, 1.0), None, False, inputs)


def kv_waste_ratio(tokens_stored: Any, blocks_used: Any, block_size: Any,
                   counter: InvalidSampleCounter | None = None) -> Signal:
    """KV internal waste = 1 − tokens stored / (blocks used × block size). None with no block
    in use; invalid when more tokens are stored than the blocks hold."""
    name = "kv_waste_ratio"
    vals = [validate_nonneg(x, name, counter) for x in (tokens_stored, blocks_used, block_size)]
    inputs = {"tokens_stored": tokens_stored, "blocks_used": blocks_used, "block_size": block_size}
    if (missing := first_missing(name, inputs, *vals)) is not None:
        return missing
    tokens, blocks, bs = (v.value for v in vals)
    capacity = blocks * bs
    if capacity == 0:
        return no_data(name, "no KV block in use", **inputs)
    if tokens > capacity:
        return invalid_signal(name, "inconsistent",
                        f"{tokens:g} tokens stored > {capacity:g} slots in {blocks:g} blocks",
                        counter, **inputs)
    return Signal(name, 1.0 - tokens / capacity, None, False, inputs)
