"""Pausing automation: the operator's ``inferctl pause`` / ``resume`` and the configured
maintenance windows (docs/policies.md "Pause and maintenance windows").

While a scope is paused, policies still decide and every decision is still recorded; an action
of a decision in a paused scope is not executed: the dispatcher records a ``refusal`` event
"would have acted" (``inputs.would_have_acted = true``, the action, the pause that stopped it,
who paused) and tells the deciding policy the action did not run (as a failed dry run), so its
state follows reality (e.g. the precision policy stays FULL: the engine was not switched).

Scopes: ``all``; ``engine:NAME`` (actions on that engine); ``gpu:N`` (actions on GPU N and on
the engines mapped to it). Operator actions are never paused (the operator is in charge), nor
follow-ups the policies make for an operator (``inputs.who``/``inputs.operator``).

Metrics (``controller/metrics.py``): ``inferctl_automation_paused{scope,source}`` (1 while
paused), ``inferctl_automation_paused_seconds{scope,source}`` (how long; the
AutomationPausedTooLong alert reads ``source="operator"``) and
``inferctl_automation_would_have_acted_total{policy,action}``. Times are seconds since the epoch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from inferctl.controller.config import MaintenanceWindow, check_scope


class PauseError(ValueError):
    """A pause/resume request that cannot be done (bad scope, not paused); the message says why."""


@dataclass(frozen=True)
class Pause:
    """One active pause: its ``scope``, ``reason``, who set it (``actor``: ``operator`` or
    ``operator:NAME``, or ``maintenance``), when it began and where it comes from (``source``:
    ``operator`` or ``maintenance``)."""

    scope: str
    reason: str
    actor: str
    since: float
    source: str

    def doc(self, now: float) -> dict[str, Any]:
        return {"scope": self.scope, "reason": self.reason, "actor": self.actor, "since": self.since,
                "paused_seconds": max(0.0, now - self.since), "source": self.source}


class PauseBoard:
    """The pauses in force: operator pauses (set/cleared at runtime) and maintenance windows
    (from the config). Thread-safe. ``metrics``: the controller metrics by name (optional)."""

    def __init__(self, windows: Iterable[MaintenanceWindow] = (), *, clock: Callable[[], float],
                 metrics: Mapping[str, Any] | None = None) -> None:
        self.windows = list(windows)
        self.clock = clock
        self.metrics = metrics or {}
        self._lock = threading.Lock()
        self._operator: dict[str, Pause] = {}
        for w in self.windows:
            self._watch(w.scope, "maintenance", lambda w=w: w.began(self.clock()) if w.active(self.clock()) else None)

    # ------------------------------------------------------------------ operator
    def pause(self, scope: str, reason: str, actor: str) -> Pause:
        """Pause ``scope`` (``all``, ``engine:NAME``, ``gpu:N``) for ``reason``. Pausing a scope
        already paused by an operator keeps its start and updates the reason and actor.
        Raises :class:`PauseError` for a bad scope or an empty reason."""
        try:
            check_scope(scope)
        except ValueError as exc:
            raise PauseError(f"scope: {exc}") from None
        if not reason or not reason.strip():
            raise PauseError("reason: required (why automation is paused)")
        now = self.clock()
        with self._lock:
            prev = self._operator.get(scope)
            p = Pause(scope, reason.strip()[:200], actor, prev.since if prev else now, "operator")
            self._operator[scope] = p
        if prev is None:
            self._watch(scope, "operator", lambda: self._since(scope))
        return p

    def resume(self, scope: str, actor: str) -> Pause:
        """End the operator pause of ``scope``; returns it. Raises :class:`PauseError` when that
        scope is not paused by an operator (a maintenance window ends on its own)."""
        with self._lock:
            p = self._operator.pop(scope, None)
        if p is None:
            raise PauseError(f"scope: {scope!r} is not paused by an operator (paused: "
                             f"{', '.join(sorted(self._operator)) or 'none'})")
        self._unwatch(scope, "operator")
        return p

    def restore(self, events: Iterable[Mapping[str, Any]]) -> list[Pause]:
        """Rebuild the operator pauses from the event log's ``action`` events (oldest first, as
        :meth:`EventLog.scan` yields them) so a controller restart does not silently resume
        automation an operator paused: the last ``pause`` of a scope not followed by a
        ``resume`` is in force again, with its original reason, actor and start. Events of other
        actions are skipped. Returns the pauses restored."""
        held: dict[str, Pause] = {}
        for ev in events:
            action = (ev.get("outcome") or {}).get("action")
            if action not in ("pause", "resume") or (ev.get("outcome") or {}).get("ok") is False:
                continue
            scope, inputs = ev.get("target"), ev.get("inputs") or {}
            if not isinstance(scope, str):
                continue
            if action == "resume":
                held.pop(scope, None)
                continue
            try:
                check_scope(scope)
                since = float(inputs.get("since", ev.get("time")))
            except (TypeError, ValueError):
                continue
            held[scope] = Pause(scope, str(inputs.get("reason") or "restored pause")[:200],
                                str(inputs.get("paused_by") or ev.get("source") or "operator"), since, "operator")
        restored = []
        for scope, p in held.items():
            with self._lock:
                known = scope in self._operator
                self._operator.setdefault(scope, p)
            if not known:
                self._watch(scope, "operator", lambda scope=scope: self._since(scope))
                restored.append(p)
        return restored

    def _since(self, scope: str) -> float | None:
        with self._lock:
            p = self._operator.get(scope)
        return None if p is None else p.since

    # ------------------------------------------------------------------ queries
    def active(self, now: float | None = None) -> list[Pause]:
        """Every pause in force at ``now``: operator pauses, then active maintenance windows."""
        now = self.clock() if now is None else now
        with self._lock:
            out = list(self._operator.values())
        out += [Pause(w.scope, w.reason, "maintenance", w.began(now), "maintenance")
                for w in self.windows if w.active(now)]
        return out

    def gate(self, scopes: Iterable[str], now: float | None = None) -> Pause | None:
        """The pause that stops an action touching ``scopes`` (``all`` always applies), or None."""
        wanted = {"all", *scopes}
        return next((p for p in self.active(now) if p.scope in wanted), None)

    def state(self, now: float | None = None) -> dict[str, Any]:
        """For ``/status``: ``{"paused": bool, "pauses": [...], "maintenance_windows": n}``."""
        now = self.clock() if now is None else now
        pauses = [p.doc(now) for p in self.active(now)]
        return {"paused": bool(pauses), "pauses": pauses, "maintenance_windows": len(self.windows)}

    # ------------------------------------------------------------------ metrics
    def _watch(self, scope: str, source: str, since: Callable[[], float | None]) -> None:
        paused, secs = self.metrics.get("inferctl_automation_paused"), self.metrics.get(
            "inferctl_automation_paused_seconds")
        if paused is not None:
            paused.labels(scope=scope, source=source).set_function(lambda: 0.0 if since() is None else 1.0)
        if secs is not None:
            secs.labels(scope=scope, source=source).set_function(
                lambda: 0.0 if (s := since()) is None else max(0.0, self.clock() - s))

    def _unwatch(self, scope: str, source: str) -> None:
        for name in ("inferctl_automation_paused", "inferctl_automation_paused_seconds"):
            m = self.metrics.get(name)
            if m is not None:
                try:
                    m.remove(scope, source)
                except KeyError:
                    pass


def decision_scopes(target: str, engine_gpu: Mapping[str, int | None], gpu_index: int | None) -> list[str]:
    """The pause scopes an action on ``target`` touches: ``engine:NAME`` (+ ``gpu:N`` of its
    configured GPU) for an engine, ``gpu:N`` for a GPU (``gpu_index``: the GPU's index when the
    target is a GPU uuid)."""
    if target in engine_gpu:
        n = engine_gpu.get(target)
        return [f"engine:{target}"] + ([] if n is None else [f"gpu:{n}"])
    return [] if gpu_index is None else [f"gpu:{gpu_index}"]
