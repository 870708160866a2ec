"""Controller lifecycle records in the event log: the unclean-shutdown marker, engine launches
and adoptions.

* A clean stop writes ``controller stopped`` (``controller/loop.py``); a start writes
  ``controller started``. :func:`mark_unclean_shutdown` runs when a controller opens its event
  log: when the newest of these two is a *start*, the previous controller died without stopping
  (SIGKILL, OOM killer, power loss) and one ``lifecycle`` event, severity ``warning``, source
  ``controller``, reason :data:`UNCLEAN`, says so with the evidence (the previous
  start's id and time, the last event written before the death).
* :func:`record_launch` is the supervisor's ``on_launch``: every launch of an engine (first
  start, restart) is a ``lifecycle`` event with the pid, port, URL and the launch token.
* :func:`adopt_engine` runs :meth:`EngineSupervisor.adopt_or_clear` and records what happened.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from inferctl.controller.events import EventLog
from inferctl.controller.supervisor import EngineSupervisor

STARTED = "controller started"
STOPPED = "controller stopped"
#: the marker's reason (exact: a second start without a stop in between does not mark twice)
UNCLEAN = "unclean shutdown: the previous controller did not stop cleanly"


def mark_unclean_shutdown(event_log: EventLog) -> int | None:
    """Write the unclean-shutdown marker when the newest controller start has no stop after it.
    Returns the marker's event id (None: the last run stopped cleanly, the log is new, or the
    marker is buffered because the log cannot be written)."""
    last = event_log.newest("lifecycle", "controller", (STARTED, STOPPED, UNCLEAN))
    if last is None or last["reason"] != STARTED:     # clean, new, or marked already
        return None
    after = event_log.query(limit=1)
    tail = after[-1] if after else last
    return event_log.append(
        "lifecycle", "controller", UNCLEAN, severity="warning",
        inputs={"previous_start_id": last["id"], "previous_start_time": last["time"],
                "last_event_id": tail["id"], "last_event_time": tail["time"]},
        outcome={"unclean": True, "detail": "the previous controller did not stop cleanly (no"
                 f" '{STOPPED}' after its start, event {last['id']}); launched engines it left are"
                 " adopted or stopped (the next events)"})


def record_launch(event_log: EventLog, sup: EngineSupervisor) -> int | None:
    """The lifecycle event of one launch of ``sup``'s engine (pid, port, URL, launch token)."""
    port = urlsplit(sup.base_url).port
    return event_log.append(
        "lifecycle", "supervisor", f"engine {sup.name} launched (pid {sup.pid})", target=sup.name,
        inputs={"argv": sup.argv, "url": sup.base_url},
        outcome={"pid": sup.pid, "port": port, "launch_token": sup.launch_token, "start_ticks": sup.start_ticks,
                 "restarts": sup.restarts})


def adopt_engine(event_log: EventLog, sup: EngineSupervisor) -> dict[str, Any]:
    """Adopt ``sup``'s engine left by a previous controller, or stop what cannot be adopted
    (:meth:`EngineSupervisor.adopt_or_clear`); one lifecycle event per process found. Returns
    the supervisor's answer."""
    out = sup.adopt_or_clear()
    for gone in out["stopped"]:
        event_log.append(
            "lifecycle", "supervisor", f"engine {sup.name}: a process left by a previous controller (pid"
            f" {gone['pid']}) was stopped: {gone['why']}", target=sup.name, severity="warning",
            inputs={"pid": gone["pid"], "why": gone["why"]}, outcome={"exit_code": gone["exit_code"]})
    if out["adopted"] is not None:
        event_log.append(
            "lifecycle", "supervisor", f"engine {sup.name} adopted (pid {out['adopted']}): launched by a previous"
            " controller, healthy, same command line; supervised without relaunching", target=sup.name,
            severity="warning", inputs={"argv": sup.argv, "url": sup.base_url},
            outcome={"pid": out["adopted"], "port": urlsplit(sup.base_url).port,
                     "launch_token": out["launch_token"], "start_ticks": sup.start_ticks, "adopted": True})
    return out
