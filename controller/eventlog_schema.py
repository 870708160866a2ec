"""The event log's SQLite schema, its version, and its forward migrations.

The version is SQLite's ``PRAGMA user_version`` (https://sqlite.org/pragma.html#pragma_user_version):
a 32-bit integer in the database header, 0 in a file that never set it. inferctl's versions:

* **0** — the unversioned schema of inferctl before schema versions: the ``events`` table, its
  ``kind`` and ``target`` indexes and the two append-only triggers.
* **1** — adds the ``events_time`` index (retention by age deletes ``WHERE time < ?``) and sets
  ``user_version = 1``. Rows are unchanged.

:func:`migrate` runs at every open: it creates the version-0 objects when missing (a fresh
file), then applies each migration above the file's version in ONE transaction (a crash
mid-migration leaves the old version intact). A file newer than this inferctl is refused
(never downgraded).

Append-only: the ``events_no_update`` / ``events_no_delete`` triggers abort every UPDATE and
DELETE. Retention is the one controlled exception (:data:`NO_DELETE_TRIGGER`): inside one
``BEGIN IMMEDIATE`` transaction it drops the delete trigger, deletes the oldest rows and
creates the trigger again, so no other connection ever sees the table without it (SQLite
transactions are atomic and isolated; in WAL mode a reader sees the last committed state).
"""

from __future__ import annotations

import sqlite3

#: the schema version this inferctl writes and reads
SCHEMA_VERSION = 1

NO_UPDATE_TRIGGER = ("CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events"
                     " BEGIN SELECT RAISE(ABORT, 'the event log is append-only: UPDATE is not allowed'); END")
NO_DELETE_TRIGGER = ("CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events"
                     " BEGIN SELECT RAISE(ABORT, 'the event log is append-only: DELETE is not allowed'); END")

#: version 0: what every inferctl before schema versions created
BASE_SCHEMA = f"""
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
{NO_UPDATE_TRIGGER};
{NO_DELETE_TRIGGER};
"""

#: version N → the statements that bring a version N-1 file to N
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("CREATE INDEX IF NOT EXISTS events_time ON events(time)",),
}


class SchemaTooNew(sqlite3.DatabaseError):
    """The file carries a schema version above :data:`SCHEMA_VERSION` (a newer inferctl wrote it)."""


def schema_version(conn: sqlite3.Connection) -> int:
    """The file's ``PRAGMA user_version`` (0: unversioned)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection) -> tuple[int, int]:
    """Bring the database on ``conn`` (autocommit mode: ``isolation_level=None``) to
    :data:`SCHEMA_VERSION`. Returns ``(version found, version now)``.

    Raises:
        SchemaTooNew: the file's version is above :data:`SCHEMA_VERSION`.
        sqlite3.Error: SQLite could not read or write the file (the transaction is rolled back).
    """
    found = schema_version(conn)
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(f"schema version {found} is newer than this inferctl's {SCHEMA_VERSION};"
                           " use a newer inferctl or another event log file")
    conn.executescript(BASE_SCHEMA)
    if found == SCHEMA_VERSION:
        return found, found
    conn.execute("BEGIN IMMEDIATE")
    try:
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return found, SCHEMA_VERSION
