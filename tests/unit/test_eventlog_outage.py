"""Item: the event log never blocks an action. A full disk keeps events in a bounded memory
buffer, written in order with their original times once the disk has room; actions and
operator answers go on; failures are counted and said once."""

from __future__ import annotations

import logging
import time

import pytest

from inferctl.controller.events import EventLog
from inferctl.controller.metrics import build_registry
from tests.controller_helpers import FakeClock, FakeEngineClient, make_controller
from tests.eventlog_helpers import DiskFull, cap_pages, uncap_pages

BIG = {"blob": "x" * 6000}     # needs a new page: fails on a capped database


def test_real_sqlite_full_is_buffered_then_written_in_order_with_original_times(tmp_path, caplog):
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics)
    first = log.append("action", "operator", "before", time=100.0)
    cap_pages(log)
    caplog.set_level(logging.WARNING, logger="inferctl.controller.events")
    ids = [log.append("transition", "precision", f"during {i}", inputs=BIG, time=200.0 + i) for i in range(3)]
    assert ids == [None, None, None]
    assert log.buffered == 3 and log.outage is not None and "full" in log.outage["error"]
    assert registry.get_sample_value("inferctl_event_log_buffered_events") == 3
    assert registry.get_sample_value("inferctl_event_log_write_failures_total") == 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "write failed" in errors[0].getMessage()     # loud, once per outage
    assert log.flush() is False                                               # still full
    uncap_pages(log)
    after = log.append("action", "operator", "after", time=300.0)
    rows = log.query(limit=100)
    reasons = [r["reason"] for r in rows]
    assert reasons[:4] == ["before", "during 0", "during 1", "during 2"]
    assert [r["time"] for r in rows[1:4]] == [200.0, 201.0, 202.0]            # original times
    assert rows[1]["id"] == first + 1 and after == rows[-1]["id"]
    recovered = [r for r in rows if r["source"] == "event_log"]
    assert len(recovered) == 1 and recovered[0]["outcome"]["dropped"] == 0
    assert recovered[0]["inputs"]["late"] == 3 and reasons[-2:] == [recovered[0]["reason"], "after"]
    assert log.buffered == 0 and log.outage is None
    assert registry.get_sample_value("inferctl_event_log_buffered_events") == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "writable again" in warnings[0].getMessage()


def test_buffer_is_bounded_and_drops_are_counted_and_reported(tmp_path, caplog):
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics, buffer_max=4)
    disk = DiskFull.install(log)
    for i in range(7):
        assert log.append("observation", "p", f"e{i}", time=10.0 + i) is None
    assert log.buffered == 4 and log.dropped == 3
    assert registry.get_sample_value("inferctl_event_log_dropped_events_total") == 3
    assert [e["reason"] for e in log.pending()] == ["e0", "e1", "e2", "e3"]   # the outage's start is kept
    disk.full = False
    assert log.flush() is True
    rows = log.query(limit=10)
    assert [r["reason"] for r in rows[:4]] == ["e0", "e1", "e2", "e3"]
    assert rows[4]["source"] == "event_log" and rows[4]["outcome"]["dropped"] == 3
    assert rows[4]["severity"] == "critical"


def test_close_with_a_full_disk_does_not_raise_and_logs_what_is_lost(tmp_path, caplog):
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics)
    DiskFull.install(log)
    log.append("lifecycle", "controller", "controller stopped")
    caplog.set_level(logging.ERROR, logger="inferctl.controller.events")
    log.close()                                   # used to raise sqlite3.OperationalError
    log.close()                                   # idempotent
    assert registry.get_sample_value("inferctl_event_log_dropped_events_total") == 1
    assert any("controller stopped" in r.getMessage() for r in caplog.records)


def test_bad_arguments_still_raise(tmp_path):
    log = EventLog(tmp_path / "ev.db")
    DiskFull.install(log)
    with pytest.raises(ValueError, match="kind"):
        log.append("bogus", "p", "r")
    with pytest.raises(ValueError, match="buffer_max"):
        EventLog(tmp_path / "ev2.db", buffer_max=0)


MIB = 1024 * 1024


def _oom(fid, t):
    return {"id": fid, "time": t, "kind": "exhaustion", "requested_bytes": 96 * MIB,
            "free_bytes": 41 * MIB, "allocated_bytes": 900 * MIB, "reserved_unallocated_bytes": 1 * MIB,
            "total_bytes": 1024 * MIB, "message": "out of memory", "source": "budget", "precision": "full"}


def test_oom_switches_to_int8_while_the_disk_is_full_and_events_appear_after(tmp_path):
    client = FakeEngineClient()
    client.memory = {"memory_budget_bytes": 1024 * MIB, "memory_reserved_bytes": 1000 * MIB,
                     "memory_allocated_bytes": 990 * MIB, "full_weights_bytes": 4 * MIB, "weights_bytes": 4 * MIB}
    ctl, registry, log = make_controller(tmp_path, {"main": client})
    now = time.time()
    ctl.tick(now)
    disk = DiskFull.install(log)
    client.faults.append(_oom(1, now + 0.5))
    decisions = ctl.tick(now + 1)
    assert [d.action for d in decisions] == ["degrade"]
    assert ctl.wait_for_actions(5)
    assert client.calls == [("precision", "int8")]                 # the action ran
    ctl.tick(now + 2)
    assert ctl.policies["main"]["precision"].current.value == "int8"
    assert log.buffered >= 2 and disk.refused >= 2
    assert registry.get_sample_value("inferctl_event_log_write_failures_total") >= 2
    disk.full = False
    assert log.flush()
    kinds = [(e["kind"], e["source"]) for e in log.query(limit=100)]
    assert ("transition", "precision") in kinds and ("action", "precision") in kinds


def test_operator_drain_answers_200_with_a_note_while_the_disk_is_full(tmp_path):
    from fastapi.testclient import TestClient

    from inferctl.controller.api import create_app

    token = "t" * 32
    client = FakeEngineClient()
    ctl, registry, log = make_controller(tmp_path, {"main": client}, clock=FakeClock())
    ctl.tick()
    http = TestClient(create_app(ctl, token))
    disk = DiskFull.install(log)
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    r = http.post("/actions/drain", json={"engine": "main"}, headers=auth)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ok"] is True and body["event_id"] is None
    assert "kept in memory" in body["event_note"]
    assert client.draining is True
    ev = http.get("/events").json()
    assert ev["buffered"] >= 1
    disk.full = False
    r = http.post("/actions/undrain", json={"engine": "main"}, headers=auth)
    assert r.status_code == 200 and isinstance(r.json()["event_id"], int) and r.json()["event_note"] is None
    reasons = [e["reason"] for e in log.query(kind="action", limit=10)]
    assert reasons == ["engine main draining", "engine main admitting again"]
