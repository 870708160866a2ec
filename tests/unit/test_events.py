"""EventLog: append-only SQLite (WAL), survives reopen, strict JSON, thread-safe."""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest

from inferctl.controller.events import EventLog
from inferctl.controller.metrics import build_registry


def test_wal_mode_and_roundtrip(tmp_path):
    log = EventLog(tmp_path / "ev.db")
    assert log.journal_mode == "wal"
    eid = log.append("transition", "precision", "OOM fault: switch to int8", target="main",
                     severity="warning", inputs={"free_bytes": 43_578_491, "oom_total": 1},
                     outcome={"to": "int8"}, time=1700000000.5)
    [ev] = log.query()
    assert ev == {"id": eid, "time": 1700000000.5, "kind": "transition", "source": "precision",
                  "target": "main", "severity": "warning", "reason": "OOM fault: switch to int8",
                  "inputs": {"free_bytes": 43_578_491, "oom_total": 1}, "outcome": {"to": "int8"}}


def test_survives_reopen_and_ids_continue(tmp_path):
    path = tmp_path / "sub" / "ev.db"
    log = EventLog(path)
    first = [log.append("action", "operator", f"drain {i}", target="main") for i in range(3)]
    log.close()
    again = EventLog(path)
    assert [e["reason"] for e in again.query()] == ["drain 0", "drain 1", "drain 2"]
    nxt = again.append("action", "operator", "undrain", target="main")
    assert nxt == first[-1] + 1
    assert again.count() == 4


def test_update_and_delete_are_refused_by_triggers(tmp_path):
    path = tmp_path / "ev.db"
    log = EventLog(path)
    log.append("action", "operator", "drain", target="main")
    raw = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        raw.execute("UPDATE events SET reason = 'tampered'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        raw.execute("DELETE FROM events")
    raw.close()
    assert [e["reason"] for e in log.query()] == ["drain"]
    assert not hasattr(log, "update") and not hasattr(log, "delete")


def test_non_finite_values_become_null_and_json_is_strict(tmp_path):
    log = EventLog(tmp_path / "ev.db")
    log.append("observation", "engine:main", "ttft sample", inputs={"p99": float("nan"),
               "max": float("inf"), "vals": (1.5, float("-inf"))})
    raw = sqlite3.connect(tmp_path / "ev.db")
    stored = raw.execute("SELECT inputs FROM events").fetchone()[0]
    raw.close()
    # strict JSON: parse_constant is only called for NaN/Infinity literals
    parsed = json.loads(stored, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert parsed == {"max": None, "p99": None, "vals": [1.5, None]}


def test_query_filters_and_paging(tmp_path):
    log = EventLog(tmp_path / "ev.db")
    for i in range(10):
        log.append("action" if i % 2 else "transition", "p", f"e{i}", target=f"t{i % 3}")
    assert [e["reason"] for e in log.query(limit=3)] == ["e7", "e8", "e9"]
    assert [e["reason"] for e in log.query(since_id=2, limit=3)] == ["e2", "e3", "e4"]
    assert [e["reason"] for e in log.query(kind="action", limit=100)] == ["e1", "e3", "e5", "e7", "e9"]
    assert [e["reason"] for e in log.query(target="t0")] == ["e0", "e3", "e6", "e9"]
    assert log.query(since_id=10) == []
    assert log.last_id() == 10


@pytest.mark.parametrize("kwargs, field", [
    ({"limit": 0}, "limit"), ({"since_id": -1}, "since_id"), ({"kind": "bogus"}, "kind")])
def test_query_rejects_bad_arguments(tmp_path, kwargs, field):
    log = EventLog(tmp_path / "ev.db")
    with pytest.raises(ValueError, match=field):
        log.query(**kwargs)


def test_append_rejects_unknown_kind_and_severity(tmp_path):
    log = EventLog(tmp_path / "ev.db")
    with pytest.raises(ValueError, match="kind"):
        log.append("whatever", "p", "r")
    with pytest.raises(ValueError, match="severity"):
        log.append("action", "p", "r", severity="fatal")
    assert log.count() == 0


def test_events_total_metric_counts_by_kind(tmp_path):
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics)
    log.append("action", "p", "a")
    log.append("action", "p", "b")
    log.append("refusal", "p", "c")
    assert registry.get_sample_value("inferctl_events_total", {"kind": "action"}) == 2.0
    assert registry.get_sample_value("inferctl_events_total", {"kind": "refusal"}) == 1.0


def test_concurrent_appends_are_all_kept_with_unique_ids(tmp_path):
    log = EventLog(tmp_path / "ev.db")
    ids: list[int] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(50):
            eid = log.append("observation", f"w{n}", f"{n}-{i}")
            with lock:
                ids.append(eid)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 400
    assert log.count() == 400


def test_scan_pages_through_everything_oldest_first(tmp_path):
    log = EventLog(tmp_path / "scan.db")
    for i in range(11):
        log.append("observation" if i % 2 else "action", "src-a" if i < 6 else "src-b", f"e{i}")
    seen = [e["reason"] for e in log.scan(kind="observation", batch=2)]
    assert seen == ["e1", "e3", "e5", "e7", "e9"]
    assert [e["reason"] for e in log.scan(source="src-b", batch=3)] == ["e6", "e7", "e8", "e9", "e10"]
    assert len(list(log.scan(batch=1))) == 11
