"""The operator's pause and resume (``inferctl pause|resume``, ``POST /actions/pause|resume``):
checked, applied to the controller's :class:`~inferctl.controller.pause.PauseBoard` and recorded
as an ``action`` event whose source is the operator (``operator`` or ``operator:NAME``)."""

from __future__ import annotations

from typing import Any

from inferctl.controller.pause import PauseError


def _check_target(controller: Any, scope: str) -> None:
    """``engine:NAME`` must name a configured engine (PauseError otherwise)."""
    if scope.startswith("engine:") and scope[7:] not in controller.engines:
        raise PauseError(f"engine: {scope[7:]!r} is not a configured engine (known: "
                         f"{', '.join(sorted(controller.engines)) or 'none'})")


def pause(controller: Any, scope: str, reason: str, actor: str) -> dict:
    """Pause ``scope``; returns ``{"ok", "action": "pause", "target", "message", "details",
    "event_id"}``. Raises :class:`PauseError` for a bad scope, an unknown engine or no reason."""
    _check_target(controller, scope)
    p = controller.pause_board.pause(scope, reason, actor)
    msg = (f"automatic actions paused for {scope} by {actor}: {p.reason} "
           "(decisions are still logged as 'would have acted')")
    return _record(controller, "pause", scope, actor, msg, p)


def resume(controller: Any, scope: str, actor: str) -> dict:
    """Resume ``scope``; same answer as :func:`pause`. Raises :class:`PauseError` when the scope is
    not paused by an operator."""
    p = controller.pause_board.resume(scope, actor)
    now = controller.clock()
    msg = (f"automatic actions resumed for {scope} by {actor} after {max(0.0, now - p.since):.0f} s "
           f"(paused by {p.actor}: {p.reason})")
    return _record(controller, "resume", scope, actor, msg, p)


def _record(controller: Any, action: str, scope: str, actor: str, msg: str, p: Any) -> dict:
    details = {"scope": scope, "reason": p.reason, "paused_by": p.actor, "since": p.since}
    event_id = None
    try:
        event_id = controller.event_log.append("action", actor, msg, target=scope, severity="warning",
                                               inputs=details, outcome={"action": action, "ok": True})
    except Exception:   # the pause itself holds; the event log's own buffer/logging says why
        event_id = None
    return {"ok": True, "action": action, "target": scope, "message": msg, "details": details,
            "event_id": event_id}
