"""Unit: the fleet drill's summary and verdict (tools/drill/fleet_report.py) and its plot."""

from __future__ import annotations

import pytest

from inferctl.tools.drill.fleet_plot import plot_fleet
from inferctl.tools.drill.fleet_report import FleetRequest, PhaseMark, share_over_time, started_on, summarize

T0 = 1000.0
MARKS = [PhaseMark("baseline", T0), PhaseMark("degrade", T0 + 10, "main-0"),
         PhaseMark("restart", T0 + 20, "main-1"), PhaseMark("kill", T0 + 30, "main-2")]


def req(rid, start, end, replica, ok=True, stream=False, started=None):
    return FleetRequest(rid, stream, T0 + start, None if end is None else T0 + end, ok,
                        stream and ok if started is None else started, replica, None if ok else "cut")


def clean():
    return [req(i, i, i + 0.5, f"main-{i % 3}") for i in range(36)]


def test_a_clean_run_is_ok_with_counts_by_phase_and_replica():
    s = summarize(clean(), MARKS, killed="main-2", t0=T0)
    assert s["ok"] and s["verdict"] == "ok"
    assert (s["requests"], s["failed"], s["lost"]) == (36, 0, 0)
    assert {p: v["requests"] for p, v in s["by_phase"].items()} == {"baseline": 10, "degrade": 10, "restart": 10,
                                                                      "kill": 6}
    assert s["by_replica"] == {"main-0": 12, "main-1": 12, "main-2": 12}
    assert s["killed_started_streams"] == 0
    assert [p["t"] for p in s["phases"]] == [0, 10, 20, 30]


def test_a_failure_in_the_restart_phase_fails_the_drill():
    rs = clean() + [req(100, 21, 22, "main-0", ok=False)]
    s = summarize(rs, MARKS, killed="main-2", t0=T0)
    assert not s["ok"] and s["by_phase"]["restart"]["failed"] == 1
    assert "1 request(s) failed in the restart phase" in s["verdict"]


def test_a_lost_request_fails_the_drill_and_counts_in_its_start_phase():
    rs = clean() + [req(100, 12, None, None)]
    s = summarize(rs, MARKS, killed="main-2", t0=T0)
    assert not s["ok"] and s["lost"] == 1 and s["by_phase"]["degrade"]["lost"] == 1
    assert s["answered"] == 36


def test_kill_failures_of_streams_the_killed_replica_had_started_are_allowed():
    cut = [req(100 + i, 29, 30.1, "main-2", ok=False, stream=True, started=True) for i in range(3)]
    rs = clean() + cut + [req(200, 29, 31, "main-0", stream=True)]   # in flight on another replica: fine
    s = summarize(rs, MARKS, killed="main-2", t0=T0)
    assert s["killed_started_streams"] == 3 and s["kill_failures_attributable"] == 3
    assert s["kill_failures_other"] == 0 and s["by_phase"]["kill"]["failed"] == 3
    assert s["ok"], s["verdict"]


@pytest.mark.parametrize("bad", [
    req(100, 31, 32, "main-0", ok=False, stream=True),     # started after the kill, another replica
    req(101, 29, 30.5, "main-0", ok=False),                  # in flight elsewhere, not a stream
    req(102, 29, 30.5, None, ok=False, stream=True),         # never got a header: not started by main-2
    req(103, 31, 32, "main-2", ok=False, stream=True),       # main-2 again after the kill (relaunched)
])
def test_any_other_kill_phase_failure_fails_the_drill(bad):
    s = summarize(clean() + [bad], MARKS, killed="main-2", t0=T0)
    assert not s["ok"] and s["kill_failures_other"] == 1 and s["kill_failures_attributable"] == 0


def test_started_on_counts_streams_in_flight_on_the_replica_at_the_instant():
    rs = [req(1, 1, 5, "main-2", stream=True), req(2, 1, 2, "main-2", stream=True),   # ended before
          req(3, 1, 5, "main-2"), req(4, 4, 6, "main-2", stream=True),                # not a stream / later
          req(5, 1, None, "main-2", stream=True, ok=False), req(6, 1, 5, "main-1", stream=True)]
    assert [r.rid for r in started_on(rs, "main-2", T0 + 3)] == [1, 5]


def test_missing_phases_are_named():
    s = summarize(clean()[:10], MARKS[:2], killed=None, t0=T0)
    assert not s["ok"] and "phase(s) not run: restart, kill" in s["verdict"]
    assert s["killed_started_streams"] is None


def test_share_over_time_bins_by_end_and_leaves_empty_bins_as_no_data():
    rs = [req(1, 0, 0.5, "a"), req(2, 0, 0.7, "a"), req(3, 0, 0.9, "b"), req(4, 2, 2.5, "b"),
          req(5, 0, None, None)]
    sh = share_over_time(rs, T0, 1.0)
    assert sh["t"] == [0.0, 1.0, 2.0]
    assert sh["counts"] == {"a": [2, 0, 0], "b": [1, 0, 1]}
    assert sh["replicas"]["a"] == [pytest.approx(2 / 3), None, 0.0]
    with pytest.raises(ValueError, match="bin_seconds"):
        share_over_time(rs, T0, 0)


def test_plot_writes_a_png(tmp_path):
    s = summarize(clean(), MARKS, killed="main-2", t0=T0)
    path = plot_fleet(s, tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
