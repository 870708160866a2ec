"""Out-of-memory and device-fault texts: what the engine writes and the controller reads.

* :func:`parse_oom_message` reads PyTorch's CUDA OOM message in both formats into an
  :class:`OomInfo` (fields it lacks are ``None``: no data, never 0); it never raises.
  :func:`parse_oom_message_strict` raises when the text holds no "Tried to allocate" clause.
* :func:`classify_oom`: ``impossible`` / ``fragmentation`` / ``exhaustion``
  (docs/field-cases.md, the OOM kinds).
* :func:`parse_cuda_error_code`, :func:`hardware_fault_evidence`, :func:`classify_error_text`:
  which errors are OOMs (a CUDA code in the configured set, default ``{2, 800}``) and which
  are hardware faults (Xid, GPU lost, uncorrectable ECC, the sticky 700–719 launch errors),
  never an int8 trigger.

Message formats (PyTorch ``c10/cuda/CUDACachingAllocator.cpp``):

* ≥ 2.1: "CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of
  31.40 GiB of which 41.56 MiB is free. ... Of the allocated memory 13.73 GiB is allocated
  by PyTorch, and 736.86 MiB is reserved by PyTorch but unallocated." (2.1 printed
  "capacty"; some wrappers print "GPU 0 has 41.56 MiB free" or leave the clause out.)
* < 2.1: "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already
  allocated; 3.12 MiB free; 14.59 GiB reserved in total by PyTorch)"; there the
  reserved-but-unallocated bytes U = reserved in total − already allocated.

Sizes are binary units as PyTorch prints them ("MB" read as MiB). Pure, no project imports
but :mod:`inferctl.contract.units`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from inferctl.contract.units import BINARY_UNITS

#: CUDA error codes counted as out-of-memory by default: cudaErrorMemoryAllocation (2) and
#: cudaErrorNotPermitted (800, what some drivers return when a MIG/MPS memory limit is hit).
DEFAULT_OOM_ERROR_CODES: frozenset[int] = frozenset({2, 800})

#: Error classes of :func:`classify_error_text` (an engine fault's ``kind`` family).
ERROR_OOM = "oom"
ERROR_HARDWARE = "hardware"
ERROR_OTHER = "other"
ERROR_CLASSES = (ERROR_OOM, ERROR_HARDWARE, ERROR_OTHER)

#: OOM kinds of :func:`classify_oom`.
OOM_IMPOSSIBLE = "impossible"
OOM_FRAGMENTATION = "fragmentation"
OOM_EXHAUSTION = "exhaustion"
OOM_KINDS = (OOM_IMPOSSIBLE, OOM_FRAGMENTATION, OOM_EXHAUSTION)

#: Message formats of :attr:`OomInfo.format`.
FORMAT_NEW = "new"
FORMAT_OLD = "old"
FORMAT_NONE = "none"


@dataclass(frozen=True)
class OomInfo:
    """Numbers of one OOM, in bytes; ``None`` where the message did not say.

    ``reserved_unallocated_bytes`` = reserved − allocated (new format: stated; old format:
    derived from "reserved in total"). ``format`` is ``"new"``, ``"old"`` or ``"none"`` (no
    "Tried to allocate" clause). ``message`` is the parsed text; it does not take part in
    equality (two infos with the same numbers are equal).
    """

    requested_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None
    total_bytes: int | None = None
    device: int | None = None
    format: str = FORMAT_NONE
    message: str = field(default="", compare=False)

    @property
    def reserved_bytes(self) -> int | None:
        """allocated + reserved-unallocated; ``None`` when either is unknown."""
        if self.allocated_bytes is None or self.reserved_unallocated_bytes is None:
            return None
        return self.allocated_bytes + self.reserved_unallocated_bytes

    @property
    def fragmentation_ratio(self) -> float | None:
        """U / (A + U): the share of PyTorch's reserved memory that is cached but unallocated.
        ``None`` when either number is missing or nothing is reserved."""
        reserved = self.reserved_bytes
        if reserved is None or reserved <= 0:
            return None
        return self.reserved_unallocated_bytes / reserved


_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(bytes|byte|[KMGT]i?B|B)"
_I = re.IGNORECASE
_RE_REQUESTED = re.compile(r"Tried to allocate\s+" + _SIZE, _I)
_RE_DEVICE = re.compile(r"GPU\s+(\d+)", _I)
_RE_TOTAL = (re.compile(r"total capac(?:i)?ty of\s+" + _SIZE, _I),
             re.compile(_SIZE + r"\s+total capacity", _I))
_RE_FREE = (re.compile(r"of which\s+" + _SIZE + r"\s+is free", _I),
            re.compile(r"has\s+" + _SIZE + r"\s+free", _I),
            re.compile(_SIZE + r"\s+free", _I))
_RE_ALLOCATED = (re.compile(_SIZE + r"\s+is allocated by PyTorch", _I),
                 re.compile(_SIZE + r"\s+already allocated", _I))
_RE_UNALLOCATED = re.compile(_SIZE + r"\s+is reserved by PyTorch but unallocated", _I)
_RE_RESERVED_OLD = re.compile(_SIZE + r"\s+reserved in total", _I)


def _bytes(m: re.Match) -> int:
    return int(round(float(m.group(1)) * BINARY_UNITS[m.group(2).lower()]))


def _first(patterns: tuple[re.Pattern, ...] | re.Pattern, text: str) -> int | None:
    for pat in patterns if isinstance(patterns, tuple) else (patterns,):
        m = pat.search(text)
        if m:
            return _bytes(m)
    return None


def parse_oom_message(text: str | None) -> OomInfo:
    """Parse a PyTorch CUDA OOM message, old or new format (see the module note).

    Returns an :class:`OomInfo`; every clause the text lacks is ``None``, and a non-string
    or empty text gives ``OomInfo()``. Never raises.
    """
    if not isinstance(text, str) or not text:
        return OomInfo()
    requested = _first(_RE_REQUESTED, text)
    dev = _RE_DEVICE.search(text)
    device = int(dev.group(1)) if dev else None
    allocated = _first(_RE_ALLOCATED, text)
    unallocated = _first(_RE_UNALLOCATED, text)
    old = "already allocated" in text or "reserved in total" in text
    if unallocated is None and allocated is not None:
        reserved = _first(_RE_RESERVED_OLD, text)
        if reserved is not None:
            unallocated = max(0, reserved - allocated)
    fmt = FORMAT_NONE if requested is None else (FORMAT_OLD if old else FORMAT_NEW)
    return OomInfo(requested, _first(_RE_FREE, text), allocated, unallocated,
                   _first(_RE_TOTAL, text), device, fmt, text)


def parse_oom_message_strict(text: str) -> OomInfo:
    """:func:`parse_oom_message` for a text that must be a PyTorch OOM message.

    Raises:
        ValueError: the text holds no "Tried to allocate" clause (e.g. ``"CUDA error: out
        of memory"``, an OOM without numbers).
    """
    info = parse_oom_message(text)
    if info.requested_bytes is None:
        raise ValueError("not a PyTorch OOM message: no 'Tried to allocate' clause")
    return info


def classify_oom(info: OomInfo) -> str | None:
    """The kind of an OOM (docs/field-cases.md): ``"impossible"`` when the request exceeds
    the device's total capacity (reject the request, no retry, no switch);
    ``"fragmentation"`` when reserved-but-unallocated ≥ requested (the memory exists but is
    cached in split segments: free the cache first); else ``"exhaustion"`` (memory is really
    used up: the int8 switch). ``None`` when the requested size is unknown."""
    req = info.requested_bytes
    if req is None:
        return None
    if info.total_bytes is not None and req > info.total_bytes:
        return OOM_IMPOSSIBLE
    if info.reserved_unallocated_bytes is not None and info.reserved_unallocated_bytes >= req:
        return OOM_FRAGMENTATION
    return OOM_EXHAUSTION


# ---------------------------------------------------------------------------- CUDA errors
#: cudaError_t names → codes (CUDA Runtime API, enum cudaError).
CUDA_ERROR_NAMES = {
    "cudaErrorMemoryAllocation": 2,
    "cudaErrorECCUncorrectable": 214,
    "cudaErrorIllegalAddress": 700,
    "cudaErrorLaunchOutOfResources": 701,
    "cudaErrorLaunchTimeout": 702,
    "cudaErrorHardwareStackError": 714,
    "cudaErrorIllegalInstruction": 715,
    "cudaErrorMisalignedAddress": 716,
    "cudaErrorInvalidAddressSpace": 717,
    "cudaErrorInvalidPc": 718,
    "cudaErrorLaunchFailure": 719,
    "cudaErrorNotPermitted": 800,
}
#: cudaGetErrorString texts → codes (as printed after "CUDA error: ").
CUDA_ERROR_STRINGS = {
    "out of memory": 2,
    "uncorrectable ecc error encountered": 214,
    "an illegal memory access was encountered": 700,
    "too many resources requested for launch": 701,
    "the launch timed out and was terminated": 702,
    "an illegal instruction was encountered": 715,
    "misaligned address": 716,
    "unspecified launch failure": 719,
    "operation not permitted": 800,
}
#: Codes that mean the device (not the request) is broken: uncorrectable ECC (214) and the
#: sticky launch errors 700–719 (the CUDA context is unusable afterwards).
HARDWARE_ERROR_CODES = frozenset({214, *range(700, 720)})

_RE_HARDWARE_TEXT = re.compile(
    r"\bxid\b|gpu is lost|gpuislost|fallen off the bus|uncorrectable ecc|ecc error|"
    r"uncorrectable error|double bit ecc|row remapping failure|nvrm:", _I)
_RE_CODE_NUM = re.compile(r"CUDA error[: ]\s*(\d+)\b|error code[: ]\s*(\d+)\b|cudaError\s*[=:]?\s*(\d+)\b", _I)
_RE_CODE_NAME = re.compile(r"\b(cudaError[A-Za-z]+)\b")
_RE_CODE_TEXT = re.compile(r"CUDA error:\s*([^\n.(]+)", _I)


def parse_cuda_error_code(message: str) -> int | None:
    """The CUDA error code named in an error message, or ``None``.

    Understands ``"CUDA error: out of memory"`` (the cudaGetErrorString text),
    ``"cudaErrorNotPermitted"`` (the enum name), ``"CUDA error 800"`` / ``"error code 800"``.
    """
    m = _RE_CODE_NAME.search(message)
    if m and m.group(1) in CUDA_ERROR_NAMES:
        return CUDA_ERROR_NAMES[m.group(1)]
    m = _RE_CODE_NUM.search(message)
    if m:
        return int(next(g for g in m.groups() if g is not None))
    m = _RE_CODE_TEXT.search(message)
    if m:
        text = m.group(1).strip().lower()
        for known, code in CUDA_ERROR_STRINGS.items():
            if text.startswith(known):
                return code
    return None


def hardware_fault_evidence(text: str | None) -> str | None:
    """The phrase in ``text`` that marks a hardware fault (Xid, GPU lost / fallen off the
    bus, uncorrectable ECC, row-remapping failure, an NVRM line), or ``None``. An engine may
    report such a fault as "out of memory"; it is never an int8 trigger."""
    if not isinstance(text, str) or not text:
        return None
    m = _RE_HARDWARE_TEXT.search(text)
    return m.group(0) if m else None


def classify_error_text(message: str, oom_codes: frozenset[int] | set[int] = DEFAULT_OOM_ERROR_CODES) -> str:
    """``"hardware"`` for hardware evidence (:func:`hardware_fault_evidence`) or a code in
    :data:`HARDWARE_ERROR_CODES` (checked first: never an int8 trigger, even when listed in
    ``oom_codes``); ``"oom"`` for a CUDA error whose code is in ``oom_codes``; else
    ``"other"``. (A ``torch.OutOfMemoryError`` is an OOM whatever its text; the engine checks
    the exception type before calling this.)"""
    code = parse_cuda_error_code(message)
    if hardware_fault_evidence(message) is not None or (code is not None and code in HARDWARE_ERROR_CODES):
        return ERROR_HARDWARE
    if code is not None and code in oom_codes:
        return ERROR_OOM
    return ERROR_OTHER
