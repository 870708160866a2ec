"""Byte sizes: one parser for every size the project reads, and two printers.

* :func:`parse_size` reads ``"8000000"``, ``"64MiB"``, ``"1.5 GiB"``, ``"500MB"``,
  ``"41.56 MiB"`` (PyTorch's OOM messages) and ``"81559 MiB"`` (nvidia-smi). IEC suffixes
  (Ki, KiB, Mi, MiB, Gi, GiB, Ti, TiB) are powers of 1024. SI suffixes (K, KB, M, MB, G, GB,
  T, TB) are powers of 1000 by default, as in Kubernetes quantities; ``decimal_si=False``
  reads them as powers of 1024, as PyTorch and nvidia-smi mean them. Case-insensitive.
* :func:`parse_size_or_none` is the lenient variant for recorded captures: ``None`` instead
  of an error.
* :func:`format_bytes` prints bytes in binary units for people (``"41.56 MiB"``);
  :func:`format_size` prints them exactly as PyTorch's c10 ``format_size`` does (the OOM
  message format, ``c10/util/Logging``/``CUDACachingAllocator.cpp``).

Pure functions, no project imports.
"""

from __future__ import annotations

import re
from types import MappingProxyType

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_IEC = {"ki": KiB, "kib": KiB, "mi": MiB, "mib": MiB, "gi": GiB, "gib": GiB, "ti": TiB, "tib": TiB}
_BYTES = {"": 1, "b": 1, "byte": 1, "bytes": 1}
#: Suffix → bytes with SI suffixes as powers of 1000 (Kubernetes quantities, CLI flags).
DECIMAL_UNITS = MappingProxyType({
    **_BYTES, **_IEC,
    "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
    "t": 1000 ** 4, "tb": 1000 ** 4,
})
#: Suffix → bytes with SI suffixes as powers of 1024 (PyTorch messages, nvidia-smi).
BINARY_UNITS = MappingProxyType({
    **_BYTES, **_IEC,
    "k": KiB, "kb": KiB, "m": MiB, "mb": MiB, "g": GiB, "gb": GiB, "t": TiB, "tb": TiB,
})

_RE_SIZE = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]*)\s*$")


class SizeError(ValueError):
    """A text is not a byte size; the message names the field (``name``) and the text."""


def parse_size(text: str, name: str = "size", *, default_unit: str | None = "B",
               decimal_si: bool = True, min_bytes: int = 0) -> int:
    """Parse a byte size into an int number of bytes (rounded to the nearest byte).

    Args:
        text: ``"<number>[ ]<unit>"``; the number may carry a decimal point or an exponent.
        name: the field named in error messages (e.g. ``"--memory-budget"``).
        default_unit: the unit of a bare number (``"B"``: bytes; ``"MiB"`` for nvidia-smi
            columns); ``None`` requires a unit.
        decimal_si: SI suffixes as powers of 1000 (True) or of 1024 (False).
        min_bytes: the smallest accepted value (1 for a budget).

    Raises:
        SizeError (a ValueError): not a size, an unknown unit, a missing unit where one is
        required, a negative value, or a value below ``min_bytes``; the message starts with
        ``name``.
    """
    match = _RE_SIZE.match(str(text))
    if not match:
        raise SizeError(f"{name}: {text!r} is not a size (e.g. 8000000, 64MiB, 1.5GiB)")
    number, unit = float(match.group(1)), match.group(2)
    if not unit:
        if default_unit is None:
            raise SizeError(f"{name}: {text!r} is not '<number> <unit>' (a unit is required)")
        unit = default_unit
    units = DECIMAL_UNITS if decimal_si else BINARY_UNITS
    factor = units.get(unit.lower())
    if factor is None:
        raise SizeError(f"{name}: unknown unit {unit!r}; use B, KB, MB, GB, KiB, MiB, GiB, TiB")
    if number < 0:
        raise SizeError(f"{name}: must be >= 0 bytes, got {text!r}")
    value = int(round(number * factor))
    if value < min_bytes:
        plural = "" if min_bytes == 1 else "s"
        raise SizeError(f"{name}: must be at least {min_bytes} byte{plural}, got {text!r}")
    return value


def parse_size_or_none(text: str | None, *, default_unit: str | None = "B",
                       decimal_si: bool = True) -> int | None:
    """:func:`parse_size`, but ``None`` for ``None`` and for anything it would reject
    (recorded captures: "no data" is never 0)."""
    if text is None:
        return None
    try:
        return parse_size(text, default_unit=default_unit, decimal_si=decimal_si)
    except SizeError:
        return None


def format_bytes(n: float | None) -> str:
    """Bytes for people, binary units with two decimals: 43578819 → ``"41.56 MiB"``,
    1023 → ``"1023 bytes"``; ``None`` → ``"no data"``."""
    if n is None:
        return "no data"
    n = float(n)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} bytes"


def format_size(nbytes: int) -> str:
    """Bytes exactly as PyTorch's c10 ``format_size`` prints them in OOM messages:
    ``"N bytes"`` up to 1 KiB, then KiB/MiB/GiB with two decimals, boundaries inclusive
    (1024 → ``"1024 bytes"``, 1 MiB → ``"1024.00 KiB"``)."""
    n = int(nbytes)
    if n <= KiB:
        return f"{n} bytes"
    if n <= MiB:
        return f"{n / KiB:.2f} KiB"
    if n <= GiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / GiB:.2f} GiB"
