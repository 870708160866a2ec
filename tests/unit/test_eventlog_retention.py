"""Item: the event log is bounded (age, rows, bytes) through one controlled delete path, and
carries a schema version migrated forward at open."""

from __future__ import annotations

import sqlite3

import pytest

from inferctl.controller.eventlog_retention import EventLogMaintenance, Retention, apply_retention
from inferctl.controller.eventlog_schema import BASE_SCHEMA, SCHEMA_VERSION
from inferctl.controller.events import EventLog, EventLogError
from inferctl.controller.metrics import build_registry


def _v0_file(path, rows):
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript(BASE_SCHEMA)
    for i in range(rows):
        raw.execute("INSERT INTO events(time, kind, source, target, severity, reason, inputs, outcome)"
                    " VALUES (?, 'action', 'operator', 'main', 'info', ?, '{}', '{}')", (1000.0 + i, f"old {i}"))
    raw.close()


def test_an_unversioned_file_is_migrated_to_version_1_with_its_rows(tmp_path):
    path = tmp_path / "ev.db"
    _v0_file(path, 3)
    log = EventLog(path)
    assert (log.migrated_from, log.schema_version) == (0, SCHEMA_VERSION) == (0, 1)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
    assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'events_time'").fetchone() is not None
    raw.close()
    assert [e["reason"] for e in log.query()] == ["old 0", "old 1", "old 2"]
    log.close()
    again = EventLog(path)
    assert (again.migrated_from, again.schema_version) == (1, 1)


def test_a_file_from_a_newer_inferctl_is_refused(tmp_path):
    path = tmp_path / "ev.db"
    _v0_file(path, 1)
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 7")
    raw.commit()
    raw.close()
    with pytest.raises(EventLogError, match="schema version 7 is newer"):
        EventLog(path)


def _fill(log, n, t0=0.0, size=10):
    for i in range(n):
        log.append("observation", "p", f"e{i}", inputs={"pad": "y" * size}, time=t0 + i)


def test_retention_by_age_and_rows_deletes_the_oldest_and_keeps_the_rails_rows(tmp_path):
    log = EventLog(tmp_path / "ev.db")
    log.append("escalation", "gpu_reset", "GPU 0 lost", target="gpu:0", outcome={"gpu": 0}, time=1.0)
    log.append("action", "operator", "GPU 1 released", target="gpu:1", outcome={"gpu": 1, "released": True},
               time=2.0)
    _fill(log, 50, t0=100.0)
    out = apply_retention(log, Retention(max_age_seconds=30.0), now=160.0)      # older than t=130
    assert out == {"age": 30, "rows": 0, "bytes": 0}
    assert [e["reason"] for e in log.query(limit=3)] == ["e47", "e48", "e49"]
    out = apply_retention(log, Retention(max_rows=12, batch_rows=3), now=160.0)
    assert out["rows"] == 10
    rows = log.query(limit=100)
    assert len(rows) == 12 and rows[0]["reason"] == "GPU 0 lost" and rows[1]["reason"] == "GPU 1 released"
    assert rows[2]["reason"] == "e40"
    # the append-only triggers still forbid DELETE and UPDATE for everyone else
    raw = sqlite3.connect(tmp_path / "ev.db")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        raw.execute("DELETE FROM events")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        raw.execute("UPDATE events SET reason = 'x'")
    raw.close()


def test_retention_by_bytes_bounds_the_pages_in_use(tmp_path):
    log = EventLog(tmp_path / "ev.db")
    _fill(log, 400, size=2000)
    before = log.usage()
    assert before["bytes"] > 800_000
    out = apply_retention(log, Retention(max_bytes=200_000), now=0.0)
    after = log.usage()
    assert after["bytes"] <= 200_000 and out["bytes"] == before["rows"] - after["rows"] > 0
    assert log.query(limit=1)[0]["reason"] == "e399"                 # the newest are kept
    _fill(log, 50, t0=1000.0, size=2000)                               # freed pages are reused
    assert log.usage()["file_bytes"] <= before["file_bytes"]


def test_maintenance_exports_rows_bytes_and_deleted_counts(tmp_path):
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics)
    _fill(log, 20)
    m = EventLogMaintenance(log, Retention(max_rows=5), metrics, clock=lambda: 100.0)
    out = m.run_once()
    assert out["deleted"]["rows"] == 15 and out["rows"] == 5 and out["error"] is None
    assert registry.get_sample_value("inferctl_event_log_rows") == 5
    assert registry.get_sample_value("inferctl_event_log_bytes") == log.usage()["bytes"] > 0
    assert registry.get_sample_value("inferctl_event_log_retention_deleted_rows_total", {"reason": "rows"}) == 15
    assert registry.get_sample_value("inferctl_event_log_retention_deleted_rows_total", {"reason": "age"}) == 0


def test_retention_that_fails_on_a_full_disk_is_reported_not_raised(tmp_path):
    from tests.eventlog_helpers import DiskFull

    log = EventLog(tmp_path / "ev.db")
    _fill(log, 10)
    DiskFull.install(log)
    out = EventLogMaintenance(log, Retention(max_rows=2)).run_once()
    assert "full" in out["error"] and out["rows"] == 10


def test_retention_config_keys(tmp_path):
    from inferctl.controller.config import ConfigError, parse_config

    cfg = parse_config({"event_log_retention": {"max_age_days": 7, "max_rows": None, "max_bytes": "64MiB"},
                        "event_log_buffer_events": 500})
    r = cfg.event_log_retention
    assert (r.max_age_days, r.max_rows, r.max_bytes_value()) == (7, None, 64 * 1024 * 1024)
    assert cfg.event_log_buffer_events == 500
    with pytest.raises(ConfigError, match="event_log_retention.max_rows"):
        parse_config({"event_log_retention": {"max_rows": 0}})
