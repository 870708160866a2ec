"""Precision modes shared by the engine and the controller.

An engine serves its weights either in full precision (``FULL``, the checkpoint's dtype) or
int8 weight-only quantized (``INT8``). The controller's precision policy degrades FULL → INT8
on an exhaustion OOM and rolls back INT8 → FULL once memory has recovered (docs/design.md,
"precision"); the engine's ``POST /admin/precision {"mode": ...}`` applies a switch.

The names here are the wire values of ``/admin/precision``'s ``mode``, of ``/stats``'s
``precision`` and of the ``mode`` / ``to`` labels of the controller's precision metrics.
"""

from __future__ import annotations

from typing import Final, Literal

FULL: Final = "full"
INT8: Final = "int8"
#: int4 weight-only (group-32 scales and zeros; GGUF Q4_0/Q4_1 weights kept 4-bit,
#: engine/quant_int4.py): chosen at the engine's start (``--precision int4``), never switched
#: to or from at run time, and already below int8 in memory, so it is not degradable.
INT4: Final = "int4"

#: Every precision mode, in the order the metrics and error messages list them.
PRECISION_MODES: Final[tuple[str, ...]] = (FULL, INT8, INT4)

#: Modes an engine can only start in: the controller neither degrades nor rolls them back.
START_ONLY_MODES: Final[tuple[str, ...]] = (INT4,)

#: A precision mode as a static type (``Literal["full", "int8", "int4"]``).
PrecisionMode = Literal["full", "int8", "int4"]

#: The action that moves an engine away from a mode: degrade FULL → INT8.
DEGRADE_TO: Final[dict[str, str]] = {FULL: INT8}
#: ... and the way back: rollback INT8 → FULL.
ROLLBACK_TO: Final[dict[str, str]] = {INT8: FULL}

#: The controller's precision actions → the mode they ask the engine for.
MODE_FOR_ACTION: Final[dict[str, str]] = {"degrade": INT8, "rollback": FULL}


def check_precision_mode(value: object, field: str = "mode") -> str:
    """``value`` itself when it is one of :data:`PRECISION_MODES` (``"full"``, ``"int8"``, ``"int4"``).

    Raises ``ValueError`` naming ``field`` and the allowed values otherwise, e.g.
    ``precision mode 'fp4' is not one of full, int8, int4`` for ``field="precision mode"``.
    """
    if not isinstance(value, str) or value not in PRECISION_MODES:
        raise ValueError(f"{field} {value!r} is not one of {', '.join(PRECISION_MODES)}")
    return value
