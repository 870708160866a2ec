"""The Xid catalogue's vocabulary: what each NVIDIA Xid code asks for, in inferctl's words.

One table for everything that names an Xid action: the controller's Xid catalogue
(``controller.gpu.xid.XidCatalog``), its hardware and precision policies, and the alert rules
(the ``action`` label of ``inferctl_gpu_xid_events_total``).

Sources: NVIDIA's Xid catalogue
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), whose "Resolution
Bucket (Immediate Action)" column gives the buckets of :data:`BUCKET_ACTIONS`, and NVIDIA's Xid
error documentation for the well-known codes of :data:`BUILTIN_ACTIONS` (79 -> reboot the node:
a reset cannot fix a GPU that fell off the bus; 48, 64, 95, 119, 120 -> reset the GPU; 13, 31,
94 -> restart the application; 43, 63, 92 -> no action). See docs/gpu-telemetry.md.

Pure data, no project imports.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Mapping

#: Xid 79, "GPU has fallen off the bus": the GPU is lost until the node reboots.
XID_FALLEN_OFF_BUS = 79


class XidAction(str, enum.Enum):
    """What an Xid asks for, in the controller's vocabulary (the values are the ``action``
    label values of ``inferctl_gpu_xid_events_total``)."""

    RESTART_ENGINE = "restart_engine"   # NVIDIA bucket RESTART_APP
    RESET_GPU = "reset_gpu"             # RESET_GPU (and WORKFLOW_XID_48 solo)
    REBOOT_NODE = "reboot_node"         # RESTART_BM / RESTART_VM
    IGNORE = "ignore"                   # IGNORE
    UNKNOWN = "unknown"                 # CONTACT_SUPPORT, other workflows, unknown codes: escalate


#: Catalogue bucket -> action. Buckets not listed (CONTACT_SUPPORT, WORKFLOW_*, CHECK_*, ...)
#: need a person and map to UNKNOWN unless the built-in table knows the code. Read-only.
BUCKET_ACTIONS: Mapping[str, XidAction] = MappingProxyType({
    "RESTART_APP": XidAction.RESTART_ENGINE,
    "RESET_GPU": XidAction.RESET_GPU,
    "RESTART_BM": XidAction.REBOOT_NODE,
    "RESTART_VM": XidAction.REBOOT_NODE,
    "IGNORE": XidAction.IGNORE,
})

#: Built-in actions for the well-known codes (used without NVIDIA's catalogue file, and for
#: codes a catalogue lacks). Read-only.
BUILTIN_ACTIONS: Mapping[int, XidAction] = MappingProxyType({
    XID_FALLEN_OFF_BUS: XidAction.REBOOT_NODE,
    48: XidAction.RESET_GPU, 64: XidAction.RESET_GPU, 95: XidAction.RESET_GPU,
    119: XidAction.RESET_GPU, 120: XidAction.RESET_GPU,
    13: XidAction.RESTART_ENGINE, 31: XidAction.RESTART_ENGINE, 94: XidAction.RESTART_ENGINE,
    43: XidAction.IGNORE, 63: XidAction.IGNORE, 92: XidAction.IGNORE,
})

#: :data:`BUILTIN_ACTIONS` with the actions as plain strings (``"reboot_node"``, ...). Read-only.
BUILTIN_ACTION_NAMES: Mapping[int, str] = MappingProxyType(
    {code: action.value for code, action in BUILTIN_ACTIONS.items()})

#: Xids that do not mean the GPU is at fault (the built-in table's IGNORE codes: 43, 63, 92).
IGNORED_XIDS: frozenset[int] = frozenset(
    code for code, action in BUILTIN_ACTIONS.items() if action is XidAction.IGNORE)

#: NVIDIA's mnemonics of the well-known codes. Read-only.
BUILTIN_MNEMONICS: Mapping[int, str] = MappingProxyType({
    13: "Graphics Engine Exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    48: "Double Bit ECC Error", 63: "GPU memory remapping event",
    64: "GPU memory remapping failure", 79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate", 94: "Contained memory error",
    95: "Uncontained memory error", 119: "GSP RPC Timeout", 120: "GSP Error",
})
