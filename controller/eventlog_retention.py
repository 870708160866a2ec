"""Event-log retention and upkeep: the log stays bounded by age, rows and bytes, and events
buffered during a write outage are flushed, on a schedule of their own, never in an action's way.

:func:`apply_retention` deletes the oldest rows (in batches of :attr:`Retention.batch_rows`,
each its own short transaction, so an append waits at most one batch) until the log is within
every configured bound:

* ``max_age_seconds`` — rows older than that (their ``time``);
* ``max_rows`` — the oldest rows beyond that count;
* ``max_bytes`` — the pages in use (``EventLog.usage()["bytes"]``) above that size: the oldest
  share of rows that is over, again until under (at most :data:`MAX_BYTE_ROUNDS` rounds).
  Freed pages are reused by SQLite, so the file stops growing at about ``max_bytes``; it shrinks
  only on ``VACUUM`` (not run: it rewrites the whole file and blocks writes).

Rows the GPU reset rails rebuild their state from (lost GPUs, releases, the reset rate limit:
``events.KEEP_ROWS_SQL``) are never deleted, so they may keep the log above a bound.

:class:`EventLogMaintenance` runs two APScheduler jobs: a flush of the write buffer every
``flush_interval_seconds`` and retention every ``check_interval_seconds`` (and once at start),
exporting ``inferctl_event_log_rows`` / ``_bytes`` and counting
``inferctl_event_log_retention_deleted_rows_total{reason}``. A retention pass that fails (the
disk is full: a delete needs WAL space too) is logged and retried at the next check.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Callable

from apscheduler.schedulers.background import BackgroundScheduler

from inferctl.controller.events import EventLog

log = logging.getLogger(__name__)

#: ``reason`` label values of ``inferctl_event_log_retention_deleted_rows_total``
RETENTION_REASONS = ("age", "rows", "bytes")
#: rounds of the bytes bound per pass (each deletes the share of rows that is over)
MAX_BYTE_ROUNDS = 8


@dataclass(frozen=True)
class Retention:
    """The event log's bounds (None: no bound of that kind).

    Attributes:
        max_age_seconds: delete rows older than this (> 0).
        max_rows: keep at most this many rows (>= 1).
        max_bytes: keep the pages in use at most this large (>= 1).
        batch_rows: rows deleted per transaction (>= 1).
    """

    max_age_seconds: float | None = None
    max_rows: int | None = None
    max_bytes: int | None = None
    batch_rows: int = 5000

    def __post_init__(self) -> None:
        for name in ("max_age_seconds", "max_rows", "max_bytes"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a positive number or None, got {value!r}")
        if self.batch_rows < 1:
            raise ValueError(f"batch_rows: must be >= 1, got {self.batch_rows}")


def _purge(event_log: EventLog, condition: str, args: tuple, count: int, batch: int) -> int:
    """Delete up to ``count`` oldest rows matching ``condition``, ``batch`` per transaction."""
    deleted = 0
    while deleted < count:
        n = event_log.purge_oldest(condition, args, min(batch, count - deleted))
        if n == 0:
            break
        deleted += n
    return deleted


def apply_retention(event_log: EventLog, retention: Retention, now: float) -> dict[str, int]:
    """One retention pass at ``now`` (seconds since the epoch). Returns the rows deleted per
    reason (:data:`RETENTION_REASONS`). Raises SQLite's error when a delete fails (the rows
    deleted before it stay deleted)."""
    out = dict.fromkeys(RETENTION_REASONS, 0)
    big = 2 ** 62
    if retention.max_age_seconds is not None:
        out["age"] = _purge(event_log, "time < ?", (now - retention.max_age_seconds,), big, retention.batch_rows)
    if retention.max_rows is not None:
        excess = event_log.usage()["rows"] - retention.max_rows
        if excess > 0:
            out["rows"] = _purge(event_log, "1", (), excess, retention.batch_rows)
    if retention.max_bytes is not None:
        for _ in range(MAX_BYTE_ROUNDS):
            use = event_log.usage()
            if use["bytes"] <= retention.max_bytes or use["rows"] == 0:
                break
            share = (use["bytes"] - retention.max_bytes) / use["bytes"]
            n = _purge(event_log, "1", (), max(1, math.ceil(use["rows"] * share)), retention.batch_rows)
            if n == 0:
                break
            out["bytes"] += n
    return out


class EventLogMaintenance:
    """Flushes the event log's write buffer and applies :class:`Retention` on a schedule.

    Args:
        event_log: the log.
        retention: its bounds.
        metrics: controller metrics by name (``controller.metrics.build_registry()[1]``).
        check_interval_seconds: retention period (> 0).
        flush_interval_seconds: buffer flush period (> 0).
        clock: time source (seconds since the epoch).
    """

    def __init__(self, event_log: EventLog, retention: Retention, metrics: dict | None = None, *,
                 check_interval_seconds: float = 300.0, flush_interval_seconds: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:
        if check_interval_seconds <= 0 or flush_interval_seconds <= 0:
            raise ValueError("check_interval_seconds, flush_interval_seconds: must be > 0")
        self.event_log = event_log
        self.retention = retention
        self.metrics = metrics or {}
        self.check_interval_seconds = check_interval_seconds
        self.flush_interval_seconds = flush_interval_seconds
        self.clock = clock
        self.last: dict[str, Any] | None = None
        self._scheduler: BackgroundScheduler | None = None
        for reason in RETENTION_REASONS:
            counter = self.metrics.get("inferctl_event_log_retention_deleted_rows_total")
            if counter is not None:
                counter.labels(reason=reason)

    def run_once(self) -> dict[str, Any]:
        """Flush, apply retention, export rows and bytes. Returns ``{"deleted": {reason: n},
        "rows", "bytes", "error"}`` (``error`` None, or SQLite's words; never raises)."""
        self.event_log.flush()
        deleted = dict.fromkeys(RETENTION_REASONS, 0)
        error = None
        try:
            deleted = apply_retention(self.event_log, self.retention, self.clock())
        except (sqlite3.Error, OSError) as exc:
            error = str(exc) or type(exc).__name__
            log.warning("event log retention failed (%s); retried in %g s", error, self.check_interval_seconds)
        counter = self.metrics.get("inferctl_event_log_retention_deleted_rows_total")
        for reason, n in deleted.items():
            if n and counter is not None:
                counter.labels(reason=reason).inc(n)
        use: dict[str, Any] = {"rows": None, "bytes": None}
        try:
            use = self.event_log.usage()
        except (sqlite3.Error, OSError) as exc:
            error = error or str(exc)
        for name, key in (("inferctl_event_log_rows", "rows"), ("inferctl_event_log_bytes", "bytes")):
            gauge = self.metrics.get(name)
            if gauge is not None and use[key] is not None:
                gauge.set(use[key])
        self.last = {"deleted": deleted, "rows": use["rows"], "bytes": use["bytes"], "error": error}
        return self.last

    def start(self) -> None:
        """Start the two jobs (retention runs once at once). Idempotent."""
        if self._scheduler is not None:
            return
        sched = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True,
                                                  "misfire_grace_time": 30})
        sched.add_job(self.event_log.flush, "interval", seconds=self.flush_interval_seconds, id="event_log_flush")
        sched.add_job(self.run_once, "interval", seconds=self.check_interval_seconds, id="event_log_retention",
                      next_run_time=dt.datetime.now())
        sched.start()
        self._scheduler = sched

    def stop(self) -> None:
        """Stop the jobs (a running pass finishes). Idempotent."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
