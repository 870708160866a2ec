"""GPU snapshot hygiene: impossible values of a ``GpuSnapshot`` become no data."""

from __future__ import annotations

import math
from typing import Any

from inferctl.controller.gpu.base import MEMORY_ROUNDING_TOLERANCE_BYTES
from inferctl.controller.signals.validation import plain_number, validate_nonneg, validate_ratio
from inferctl.controller.signals.values import InvalidSampleCounter

#: ``GpuSnapshot`` number fields that are never negative (bytes, counts, watts, MHz, codes).
GPU_NONNEG_FIELDS = ("memory_total_bytes", "memory_used_bytes", "memory_free_bytes",
                     "memory_reserved_bytes", "power_watts", "power_limit_watts", "clocks_sm_mhz",
                     "clocks_mem_mhz", "ecc_corrected", "ecc_uncorrected", "ecc_corrected_aggregate",
                     "ecc_uncorrected_aggregate", "recovery_action")
#: ``GpuSnapshot`` ratio fields (0..1).
GPU_RATIO_FIELDS = ("utilization_ratio", "memory_bandwidth_utilization_ratio", "fan_ratio")
#: ``GpuSnapshot`` temperatures (°C): finite and not below absolute zero (−273.15 °C).
GPU_TEMPERATURE_FIELDS = ("temperature_celsius", "memory_temperature_celsius")
ABSOLUTE_ZERO_CELSIUS = -273.15


def clean_gpu_snapshot(snap: Any, counter: InvalidSampleCounter | None = None) -> list[str]:
    """Replace every impossible value of a ``GpuSnapshot`` with ``None`` (no data), in place,
    and return the names of the fields replaced (each counted as ``gpu_<field>``).

    Impossible: a number field that is not a finite number (a string, NaN, an integer beyond
    float range), a negative byte count / power / clock / counter, a ratio outside 0..1, a
    temperature below absolute zero, ``used``/``free``/``reserved`` memory above ``total`` by
    more than the MiB rounding of nvidia-smi and DCGM (``MEMORY_ROUNDING_TOLERANCE_BYTES``), an
    ``index`` that is not an integer >= 0. ``lost`` that is not a bool is read as its truth
    value (a rail never resets a GPU that might be lost). A whole reading is never dropped for
    one bad field: the rest stays usable."""
    bad: list[str] = []

    def drop(field: str, code: str) -> None:
        setattr(snap, field, None)
        bad.append(field)
        if counter is not None:
            counter.record(f"gpu_{field}", code)

    for field in GPU_NONNEG_FIELDS:
        v = getattr(snap, field, None)
        if v is not None and not plain_number(v) and validate_nonneg(v).value is None:
            drop(field, _reason(v))
    for field in GPU_RATIO_FIELDS:
        v = getattr(snap, field, None)
        if v is not None and not plain_number(v, 1.0) and validate_ratio(v).value is None:
            drop(field, _reason(v, ratio=True))
    for field in GPU_TEMPERATURE_FIELDS:
        v = getattr(snap, field, None)
        if v is None:
            continue
        ok = not isinstance(v, bool) and isinstance(v, (int, float))
        try:
            ok = ok and math.isfinite(float(v)) and float(v) >= ABSOLUTE_ZERO_CELSIUS
        except OverflowError:
            ok = False
        if not ok:
            drop(field, "out_of_range" if isinstance(v, (int, float)) else "not_a_number")
    total = snap.memory_total_bytes
    if total is not None:
        for field in ("memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes"):
            v = getattr(snap, field)
            if v is not None and v > total + MEMORY_ROUNDING_TOLERANCE_BYTES:
                drop(field, "above_total")
    index = getattr(snap, "index", None)
    if index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
        drop("index", "not_an_index")
    if not isinstance(snap.lost, bool):
        snap.lost = bool(snap.lost)
        bad.append("lost")
        if counter is not None:
            counter.record("gpu_lost", "not_a_bool")
    return bad


def _reason(v: Any, ratio: bool = False) -> str:
    """The reason code :func:`_check_number` would count for ``v``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "not_a_number"
    try:
        f = float(v)
    except OverflowError:
        return "inf"
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf"
    if f < 0:
        return "negative"
    return "above_one" if ratio else "out_of_range"
