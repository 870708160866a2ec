"""OOM records as the signals read them: the contract's OOM-text parsing, sizes and
hardware-fault text, under the names this package has always offered.

Nothing is parsed here: :mod:`inferctl.contract.oom` holds the one OOM-message parser (both
PyTorch formats), :func:`classify_oom` and :func:`hardware_fault_evidence`;
:mod:`inferctl.contract.units` the size parser and :func:`format_bytes`.
"""

from __future__ import annotations

from inferctl.contract.oom import OomInfo, classify_oom, hardware_fault_evidence, parse_oom_message
from inferctl.contract.units import GiB as GIB
from inferctl.contract.units import MiB as MIB
from inferctl.contract.units import format_bytes
from inferctl.contract.units import parse_size as _parse_size

#: The numbers of one OOM message (bytes; None where the message does not say): the
#: contract's :class:`~inferctl.contract.oom.OomInfo`, under its former signals name.
OomNumbers = OomInfo

__all__ = ["GIB", "MIB", "OomInfo", "OomNumbers", "classify_oom", "format_bytes",
           "hardware_fault_evidence", "parse_oom_message", "parse_size"]


def parse_size(text: str) -> int:
    """A size as PyTorch prints it, to bytes: ``"41.56 MiB"`` → 43578819. A unit is required;
    KB/MB/GB are read as powers of 1024 (PyTorch's ``format_size``). This is
    :func:`inferctl.contract.units.parse_size` with ``default_unit=None, decimal_si=False``.

    Raises:
        ValueError (``SizeError``): not '<number> <unit>'; the message starts with "size".
    """
    return _parse_size(text, "size", default_unit=None, decimal_si=False)
