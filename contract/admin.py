"""Request bodies of the engine's admin API (docs/architecture.md, "Engine admin API").

``POST /admin/precision|fault|drain|route`` take these shapes; the controller's engine client
sends them. Admin bodies refuse unknown fields (:class:`~inferctl.contract.jsontypes.ClosedModel`):
an admin call changes the engine, and a misspelt field silently dropped would change it
differently (``{"mode": "int8", "modle": "light"}`` would switch *every* model;
``{"kind": "oom", "cnt": 5}`` would inject one fault). Types are strict (no coercion).
"""

from __future__ import annotations

from pydantic import Field

from inferctl.contract.jsontypes import ClosedModel, JsonInt
from inferctl.contract.precision import PrecisionMode

#: The most faults one ``POST /admin/fault`` may inject.
MAX_FAULT_COUNT = 1000


class AdminPrecisionRequest(ClosedModel):
    """``POST /admin/precision``: ``mode`` one of the precision modes (full|int8, see
    :mod:`inferctl.contract.precision`); ``model`` None = every served model."""

    mode: PrecisionMode
    model: str | None = None


#: Longest fault ``kind`` accepted (the kinds are short words: "oom").
MAX_FAULT_KIND_CHARS = 32


class AdminFaultRequest(ClosedModel):
    """``POST /admin/fault``: make the next ``count`` (1..1000) steps run out of memory for
    real; the engine checks ``kind`` (400 naming ``kind`` for an unknown one; at most
    :data:`MAX_FAULT_KIND_CHARS` characters, so the refusal never echoes a document back)."""

    kind: str = Field(default="oom", max_length=MAX_FAULT_KIND_CHARS)
    count: JsonInt = Field(default=1, ge=1, le=MAX_FAULT_COUNT)
    model: str | None = None


class AdminDrainRequest(ClosedModel):
    """``POST /admin/drain``: stop (true) or resume (false) admitting; ``model`` None = all."""

    draining: bool = True
    model: str | None = None


class AdminRouteRequest(ClosedModel):
    """``POST /admin/route``: send requests for ``model`` to ``to``; ``to`` null clears."""

    model: str
    to: str | None = None
