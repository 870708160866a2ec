"""The hardware policy's vocabulary and settings: the action names, the built-in Xid table,
:class:`HardwareConfig` and :func:`normalize_action` (split from ``hardware.py``; the policy
re-exports every name)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from inferctl.contract.thresholds import THRESHOLDS
from inferctl.controller.policies.common import check_number

RESTART_ENGINE = "restart_engine"
RESET_GPU = "reset_gpu"
REBOOT_NODE = "reboot_node"
IGNORE = "ignore"
UNKNOWN = "unknown"

#: Built-in Xid → action for the well-known codes (NVIDIA Xid docs; docs/field-cases.md);
#: read-only.
DEFAULT_XID_ACTIONS: Mapping[int, str] = MappingProxyType({
    79: REBOOT_NODE,
    48: RESET_GPU, 64: RESET_GPU, 95: RESET_GPU, 119: RESET_GPU, 120: RESET_GPU,
    13: RESTART_ENGINE, 31: RESTART_ENGINE, 94: RESTART_ENGINE,
    43: IGNORE, 63: IGNORE, 92: IGNORE,
})

#: How long reports already seen are remembered (so a source that re-sends recent events
#: does not raise them twice).
SEEN_RETENTION_SECONDS = 86400.0

_ALIASES = MappingProxyType({
            "restart_app": RESTART_ENGINE, "restart_application": RESTART_ENGINE,
            "restart": RESTART_ENGINE, "reset": RESET_GPU, "drain_and_reset": RESET_GPU,
            "restart_bm": REBOOT_NODE, "restart_vm": REBOOT_NODE, "reboot": REBOOT_NODE,
            "none": IGNORE, "no_action": IGNORE})
_KNOWN = frozenset({RESTART_ENGINE, RESET_GPU, REBOOT_NODE, IGNORE})
@dataclass
class HardwareConfig:
    """``drain_timeout_seconds`` (120) to wait for engines to drain before the reset anyway;
    ``reset_timeout_seconds`` (300) for the reset's result; ``verify_seconds`` (60) of quiet
    after a reset; ``degraded_clear_seconds`` (600) of quiet to leave DEGRADED;
    ``restart_escalate_count`` (3) restart-class Xids within that time escalate to a reset;
    ``reset_min_interval_seconds`` (3600): another reset-worthy fault this soon after a reset
    isolates the GPU instead; ``xid_dedupe_seconds`` (300): reports that a GPU is lost (Xid 79
    line, newer driver's line, NVML GpuIsLost) for one PCI address within this time are one
    event (docs/field-cases.md, "a GPU fell off the bus"); ``xid_duplicate_seconds`` (10):
    the same other Xid for one PCI address within this time (kernel log and NVML/DCGM
    reporting one fault) is one event; ``ecc_correctable_storm_per_second`` (0.1) correctable
    ECC errors per second over ``ecc_correctable_window_seconds`` (600) is a storm: a warning
    event, never a state change (contract/thresholds.py)."""

    drain_timeout_seconds: float = 120.0
    reset_timeout_seconds: float = 300.0
    verify_seconds: float = 60.0
    degraded_clear_seconds: float = 600.0
    restart_escalate_count: int = 3
    reset_min_interval_seconds: float = 3600.0
    xid_dedupe_seconds: float = 300.0
    xid_duplicate_seconds: float = 10.0
    ecc_correctable_storm_per_second: float = THRESHOLDS.ecc_correctable_storm_per_second
    ecc_correctable_window_seconds: float = THRESHOLDS.ecc_correctable_window_seconds

    def __post_init__(self) -> None:
        for name in ("drain_timeout_seconds", "reset_timeout_seconds", "verify_seconds",
                     "degraded_clear_seconds", "reset_min_interval_seconds",
                     "xid_dedupe_seconds", "xid_duplicate_seconds", "ecc_correctable_storm_per_second"):
            check_number(name, getattr(self, name), minimum=0)
        check_number("restart_escalate_count", self.restart_escalate_count, minimum=1)
        check_number("ecc_correctable_window_seconds", self.ecc_correctable_window_seconds, minimum=0,
                     strict_min=True)


def normalize_action(value: Any) -> str:
    """An action from a catalogue (``XidAction`` enum, string, None) → one of
    ``restart_engine``, ``reset_gpu``, ``reboot_node``, ``ignore`` or ``unknown``."""
    if value is None:
        return UNKNOWN
    if isinstance(value, enum.Enum):
        value = value.value if isinstance(value.value, str) else value.name
    s = str(value).strip().lower()
    s = _ALIASES.get(s, s)
    return s if s in _KNOWN else UNKNOWN


