"""The controller's event log: an append-only SQLite database in WAL mode.

Every observation that changed a decision, every policy transition, every action with its
inputs and outcome, every refusal and error is one row. Rows are never changed: the table has
``BEFORE UPDATE`` / ``BEFORE DELETE`` triggers that abort, and this class has no update or
delete method. The one removal is retention (``controller/eventlog_retention.py``: age, rows,
bytes), through :meth:`EventLog.purge_oldest`, which lifts the delete trigger only inside its
own transaction (``controller/eventlog_schema.py``). The file survives restarts (reopen it
with the same path and the ids continue); it carries a schema version, migrated forward at
open.

A write that fails (disk full, read-only file system) never raises to the caller and never
blocks an action: the event waits in a bounded in-memory buffer and is written, in order with
its original time, when the file is writable again (:class:`EventLog`).

Row shape (what :meth:`EventLog.query` returns, and ``GET /events`` serves)::

    {"id": int, "time": float (seconds since the epoch), "kind": str, "source": str,
     "target": str | None, "severity": "info"|"warning"|"critical", "reason": str,
     "inputs": dict, "outcome": dict}

``inputs`` and ``outcome`` are stored as strict JSON (RFC 8259: no ``NaN``/``Infinity``);
non-finite floats become ``null`` ("no data").
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from inferctl.controller.eventlog_schema import NO_DELETE_TRIGGER, migrate

log = logging.getLogger(__name__)

EVENT_KINDS: tuple[str, ...] = (
    "observation",   # an input that changed (or fed) a decision
    "transition",    # a policy state machine moved from one state to another
    "decision",      # a policy asked for an action
    "action",        # an action ran (outcome attached)
    "step",          # one step inside an action (e.g. one nvidia-smi call of a GPU reset)
    "refusal",       # an action was refused by a rail (the reason says why)
    "error",         # something failed (a source, an action)
    "escalation",    # a person must act (e.g. GPU is lost: reboot the node)
    "lifecycle",     # controller / engine start, stop, restart
)
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")


class EventLogError(RuntimeError):
    """The event log's file cannot be used (not a database, corrupted, a directory, not
    writable, a schema newer than this inferctl); raised when it is opened, so a bad file stops
    the start, not the running loop. Once open, a write that fails never raises (see
    :meth:`EventLog.append`)."""


#: events kept in memory while the file cannot be written (``event_log_buffer_events``)
DEFAULT_BUFFER_MAX = 10_000
#: rows written per transaction when the buffer is flushed
FLUSH_BATCH = 500
#: rows the reset rails rebuild their state from (lost GPUs, releases, the reset rate limit):
#: retention never deletes them (controller/reset.py ``_load_history``)
KEEP_ROWS_SQL = "(source = 'gpu_reset' OR (kind = 'action' AND target LIKE 'gpu:%'))"


def json_safe(value: Any) -> Any:
    """Return ``value`` as plain JSON data: dataclasses become dicts, tuples/sets lists,
    non-finite floats ``None`` (no data), unknown objects their ``str()``.

    Used for everything the controller stores or serves, so output is strict JSON.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    return str(value)


def _dumps(value: Any) -> str:
    return json.dumps(json_safe(value if value is not None else {}), allow_nan=False,
                      sort_keys=True, separators=(",", ":"))


