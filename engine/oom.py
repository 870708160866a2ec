"""OOM messages and error classes of the engine (the torch side of :mod:`inferctl.contract.oom`).

:func:`format_oom_message` (PyTorch's current format) and :func:`format_oom_message_old`
(PyTorch < 2.1) write the messages the simulated allocator raises and the controller parses;
:func:`classify_error` sorts a failed step's exception into ``oom`` / ``hardware`` / ``other``.
Parsing and the OOM kinds live in the contract (re-exported here).
"""

from __future__ import annotations

import torch

from inferctl.contract.oom import (  # noqa: F401 - re-exported
    ERROR_HARDWARE, ERROR_OOM, ERROR_OTHER, OomInfo, classify_error_text, classify_oom,
    parse_cuda_error_code, parse_oom_message_strict as parse_oom_message)
from inferctl.contract.units import format_size


def format_oom_message(requested: int, total: int | None, free: int | None, allocated: int,
                       reserved_unallocated: int, device: int = 0, process_in_use: int | None = None,
                       device_kind: str = "CUDA") -> str:
    """PyTorch's current (>= 2.1) CUDA OOM message, as raised by the caching allocator.

    ``total=None`` / ``free=None`` leave out that clause (some wrappers print the message
    without it; docs/field-cases.md, the OOM kinds). ``process_in_use`` defaults to
    ``allocated + reserved_unallocated``.
    """
    in_use = allocated + reserved_unallocated if process_in_use is None else process_in_use
    head = f"{device_kind} out of memory. Tried to allocate {format_size(requested)}. "
    if total is not None and free is not None:
        head += (f"GPU {device} has a total capacity of {format_size(total)} "
                 f"of which {format_size(free)} is free. ")
    elif total is not None:
        head += f"GPU {device} has a total capacity of {format_size(total)}. "
    elif free is not None:
        head += f"GPU {device} has {format_size(free)} free. "
    return (head
            + f"Including non-PyTorch memory, this process has {format_size(in_use)} memory in use. "
            + f"Of the allocated memory {format_size(allocated)} is allocated by PyTorch, and "
            + f"{format_size(reserved_unallocated)} is reserved by PyTorch but unallocated. "
            + "If reserved but unallocated memory is large try setting "
            + "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
            + "See documentation for Memory Management  "
            + "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def format_oom_message_old(requested: int, total: int | None, free: int | None, allocated: int,
                           reserved: int, device: int = 0) -> str:
    """PyTorch's old (< 2.1) CUDA OOM message: ``Tried to allocate R (GPU 0; T total capacity;
    A already allocated; F free; V reserved in total by PyTorch)``."""
    cap = f"{format_size(total)} total capacity; " if total is not None else ""
    free_clause = f"{format_size(free)} free; " if free is not None else ""
    return (f"CUDA out of memory. Tried to allocate {format_size(requested)} (GPU {device}; {cap}"
            f"{format_size(allocated)} already allocated; {free_clause}"
            f"{format_size(reserved)} reserved in total by PyTorch) If reserved memory is >> "
            "allocated memory try setting max_split_size_mb to avoid fragmentation.  "
            "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")


def classify_error(exc: BaseException, oom_codes: frozenset[int] | set[int]) -> str:
    """``"oom"`` for ``torch.OutOfMemoryError`` or a CUDA error whose code is in ``oom_codes``;
    ``"hardware"`` for Xid / "GPU is lost" / uncorrectable ECC (214) / sticky 700–719 errors
    (never an int8 trigger, checked before the OOM codes); else ``"other"``
    (:func:`inferctl.contract.oom.classify_error_text`)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return ERROR_OOM
    return classify_error_text(str(exc), oom_codes)
