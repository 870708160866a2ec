"""The GPU source interface and memory helpers on snapshots.

Every source (``nvml``, ``dcgm``, ``replay``, ``sim``) answers ``poll(now)`` with a
:class:`~controller.types.GpuReading`: one :class:`~controller.types.GpuSnapshot` per physical
GPU keyed by UUID, and ``ok``/``error`` for the telemetry itself. A telemetry fault (driver gone,
exporter down, NVML hung) is never raised: it is ``ok=False`` with ``error`` in words, and no
memory numbers (never 0), so nothing downstream mistakes a broken sensor for free memory.
"""

from __future__ import annotations

import abc

from inferctl.controller.types import GpuReading, GpuSnapshot

MIB = 1024 * 1024

#: nvidia-smi and DCGM print memory in whole MiB, each value rounded on its own, so
#: ``used + free + reserved`` may differ from ``total`` by a couple of MiB (seen in the real
#: captures: A100 81918 vs 81920, H100 81560 vs 81559, RTX 3060 12290 vs 12288). Differences
#: up to this many bytes are rounding, not "used > total".
MEMORY_ROUNDING_TOLERANCE_BYTES = 4 * MIB


class GpuSource(abc.ABC):
    """One place GPU telemetry comes from.

    Subclasses set ``name`` (``"nvml"``, ``"dcgm"``, ``"replay"``, ``"sim"``) and implement
    :meth:`poll`. ``simulated`` is True only for the simulated GPU, so status pages can say so.
    """

    name: str = "gpu"
    simulated: bool = False

    @abc.abstractmethod
    def poll(self, now: float) -> GpuReading:
        """Read every GPU once. ``now`` is ``time.time()`` seconds (the replay source also uses it
        as its clock). Never raises for telemetry faults: returns ``ok=False`` with ``error``."""

    def close(self) -> None:
        """Release what the source holds (NVML handles, HTTP clients). Idempotent."""

    def __enter__(self) -> "GpuSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def down_reading(source: str, now: float, error: str) -> GpuReading:
    """A reading that says telemetry is down: ``ok=False``, no GPUs, so no memory numbers."""
    return GpuReading(source=source, ok=False, gpus={}, error=error, time=now)


def used_ratio(snapshot: GpuSnapshot, count_reserved: bool = False) -> float | None:
    """Fraction of GPU memory in use, 0..1, or ``None`` (no data).

    ``count_reserved=False`` (the policy default): ``used / total``, where ``used`` is NVML v2
    "used" (allocations, excluding driver/firmware ``reserved``). ``count_reserved=True``:
    ``(used + reserved) / total``; ``None`` when reserved is unknown. docs/field-cases.md F11 (RTX 3060, MiB total
    12288, used 116, reserved 368): 0.0094 by default, 0.0394 counting reserved.
    Source: NVML ``nvmlMemory_v2_t`` (used excludes reserved); docs/gpu-telemetry.md.
    """
    total = snapshot.memory_total_bytes
    used = snapshot.memory_used_bytes
    if total is None or used is None or total <= 0 or used < 0:
        return None
    if count_reserved:
        reserved = snapshot.memory_reserved_bytes
        if reserved is None or reserved < 0:
            return None
        used = used + reserved
    ratio = used / total
    if ratio > 1.0:
        # within rounding of total: clamp; beyond it the sample is inconsistent -> no data
        if used - total <= MEMORY_ROUNDING_TOLERANCE_BYTES:
            return 1.0
        return None
    return ratio


def memory_accounting_gap_bytes(snapshot: GpuSnapshot) -> int | None:
    """``used + free + reserved - total`` in bytes (``reserved`` counted as 0 when unknown), or
    ``None`` when total, used or free is unknown. docs/field-cases.md F11: 12290 - 12288 MiB = +2 MiB."""
    s = snapshot
    if s.memory_total_bytes is None or s.memory_used_bytes is None or s.memory_free_bytes is None:
        return None
    reserved = s.memory_reserved_bytes or 0
    return s.memory_used_bytes + s.memory_free_bytes + reserved - s.memory_total_bytes


def memory_consistent(snapshot: GpuSnapshot,
                      tolerance_bytes: int = MEMORY_ROUNDING_TOLERANCE_BYTES) -> bool | None:
    """True when ``used + free + reserved`` equals ``total`` within MiB rounding
    (``tolerance_bytes``, default 4 MiB); False when it is off by more; None without data."""
    gap = memory_accounting_gap_bytes(snapshot)
    if gap is None:
        return None
    return abs(gap) <= tolerance_bytes