class EventLog:
    """Append-only event log backed by SQLite (WAL). Thread-safe (one connection, one lock).

    Args:
        path: database file (created with its parent directory if missing), or ``":memory:"``.
        metrics: optional controller metrics (``controller.metrics.build_registry()[1]``):
            ``inferctl_events_total{kind}`` counts rows written; the ``inferctl_event_log_*``
            series count write failures, buffered and dropped events, rows and bytes.
        clock: time source for rows appended without an explicit ``time``.
        buffer_max: events kept in memory while the file cannot be written (>= 1).

    Raises:
        EventLogError: the file cannot be used: an empty path, a directory, not a SQLite
            database, corrupted (SQLite's ``PRAGMA quick_check``), an ``events`` table of
            another shape, a schema version newer than this inferctl, or not writable. The
            message names the path and SQLite's words. ``ValueError`` for ``buffer_max`` < 1.

    The file is migrated to :data:`~inferctl.controller.eventlog_schema.SCHEMA_VERSION` at
    open (``migrated_from`` / ``schema_version`` say what happened).

    **Writes never block an action.** When SQLite cannot write (``SQLITE_FULL`` "database or
    disk is full", a read-only file system, an I/O error), :meth:`append` keeps the event in a
    bounded in-memory buffer (``buffer_max`` events, oldest first; when full, newer events are
    dropped and counted) and returns None instead of an id. Every later :meth:`append` and every
    :meth:`flush` (the maintenance job calls it every few seconds) first writes the buffered
    events, in order, with their original times. The first failure of an outage is logged
    once at ERROR, the recovery once at WARNING, and the recovery is itself an event
    (``observation``, source ``event_log``: the outage's start and end, events written late,
    events dropped).
    """

    def __init__(self, path: str | Path, metrics: dict | None = None,
                 clock: Callable[[], float] = time.time, *, buffer_max: int = DEFAULT_BUFFER_MAX) -> None:
        self.path = str(path)
        if not self.path:
            raise EventLogError("the event log path is empty")
        if isinstance(buffer_max, bool) or not isinstance(buffer_max, int) or buffer_max < 1:
            raise ValueError(f"buffer_max: must be an integer >= 1, got {buffer_max!r}")
        self._lock = threading.RLock()
        self._metrics = metrics
        self._clock = clock
        self.buffer_max = buffer_max
        self._pending: deque[tuple] = deque()
        self._closed = False
        self.write_failures = 0          # failed write attempts, ever
        self.dropped = 0                 # events dropped because the buffer was full, ever
        self.last_write_error: str | None = None
        self._outage: dict | None = None  # {"since", "error", "dropped"} while writes fail
        conn = None
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            conn.row_factory = sqlite3.Row
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous=NORMAL")
            self.migrated_from, self.schema_version = migrate(conn)
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
            # the shape this class reads and writes (a foreign "events" table fails here)
            conn.execute("SELECT id, time, kind, source, target, severity, reason, inputs, outcome"
                         " FROM events ORDER BY id DESC LIMIT 1").fetchall()
            conn.execute("BEGIN IMMEDIATE")     # writable? (a read-only file fails here)
            conn.execute("ROLLBACK")
        except (sqlite3.Error, OSError) as exc:
            if conn is not None:
                conn.close()
            raise EventLogError(f"{self.path}: cannot be used as the event log ({exc})") from None
        self._conn = conn
        self.journal_mode: str = str(mode).lower()
        self._gauge("inferctl_event_log_buffered_events", 0)

    # ------------------------------------------------------------------ writing
    def append(self, kind: str, source: str, reason: str, *, target: str | None = None,
               severity: str = "info", inputs: Any = None, outcome: Any = None,
               time: float | None = None) -> int | None:
        """Append one event and return its id (ids grow strictly), or None when the file cannot
        be written now and the event waits in memory (or was dropped: the buffer was full).

        Raises:
            ValueError: ``kind`` not in :data:`EVENT_KINDS`, ``severity`` not in
                :data:`SEVERITIES`, or an empty ``source``/``reason`` (a caller's bug, never
                the disk's).
            sqlite3.ProgrammingError: the log was closed.
        """
        if kind not in EVENT_KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(EVENT_KINDS)}")
        if severity not in SEVERITIES:
            raise ValueError(f"severity: {severity!r} is not one of {', '.join(SEVERITIES)}")
        if not source:
            raise ValueError("source: must not be empty")
        if not reason:
            raise ValueError("reason: must not be empty")
        when = self._clock() if time is None else float(time)
        row = (when, kind, source, None if target is None else str(target), severity, reason,
               _dumps(inputs), _dumps(outcome))
        with self._lock:
            if self._closed:
                raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
            if self._pending:
                if not self._flush_locked():
                    self._keep(row)
                    return None
                self._recovered()      # the outage's record right after its late events
            try:
                event_id = self._insert([row])
            except (sqlite3.DatabaseError, OSError) as exc:
                self._failed(exc)
                self._keep(row)
                return None
            self._recovered()
        return event_id

    def flush(self) -> bool:
        """Write the buffered events now (in order, original times). True when nothing is left
        in memory. Never raises for SQLite or OS errors (they are counted); a closed log is
        False."""
        with self._lock:
            if self._closed:
                return not self._pending
            if not self._pending:
                return True
            ok = self._flush_locked()
            if ok:
                self._recovered()
            return ok

    @property
    def buffered(self) -> int:
        """Events waiting in memory for the file to be writable again."""
        with self._lock:
            return len(self._pending)

    @property
    def outage(self) -> dict | None:
        """``{"since": seconds since the epoch, "error": SQLite's words, "dropped": int}`` while
        writes fail, else None."""
        with self._lock:
            return None if self._outage is None else dict(self._outage)

    def pending(self) -> list[dict]:
        """The buffered events as rows (``id`` None), oldest first."""
        with self._lock:
            rows = list(self._pending)
        return [self._pending_row(r) for r in rows]

    def _insert(self, rows: list[tuple]) -> int:
        """Write ``rows`` in one transaction; the last row's id. Raises SQLite's error (nothing
        written then)."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            last = 0
            for row in rows:
                cur = conn.execute(
                    "INSERT INTO events(time, kind, source, target, severity, reason, inputs, outcome)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
                last = int(cur.lastrowid)
            conn.execute("COMMIT")
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass     # SQLite rolled back already (SQLITE_FULL ends the transaction)
            raise
        counter = (self._metrics or {}).get("inferctl_events_total")
        if counter is not None:
            for row in rows:
                counter.labels(kind=row[1]).inc()
        return last

    def _flush_locked(self) -> bool:
        while self._pending:
            batch = [self._pending[i] for i in range(min(FLUSH_BATCH, len(self._pending)))]
            try:
                self._insert(batch)
            except (sqlite3.DatabaseError, OSError) as exc:
                self._failed(exc)
                return False
            for _ in batch:
                self._pending.popleft()
            if self._outage is not None:
                self._outage["late"] = self._outage.get("late", 0) + len(batch)
            self._gauge("inferctl_event_log_buffered_events", len(self._pending))
        return True

    def _keep(self, row: tuple) -> None:
        if len(self._pending) >= self.buffer_max:
            self.dropped += 1
            if self._outage is not None:
                if self._outage["dropped"] == 0:
                    log.error("event log %s: the in-memory buffer is full (%d events): newer events are"
                              " DROPPED until the file is writable again", self.path, self.buffer_max)
                self._outage["dropped"] += 1
            self._inc("inferctl_event_log_dropped_events_total")
        else:
            self._pending.append(row)
        self._gauge("inferctl_event_log_buffered_events", len(self._pending))

    def _failed(self, exc: BaseException) -> None:
        self.write_failures += 1
        self.last_write_error = str(exc) or type(exc).__name__
        self._inc("inferctl_event_log_write_failures_total")
        if self._outage is None:
            self._outage = {"since": self._clock(), "error": self.last_write_error, "dropped": 0}
            log.error("event log %s: write failed (%s): actions go on; events are kept in memory (at most"
                      " %d) and written when the file is writable again", self.path, self.last_write_error,
                      self.buffer_max)

    def _recovered(self) -> None:
        """After a successful write: end the outage (log once, record it as an event)."""
        outage, self._outage = self._outage, None
        if outage is None:
            return
        now = self._clock()
        late = outage.get("late", 0)
        log.warning("event log %s: writable again after %.1f s; buffered events written, %d dropped",
                    self.path, now - outage["since"], outage["dropped"])
        reason = (f"event log write outage from {outage['since']:.3f} to {now:.3f}"
                  f" ({now - outage['since']:.1f} s, {outage['error']}): buffered events were written late"
                  f" with their original times; {outage['dropped']} dropped (buffer bound {self.buffer_max})")
        row = (now, "observation", "event_log", None, "critical" if outage["dropped"] else "warning", reason,
               _dumps({"since": outage["since"], "error": outage["error"], "buffer_max": self.buffer_max,
                       "late": late}),
               _dumps({"dropped": outage["dropped"], "recovered_at": now}))
        try:
            self._insert([row])
        except (sqlite3.DatabaseError, OSError) as exc:   # failed again at once: a new outage
            self._failed(exc)
            self._keep(row)

    # ------------------------------------------------------------------ retention
    def purge_oldest(self, condition: str, args: tuple, limit: int) -> int:
        """Delete at most ``limit`` of the oldest rows matching the SQL ``condition`` (with
        ``args``), never a row the reset rails need (:data:`KEEP_ROWS_SQL`). The one delete path:
        drops the ``events_no_delete`` trigger, deletes and recreates it in ONE transaction
        (``eventlog_schema``). Returns the rows deleted. Raises SQLite's error (nothing deleted)."""
        if limit < 1:
            return 0
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DROP TRIGGER IF EXISTS events_no_delete")
                cur = conn.execute(f"DELETE FROM events WHERE id IN (SELECT id FROM events WHERE ({condition})"
                                   f" AND NOT {KEEP_ROWS_SQL} ORDER BY id LIMIT ?)", (*args, int(limit)))
                conn.execute(NO_DELETE_TRIGGER)
                conn.execute("COMMIT")
            except BaseException:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise
            return max(int(cur.rowcount), 0)

    def usage(self) -> dict:
        """``{"rows": int, "bytes": int (pages in use × page size), "file_bytes": int (all pages,
        free ones included: SQLite reuses them; the file shrinks only on VACUUM)}``."""
        with self._lock:
            rows = int(self._conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
            pages = int(self._conn.execute("PRAGMA page_count").fetchone()[0])
            free = int(self._conn.execute("PRAGMA freelist_count").fetchone()[0])
            size = int(self._conn.execute("PRAGMA page_size").fetchone()[0])
        return {"rows": rows, "bytes": (pages - free) * size, "file_bytes": pages * size}

    # ------------------------------------------------------------------ reading
    def scan(self, kind: str | None = None, source: str | None = None, batch: int = 5000):
        """Every event of ``kind`` (and ``source``), oldest first, read in pages of ``batch``.

        For rebuilding state at start (the reset rails' lost GPUs and rate limits): unlike
        :meth:`query` it has no overall limit, so nothing old is forgotten however many events
        came after it. Raises ValueError for an unknown ``kind`` or ``batch`` < 1.
        """
        if batch < 1:
            raise ValueError(f"batch: must be >= 1, got {batch}")
        last = 0
        while True:
            rows = self.query(since_id=last, limit=batch, kind=kind)
            if not rows:
                return
            for row in rows:
                if source is None or row["source"] == source:
                    yield row
            last = rows[-1]["id"]

    def query(self, since_id: int | None = None, limit: int = 100, kind: str | None = None,
              target: str | None = None) -> list[dict]:
        """Events in ascending id order.

        With ``since_id``: the first ``limit`` events whose id is greater (for paging and
        tailing). Without: the latest ``limit`` events.

        Raises:
            ValueError: ``limit`` < 1, ``since_id`` < 0, or an unknown ``kind``.
        """
        if limit < 1:
            raise ValueError(f"limit: must be >= 1, got {limit}")
        if since_id is not None and since_id < 0:
            raise ValueError(f"since_id: must be >= 0, got {since_id}")
        if kind is not None and kind not in EVENT_KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(EVENT_KINDS)}")
        where, args = [], []
        if since_id is not None:
            where.append("id > ?")
            args.append(since_id)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        if target is not None:
            where.append("target = ?")
            args.append(target)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        order = "ASC" if since_id is not None else "DESC"
        sql = f"SELECT * FROM events{clause} ORDER BY id {order} LIMIT ?"
        with self._lock:
            rows = self._conn.execute(sql, (*args, limit)).fetchall()
        events = [self._row(r) for r in rows]
        if order == "DESC":
            events.reverse()
        return events

    def newest(self, kind: str, source: str, reasons: tuple[str, ...] | None = None) -> dict | None:
        """The newest event of ``kind`` from ``source`` (with a ``reason`` in ``reasons`` when
        given), or None. Raises ValueError for an unknown ``kind``."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(EVENT_KINDS)}")
        sql, args = "SELECT * FROM events WHERE kind = ? AND source = ?", [kind, source]
        if reasons:
            sql += f" AND reason IN ({', '.join('?' * len(reasons))})"
            args += list(reasons)
        with self._lock:
            row = self._conn.execute(sql + " ORDER BY id DESC LIMIT 1", args).fetchone()
        return None if row is None else self._row(row)

    def last_id(self) -> int:
        """The id of the newest event (0 when the log is empty)."""
        with self._lock:
            row = self._conn.execute("SELECT MAX(id) FROM events").fetchone()
        return int(row[0] or 0)

    def count(self, kind: str | None = None) -> int:
        """Number of events (of one ``kind`` when given)."""
        with self._lock:
            if kind is None:
                row = self._conn.execute("SELECT COUNT(*) FROM events").fetchone()
            else:
                row = self._conn.execute("SELECT COUNT(*) FROM events WHERE kind = ?",
                                         (kind,)).fetchone()
        return int(row[0])

    def close(self) -> None:
        """Write what is buffered, then close the database (further appends raise
        ``sqlite3.ProgrammingError``). Idempotent; never raises for the disk: events that still
        cannot be written are logged at ERROR, one JSON line each, and counted as dropped."""
        with self._lock:
            if self._closed:
                return
            self._flush_locked()
            lost = list(self._pending)
            self._pending.clear()
            self._closed = True
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        if lost:
            self.dropped += len(lost)
            self._inc("inferctl_event_log_dropped_events_total", len(lost))
            self._gauge("inferctl_event_log_buffered_events", 0)
            log.error("event log %s: closing with %d event(s) that could not be written (%s); they are"
                      " lost from the file and follow here:", self.path, len(lost), self.last_write_error)
            for row in lost:
                log.error("unwritten event: %s", json.dumps(self._pending_row(row), sort_keys=True))

    def _inc(self, name: str, amount: float = 1.0) -> None:
        metric = (self._metrics or {}).get(name)
        if metric is not None:
            metric.inc(amount)

    def _gauge(self, name: str, value: float) -> None:
        metric = (self._metrics or {}).get(name)
        if metric is not None:
            metric.set(value)

    @staticmethod
    def _pending_row(row: tuple) -> dict:
        return {"id": None, "time": row[0], "kind": row[1], "source": row[2], "target": row[3],
                "severity": row[4], "reason": row[5], "inputs": json.loads(row[6]),
                "outcome": json.loads(row[7])}

    @staticmethod
    def _row(row: sqlite3.Row) -> dict:
        return {"id": row["id"], "time": row["time"], "kind": row["kind"],
                "source": row["source"], "target": row["target"], "severity": row["severity"],
                "reason": row["reason"], "inputs": json.loads(row["inputs"]),
                "outcome": json.loads(row["outcome"])}
