"""Proof that a restarted engine is a new process, for the rolling restart (controller/actions.py).

A restart is done when the engine that answers after it is another process than the one that
answered before it. What proves it, strongest first:

1. ``engine.instance_id`` of ``/stats`` (a uuid4 hex the engine makes at start,
   engine/entrypoints/state.py) changed: a changed id is a restart; the *same* id is the same
   process, so the restart did not take (another process kept the port, an old one survived);
2. otherwise (an engine that reports no id) its ``engine.uptime_seconds`` went down or a
   counter reset (:func:`~inferctl.controller.policies.liveness.restart_evidence`);
3. otherwise the supervisor's own word: it started a process with a new pid that answered
   ``/ready`` (``verified_by: "pid"``).

A failed poll is never proof of anything: a busy engine's poll times out while the same
process serves on. The polls here are the action's own (``client.poll``), at its own
``interval``: they never wait on the controller's poll backoff.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from inferctl.controller.policies.liveness import instance_id_of, restart_evidence


@dataclass(frozen=True)
class RestartProof:
    """``ok``: False only when the engine proved to be the same process (``instance_id``
    unchanged). ``verified_by``: ``instance_id``, ``uptime_seconds`` or a counter name, or
    ``pid`` (no poll evidence either way). ``evidence``: what changed (or stayed the same)."""

    ok: bool
    verified_by: str
    message: str
    evidence: list[dict[str, Any]] = field(default_factory=list)


def good_poll(client: Any, timeout: float = 0.0, interval: float = 0.1) -> Any | None:
    """The client's first good poll (``ok`` true) within ``timeout`` seconds (one try at 0);
    None when none answered (an exception or a failed poll counts as no answer)."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        try:
            snap = client.poll(time.time())
            if getattr(snap, "ok", False):
                return snap
        except Exception:
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def prove_restart(before: Any | None, after: Any | None, old_pid: int | None, new_pid: int | None) -> RestartProof:
    """Judge a restart from the good poll before it (``before``), the one after it
    (``after``; None: none answered) and the supervisor's pids (module docstring)."""
    if before is not None and after is not None:
        i0, i1 = instance_id_of(before), instance_id_of(after)
        if i0 is not None and i0 == i1:
            return RestartProof(False, "instance_id", f"the engine still answers as the same process (instance_id {i0}"
                                " before and after): the restart did not take",
                                [{"signal": "instance_id", "before": i0, "after": i1}])
        evidence = restart_evidence(before, after)
        if evidence:
            first = evidence[0]
            return RestartProof(True, str(first["signal"]), f"a new process answers ({first['signal']} changed)",
                                evidence)
    pid_changed = old_pid is not None and new_pid is not None and old_pid != new_pid
    return RestartProof(True, "pid", "no identity in the engine's polls: the supervisor's new process"
                        + (f" (pid {old_pid} → {new_pid})" if pid_changed else "") + " answered /ready")
