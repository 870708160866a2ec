"""The controller's event log: an append-only SQLite database in WAL mode.

Every observation that changed a decision, every policy transition, every action with its
inputs and outcome, every refusal and error is one row. Rows are never changed or removed:
the table has ``BEFORE UPDATE`` / ``BEFORE DELETE`` triggers that abort, and this class has
no update or delete method. The file survives restarts (reopen it with the same path and the
ids continue).

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
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable

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
    writable); raised when it is opened, so a bad file stops the start, not the running loop."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    time     REAL    NOT NULL,
    kind     TEXT    NOT NULL,
    source   TEXT    NOT NULL,
    target   TEXT,
    severity TEXT    NOT NULL,
    reason   TEXT    NOT NULL,
    inputs   TEXT    NOT NULL,
    outcome  TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind, id);
CREATE INDEX IF NOT EXISTS events_target ON events(target, id);
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the event log is append-only: UPDATE is not allowed'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the event log is append-only: DELETE is not allowed'); END;
"""


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
        metrics: optional controller metrics (``controller.metrics.build_registry()[1]``);
            :meth:`append` increments ``inferctl_events_total{kind}``.
        clock: time source for rows appended without an explicit ``time``.

    Raises:
        EventLogError: the file cannot be used: an empty path, a directory, not a SQLite
            database, corrupted (SQLite's ``PRAGMA quick_check``), an ``events`` table of
            another shape, or not writable. The message names the path and SQLite's words.
    """

    def __init__(self, path: str | Path, metrics: dict | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = str(path)
        if not self.path:
            raise EventLogError("the event log path is empty")
        self._lock = threading.Lock()
        self._metrics = metrics
        self._clock = clock
        conn = None
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            conn.row_factory = sqlite3.Row
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
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

    def append(self, kind: str, source: str, reason: str, *, target: str | None = None,
               severity: str = "info", inputs: Any = None, outcome: Any = None,
               time: float | None = None) -> int:
        """Append one event and return its id (ids grow strictly).

        Raises:
            ValueError: ``kind`` not in :data:`EVENT_KINDS`, ``severity`` not in
                :data:`SEVERITIES`, or an empty ``source``/``reason``.
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
            cur = self._conn.execute(
                "INSERT INTO events(time, kind, source, target, severity, reason, inputs, outcome)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
            event_id = int(cur.lastrowid)
        if self._metrics is not None and "inferctl_events_total" in self._metrics:
            self._metrics["inferctl_events_total"].labels(kind=kind).inc()
        return event_id

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
        """Close the database (further calls raise ``sqlite3.ProgrammingError``)."""
        with self._lock:
            self._conn.close()

    @staticmethod
    def _row(row: sqlite3.Row) -> dict:
        return {"id": row["id"], "time": row["time"], "kind": row["kind"],
                "source": row["source"], "target": row["target"], "severity": row["severity"],
                "reason": row["reason"], "inputs": json.loads(row["inputs"]),
                "outcome": json.loads(row["outcome"])}
