"""The fleet rails: which replica a disruptive action may take out of rotation, and when.

A *replica group* is the set of engines that serve the same model (the ``model`` each engine
reports in its polls, remembered while it is down; an engine whose model is not known yet is a
group of its own). A replica is *ready* in the controller's view when its last poll was good,
it is not draining, and no action holds it out of rotation (:class:`FleetRail`).

The rails (``rails.max_unavailable``, docs/policies.md "Rolling healing"), as a pure function,
:func:`rail_verdict`:

* at most ``max_unavailable`` replicas of a group are unavailable at once (Kubernetes'
  ``maxUnavailable`` of a rolling update, kubernetes.io "Deployments: Rolling Update");
* an action never takes the last ready replica of its group out while it has work (running or
  waiting requests, or a queue it does not report: no data is not an empty queue): it waits
  for a quiet moment, as the fragmentation policy's idle confirmation does;
* ``force`` (an operator's ``inferctl restart --force``, a broken engine's ``restart_engine``)
  skips both.

While an action holds a replica, its lifecycle (``draining``, ``restarting``, ``starting``,
``resetting``) is in ``/status`` as ``engines[NAME].lifecycle`` with ``routable: false``: a router
started with ``--controller`` keeps traffic away (router/probe.py ``BLOCKING_STATES``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

#: lifecycle states an action sets while it holds a replica (all keep a router away)
HELD_STATES = ("draining", "restarting", "starting", "resetting")


@dataclass(frozen=True)
class ReplicaView:
    """One engine as the rails see it: its ``group`` (model), ``ready`` (routable now),
    ``busy`` (running + waiting > 0; None: the engine did not report its queue) and ``held_out``
    (already out of rotation: draining, or held by an action; a failed poll alone is not: a busy
    engine whose poll timed out may still be serving through the router)."""

    name: str
    group: str
    ready: bool
    busy: bool | None
    held_out: bool = False


@dataclass(frozen=True)
class Verdict:
    """``ok``: the replica may go out now; else ``reason`` (one line) and ``rail``
    (``max_unavailable`` or ``last_ready``)."""

    ok: bool
    reason: str = ""
    rail: str | None = None


def rail_verdict(target: str, views: Mapping[str, ReplicaView], *, max_unavailable: int,
                 force: bool = False) -> Verdict:
    """May ``target`` be taken out of rotation now? (module docstring: the two rails).

    ``views``: every engine by name (the target included; an unknown target is a group of one,
    busy unknown). ``max_unavailable`` >= 1. Raises ``ValueError`` for ``max_unavailable`` < 1."""
    if max_unavailable < 1:
        raise ValueError(f"max_unavailable: must be >= 1, got {max_unavailable}")
    if force:
        return Verdict(True, "forced: the rails are skipped")
    me = views.get(target) or ReplicaView(target, target, False, None)
    others = [v for n, v in views.items() if n != target and v.group == me.group]
    out = sorted(v.name for v in others if not v.ready)
    ready_others = [v.name for v in others if v.ready]
    if not ready_others and me.busy is not False:
        work = "has requests in flight" if me.busy else "does not report its queue"
        return Verdict(False, f"{target} is the last ready replica of {me.group} and {work}", "last_ready")
    # taking out a replica already held out changes nothing; any other (ready, or with a failed
    # poll but maybe still routed to) would be one more out
    if not me.held_out and len(out) + 1 > max_unavailable:
        return Verdict(False, f"{len(out)} other replica(s) of {me.group} are out of rotation ({', '.join(out)});"
                              f" rails.max_unavailable is {max_unavailable}", "max_unavailable")
    return Verdict(True, f"{len(ready_others)} other ready replica(s) of {me.group}"
                         + (f": {', '.join(sorted(ready_others))}" if ready_others else ""))


class FleetRail:
    """The rails over the controller's live view, and the replicas an action holds.

    Args:
        snapshots: the controller's last engine snapshots by name (``ControllerState.latest``),
            read at call time; None: no view (every verdict is ok: nothing to compare with).
        max_unavailable: ``rails.max_unavailable``.
        supervisors: launched engines by name; a held replica's lifecycle is also set on its
            supervisor (``lifecycle``), where ``/status`` reads it.
        lock: guards the snapshots (``ControllerState.lock``); None: a lock of its own.
    """

    def __init__(self, snapshots: Mapping[str, Any] | None, *, max_unavailable: int = 1,
                 supervisors: Mapping[str, Any] | None = None, lock: Any = None) -> None:
        if max_unavailable < 1:
            raise ValueError(f"max_unavailable: must be >= 1, got {max_unavailable}")
        self.snapshots = snapshots
        self.max_unavailable = max_unavailable
        self.supervisors = supervisors if supervisors is not None else {}
        self._state_lock = lock if lock is not None else threading.RLock()
        self._lock = threading.Lock()
        self._held: dict[str, str] = {}
        self._model: dict[str, str] = {}

    def held(self) -> dict[str, str]:
        """The replicas held now: ``{name: lifecycle}``."""
        with self._lock:
            return dict(self._held)

    def views(self) -> dict[str, ReplicaView]:
        """Every engine with a snapshot (and every held one), as :class:`ReplicaView`."""
        with self._state_lock:
            snaps = dict(self.snapshots or {})
        with self._lock:
            held = dict(self._held)
            out = {}
            for name in set(snaps) | set(held):
                s = snaps.get(name)
                model = getattr(s, "model", None)
                if model:
                    self._model[name] = str(model)
                ok = bool(getattr(s, "ok", False))
                running, waiting = getattr(s, "running", None), getattr(s, "waiting", None)
                busy = None if running is None or waiting is None else (running + waiting) > 0
                draining = getattr(s, "draining", None) is True
                out[name] = ReplicaView(name, self._model.get(name, name),
                                        ok and not draining and name not in held,
                                        busy if ok else None, (ok and draining) or name in held)
            return out

    def try_hold(self, target: str, lifecycle: str, *, force: bool = False,
                 busy: bool | None = None) -> Verdict:
        """Hold ``target`` (lifecycle ``lifecycle``) if the rails allow it now, atomically with
        the check (two actions never both take the last slot). ``busy``: a fresh reading of the
        target's queue (overrides the snapshot's)."""
        if self.snapshots is None:
            self._set(target, lifecycle)
            return Verdict(True, "no fleet view: rails not applied")
        views = self.views()
        if busy is not None and target in views:
            v = views[target]
            views[target] = ReplicaView(v.name, v.group, v.ready, busy, v.held_out)
        with self._lock:
            if target in self._held:
                return Verdict(False, f"{target} is already held ({self._held[target]})", "held")
            verdict = rail_verdict(target, views, max_unavailable=self.max_unavailable, force=force)
            if verdict.ok:
                self._held[target] = lifecycle
                self._set_supervisor(target, lifecycle)
        return verdict

    def wait_hold(self, target: str, lifecycle: str, timeout: float, *, force: bool = False,
                  busy: Callable[[], bool | None] | None = None, poll_seconds: float = 0.1) -> Verdict:
        """:meth:`try_hold` until it succeeds or ``timeout`` seconds pass (the last refusal)."""
        deadline = time.monotonic() + timeout
        while True:
            verdict = self.try_hold(target, lifecycle, force=force, busy=None if busy is None else busy())
            if verdict.ok or verdict.rail == "held" or time.monotonic() >= deadline:
                return verdict
            time.sleep(poll_seconds)

    def _set(self, target: str, lifecycle: str) -> None:
        with self._lock:
            self._held[target] = lifecycle
            self._set_supervisor(target, lifecycle)

    def set(self, target: str, lifecycle: str) -> None:
        """Move a held replica to another lifecycle state (``restarting``, ``starting``…)."""
        self._set(target, lifecycle)

    def release(self, target: str) -> None:
        """Back in rotation (the supervisor's own state shows again: ``running``, ``down``)."""
        with self._lock:
            self._held.pop(target, None)
            self._set_supervisor(target, None)

    def _set_supervisor(self, target: str, lifecycle: str | None) -> None:
        sup = self.supervisors.get(target)
        if sup is not None:
            sup.hold_state = lifecycle
