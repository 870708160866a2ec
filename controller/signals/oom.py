"""OOM records: sizes in words, PyTorch's CUDA OOM message, the kind of an OOM, and the
text that marks a hardware fault instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType

MIB = 1 << 20
GIB = 1 << 30


_UNITS = MappingProxyType({"b": 1, "byte": 1, "bytes": 1, "kib": 1 << 10, "mib": MIB,
                           "gib": GIB, "tib": 1 << 40, "kb": 1 << 10, "mb": MIB, "gb": GIB,
                           "tb": 1 << 40})
_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(bytes|byte|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)"


def parse_size(text: str) -> int:
    """``"41.56 MiB"`` → 43578819 bytes (binary units, as PyTorch's ``format_size``).
    Raises ``ValueError`` naming the text when it is not a size."""
    m = re.fullmatch(r"\s*" + _SIZE + r"\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"size: {text!r} is not '<number> <unit>'")
    return int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))


def format_bytes(n: float | None) -> str:
    """Bytes in words with binary units and two decimals, as PyTorch prints them:
    43578819 → "41.56 MiB"; None → "no data"."""
    if n is None:
        return "no data"
    n = float(n)
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} bytes"


@dataclass(frozen=True)
class OomNumbers:
    """Numbers from a CUDA OOM message (bytes; None where the message does not say)."""

    requested_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None


_OOM_PATTERNS = MappingProxyType({
    "requested_bytes": (r"Tried to allocate " + _SIZE,),
    "total_bytes": (r"total capacity of " + _SIZE, _SIZE + r" total capacity"),
    "free_bytes": (r"of which " + _SIZE + r" is free", _SIZE + r" free"),
    "allocated_bytes": (_SIZE + r" is allocated by PyTorch", _SIZE + r" already allocated"),
    "reserved_unallocated_bytes": (_SIZE + r" is reserved by PyTorch but unallocated",),
})


def parse_oom_message(text: str | None) -> OomNumbers:
    """Parse PyTorch's CUDA OOM message, both formats:

    * ≥ 2.1: "CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of
      31.40 GiB of which 41.56 MiB is free. ... Of the allocated memory 13.73 GiB is allocated
      by PyTorch, and 736.86 MiB is reserved by PyTorch but unallocated."
    * older: "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already
      allocated; 3.12 MiB free; 14.59 GiB reserved in total by PyTorch)" — there U =
      reserved in total − already allocated.

    Fields the message lacks are None; never raises on odd text.
    """
    if not isinstance(text, str) or not text:   # a non-string message has no numbers
        return OomNumbers()
    found: dict[str, int | None] = {}
    for key, pats in _OOM_PATTERNS.items():
        found[key] = None
        for pat in pats:
            m = re.search(pat, text, re.IGNORECASE)
            if m:
                found[key] = int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))
                break
    if found["reserved_unallocated_bytes"] is None and found["allocated_bytes"] is not None:
        m = re.search(_SIZE + r" reserved in total", text, re.IGNORECASE)
        if m:
            reserved = int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))
            found["reserved_unallocated_bytes"] = max(0, reserved - found["allocated_bytes"])
    return OomNumbers(**found)


def classify_oom(numbers: OomNumbers) -> str | None:
    """The kind of an OOM (F13): ``impossible`` when requested > total (no amount of freeing
    helps: reject with 4xx, no switch), ``fragmentation`` when reserved-but-unallocated ≥
    requested (freeing the cache can satisfy it), else ``exhaustion`` (the int8 switch).
    None when the requested size is unknown."""
    r = numbers.requested_bytes
    if r is None:
        return None
    if numbers.total_bytes is not None and r > numbers.total_bytes:
        return "impossible"
    if numbers.reserved_unallocated_bytes is not None and numbers.reserved_unallocated_bytes >= r:
        return "fragmentation"
    return "exhaustion"


_HARDWARE_TEXT = re.compile(
    r"\bxid\b|gpu is lost|gpuislost|fallen off the bus|uncorrectable ecc|ecc error|"
    r"uncorrectable error|double bit ecc|row remapping failure|nvrm:",
    re.IGNORECASE)


def hardware_fault_evidence(text: str | None) -> str | None:
    """The phrase in ``text`` that marks a hardware fault (Xid, GPU lost / fallen off the bus,
    uncorrectable ECC), or None. An engine may report such a fault as "out of memory"; it is
    never an int8 trigger."""
    if not isinstance(text, str) or not text:
        return None
    m = _HARDWARE_TEXT.search(text)
    return m.group(0) if m else None
