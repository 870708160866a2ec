"""GPU sources behind one interface: ``nvml``, ``dcgm``, ``replay``, ``sim``.

``make_gpu_source(kind, **options)`` builds one (``"auto"``: NVML if it initialises, else the
simulated GPU with a loud warning). Each source's ``poll(now)`` returns a ``GpuReading`` of
``GpuSnapshot`` by UUID and never raises for telemetry faults. See docs/gpu-telemetry.md.
"""

from __future__ import annotations

from inferctl.controller.gpu.base import (
    MEMORY_ROUNDING_TOLERANCE_BYTES, GpuSource, down_reading, memory_accounting_gap_bytes,
    memory_consistent, used_ratio)
from inferctl.controller.gpu.factory import SOURCE_KINDS, make_gpu_source
from inferctl.controller.gpu.xid import (
    XidAction, XidCatalog, XidDeduper, XidInfo, normalize_pci_bus_id, parse_kernel_line,
    parse_kernel_log)

__all__ = [
    "GpuSource", "MEMORY_ROUNDING_TOLERANCE_BYTES", "SOURCE_KINDS", "XidAction", "XidCatalog", "XidDeduper",
    "XidInfo", "down_reading", "make_gpu_source", "memory_accounting_gap_bytes",
    "memory_consistent", "normalize_pci_bus_id", "parse_kernel_line", "parse_kernel_log",
    "used_ratio",
]
