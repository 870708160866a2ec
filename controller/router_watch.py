"""``inferctl up --replicas N``: the router process is supervised like the engines.

The router runs as a subprocess (:class:`~inferctl.controller.supervisor.EngineSupervisor`
named ``router``; the controller never imports it). :class:`RouterWatch` checks it every
``interval_seconds`` from a daemon thread: a router that exited on its own (a crash, a
SIGKILL) is started again at once, with the engines' crash-loop guard (at most
``CRASH_RESTARTS`` restarts in ``CRASH_WINDOW_SECONDS``, controller/loop.py; then one
``escalation`` event and no more tries). Each restart is an ``error`` event (source
``supervisor``, target ``router``) and a line through ``echo``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

#: restarts after crashes allowed within :data:`CRASH_WINDOW_SECONDS` (as for engines)
CRASH_RESTARTS = 3
CRASH_WINDOW_SECONDS = 600.0


class RouterWatch:
    """Restarts the router when its process exits on its own.

    Args:
        sup: the router's supervisor (``exited_unexpectedly() -> int | None``, ``restart()``
            raising ``RuntimeError`` when it does not come back healthy).
        event_log: where restarts are recorded (``append(kind, source, message, target=...,
            severity=..., inputs=...)``); None: not recorded.
        echo: one line per restart for the terminal (``print``).
        interval_seconds: how often :meth:`check` runs in :meth:`start`'s thread.
        clock: time source of the crash-loop guard.
    """

    def __init__(self, sup: Any, event_log: Any = None, echo: Callable[[str], None] = print,
                 interval_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.sup = sup
        self.event_log = event_log
        self.echo = echo
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.crash_restarts: list[float] = []
        self.gave_up = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self, now: float | None = None) -> str | None:
        """One look: ``restarted``, ``failed`` (the restart did not come back healthy),
        ``gave_up`` (crash-loop guard), or None (running, or stopped by us)."""
        code = self.sup.exited_unexpectedly()
        if code is None or self.gave_up:
            return None
        now = self.clock() if now is None else now
        self.crash_restarts = [t for t in self.crash_restarts if now - t < CRASH_WINDOW_SECONDS]
        if len(self.crash_restarts) >= CRASH_RESTARTS:
            self.gave_up = True
            self._event("escalation", f"router keeps exiting (code {code}); {CRASH_RESTARTS} restarts in"
                        f" {CRASH_WINDOW_SECONDS / 60:g} minutes, giving up (restart inferctl up)", code)
            return "gave_up"
        self.crash_restarts.append(now)
        self._event("error", f"router exited with code {code}; restarting it", code)
        try:
            self.sup.restart()
        except RuntimeError as exc:
            self._event("error", f"router restart failed: {exc}", code)
            return "failed"
        self.echo(f"router:     restarted at {self.sup.base_url} (it exited with code {code})")
        return "restarted"

    def _event(self, kind: str, message: str, code: int) -> None:
        if kind != "error" or "failed" in message:
            self.echo(f"router:     {message}")
        if self.event_log is None:
            return
        try:
            self.event_log.append(kind, "supervisor", message, target="router", severity="critical",
                                  inputs={"exit_code": code})
        except Exception:   # an event never stops the watch
            pass

    def start(self) -> None:
        """Run :meth:`check` every ``interval_seconds`` in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="router-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            try:
                self.check()
            except Exception:   # the watch outlives a bad look
                continue

    def stop(self) -> None:
        """Stop the thread (before the router is stopped, so that stop is not a crash)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self.interval_seconds + 5)
            self._thread = None
