"""What every nvidia-smi capture parser shares: the parsed-capture type, the format error, and
the readers of nvidia-smi's scalar values.

Memory is returned in bytes (MiB x 1048576), ratios in 0..1, power in W, clocks in MHz. "No
data" strings (``N/A``, ``[N/A]``, ``[Not Supported]``, ``Requested functionality has been
deprecated``, ``[Unknown Error]``, ``ERR!``, ``[GPU requires reset]``, ...) become ``None``,
never 0.
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, field
from typing import Iterable

from inferctl.contract.units import parse_size_or_none
from inferctl.controller.types import GpuProcess, GpuSnapshot

_NO_DATA = {
    "", "n/a", "na", "not supported", "unknown error", "requested functionality has been deprecated",
    "err!", "gpu requires reset", "insufficient permissions", "not available", "unknown",
    "no permission", "not found", "gpu is lost",
}

_NUM_RE = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]*)\s*$")


class CaptureFormatError(ValueError):
    """A capture could not be parsed; the message names the format and what was wrong."""


@dataclass
class ParsedCapture:
    """One parsed capture: the GPUs it holds and what it says about itself."""

    kind: str                                 # "q", "qx", "query_gpu", "compute_apps", "dcgm"
    gpus: list[GpuSnapshot] = field(default_factory=list)
    timestamp: float | None = None            # capture time, UTC seconds, when it prints one
    driver_version: str | None = None
    cuda_version: str | None = None
    processes: dict[str, list[GpuProcess]] = field(default_factory=dict)  # compute_apps: by GPU uuid


def is_no_data(value: str | None) -> bool:
    """True for ``None`` and nvidia-smi's "no data" strings (brackets and case ignored)."""
    if value is None:
        return True
    v = value.strip().strip("[]").strip().lower()
    return v in _NO_DATA


def parse_number(value: str | None) -> float | None:
    """``"52 %"`` -> 52.0, ``"629.45 W"`` -> 629.45, ``"1980 MHz"`` -> 1980.0; "no data" -> None.
    Anything that is not a number with an optional unit -> None."""
    if is_no_data(value):
        return None
    m = _NUM_RE.match(value)  # type: ignore[arg-type]
    if not m:
        return None
    return float(m.group(1))


def parse_bytes(value: str | None, default_unit: str = "MiB") -> int | None:
    """``"81559 MiB"`` -> 85520809984; a bare number is read in ``default_unit``; KB/MB/GB are
    powers of 1024, as nvidia-smi means them. "No data", a negative number, an unknown unit
    (``"52 %"``) or any other text -> None. The size reader is the contract's
    (:func:`inferctl.contract.units.parse_size_or_none`)."""
    if is_no_data(value):
        return None
    return parse_size_or_none(value, default_unit=default_unit, decimal_si=False)


def parse_ratio_percent(value: str | None) -> float | None:
    """``"52 %"`` -> 0.52; values outside 0..100 % are invalid -> None."""
    n = parse_number(value)
    if n is None or n < 0 or n > 100:
        return None
    return n / 100.0


def parse_bool(value: str | None) -> bool | None:
    """Enabled/Yes/Active/True/1 -> True; Disabled/No/Not Active/False/0 -> False; else None."""
    if is_no_data(value):
        return None
    v = value.strip().strip("[]").strip().lower()  # type: ignore[union-attr]
    if v in ("enabled", "yes", "active", "true", "1", "on"):
        return True
    if v in ("disabled", "no", "not active", "false", "0", "off"):
        return False
    return None


def parse_int(value: str | None) -> int | None:
    """:func:`parse_number` truncated to an int (``"3"`` -> 3, ``"2.7"`` -> 2); "no data" -> None."""
    n = parse_number(value)
    return None if n is None else int(n)


_RECOVERY = {"none": 0, "gpureset": 1, "reset": 1, "nodereboot": 2, "reboot": 2, "drainp2p": 3,
             "drainandreset": 4}


def parse_recovery_action(value: str | None) -> int | None:
    """nvidia-smi "GPU Recovery Action" -> NVML field 230 value: None->0, GPU Reset->1,
    Node Reboot->2, Drain P2P->3, Drain and Reset->4; a number is taken as is."""
    if value is None or is_no_data(value):
        return None
    n = parse_number(value)
    if n is not None:
        return int(n)
    key = re.sub(r"[^a-z0-9]", "", value.lower())
    return _RECOVERY.get(key)


def recovery_from_reset_status(reset_required: str | None, drain_and_reset: str | None) -> int | None:
    """Older drivers' "GPU Reset Status" -> field-230 vocabulary: drain-and-reset recommended -> 4,
    reset required -> 1, both "No" -> 0, no data -> None."""
    rr, dr = parse_bool(reset_required), parse_bool(drain_and_reset)
    if dr:
        return 4
    if rr:
        return 1
    if rr is False or dr is False:
        return 0
    return None


def parse_smi_timestamp(value: str | None) -> float | None:
    """``"Tue Jul 14 08:12:53 2026"`` or ``"2026/07/14 08:12:53.500"`` -> seconds since the epoch,
    read as UTC (nvidia-smi prints local time without a zone; captures are compared relatively)."""
    if is_no_data(value):
        return None
    v = " ".join(value.split())  # type: ignore[union-attr]
    for fmt in ("%a %b %d %H:%M:%S %Y", "%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            frac = 0.0
            if fmt.endswith(".%f"):
                head, _, tail = v.partition(".")
                frac = float("0." + tail) if tail.isdigit() else 0.0
                st = time.strptime(head, fmt[:-3])
            else:
                st = time.strptime(v, fmt)
            return calendar.timegm(st) + frac
        except ValueError:
            continue
    return None


def strip_comments(text: str) -> str:
    """Drop leading ``#`` provenance lines (fixture headers) before the capture itself."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and (lines[i].lstrip().startswith("#") or not lines[i].strip()):
        i += 1
    return "\n".join(lines[i:])


def ecc_counts(bit_totals: tuple[str | None, str | None] | None,
                leaves: Iterable[tuple[str, str | None]]) -> tuple[int | None, int | None]:
    """``(corrected, uncorrected)`` volatile ECC error counts, from either layout of
    ``nvidia-smi -q`` and ``-q -x``. ``bit_totals``: the raw single-bit and double-bit totals
    of the older layouts (an absent one None), or None for the 535+ layout, whose ``leaves``
    are ``(name, raw value)``: a name with "uncorrectable" counts as uncorrected, another with
    "correctable" as corrected (``leaves`` is read only then). A kind with no number -> None."""
    corr: list[int] = []
    unc: list[int] = []
    if bit_totals is not None:
        for raw, acc in zip(bit_totals, (corr, unc)):
            v = parse_int(raw)
            if v is not None:
                acc.append(v)
    else:
        for key, raw in leaves:
            v = parse_int(raw)
            if v is None:
                continue
            k = key.lower()
            if "uncorrectable" in k:
                unc.append(v)
            elif "correctable" in k:
                corr.append(v)
    return (sum(corr) if corr else None, sum(unc) if unc else None)
