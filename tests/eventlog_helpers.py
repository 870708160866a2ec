"""Event-log fault injection for tests: a full disk, for real or through SQLite's own error."""

from __future__ import annotations

import sqlite3

_WRITES = ("INSERT", "DELETE", "DROP", "CREATE", "UPDATE")


class DiskFull:
    """Wraps an :class:`EventLog`'s SQLite connection: while ``full``, every write statement
    raises what SQLite raises on a full disk (``sqlite3.OperationalError('database or disk is
    full')``, SQLITE_FULL); reads pass. ``install(log)`` puts it in place."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.full = True
        self.refused = 0

    @classmethod
    def install(cls, log) -> "DiskFull":
        wrapper = cls(log._conn)
        log._conn = wrapper
        return wrapper

    def execute(self, sql: str, *args):
        if self.full and sql.lstrip().upper().startswith(_WRITES):
            self.refused += 1
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)

    def close(self) -> None:
        self.conn.close()


def cap_pages(log) -> None:
    """A real SQLITE_FULL: the database may not grow past its current pages
    (``PRAGMA max_page_count``); a row that needs a new page fails."""
    n = log._conn.execute("PRAGMA page_count").fetchone()[0]
    log._conn.execute(f"PRAGMA max_page_count = {int(n)}")


def uncap_pages(log) -> None:
    """The disk has room again."""
    log._conn.execute("PRAGMA max_page_count = 1073741823")
