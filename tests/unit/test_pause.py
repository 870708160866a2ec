"""Issue 10 item 12: the operator stays in charge. `inferctl pause|resume` (POST
/actions/pause|resume) and maintenance windows: decisions are still computed and logged as
"would have acted", actions are not executed; metrics; who acted is named."""

from __future__ import annotations

import datetime as dt

import pytest

from inferctl.controller.config import ConfigError, MaintenanceWindow, parse_config
from inferctl.controller.pause import PauseBoard, PauseError, decision_scopes
from tests.controller_helpers import FakeClock, FakeEngineClient, api_setup, make_controller

GIB = 1 << 30
AUTH = {"Authorization": "Bearer t0ken-t0ken-t0ken-1"}


def _oom(fid: int, t: float) -> dict:
    return {"id": fid, "time": t, "kind": "exhaustion", "requested_bytes": 2 * GIB, "free_bytes": GIB,
            "message": "CUDA out of memory.", "precision": "full"}


def test_board_scopes_and_gate():
    clock = FakeClock()
    b = PauseBoard(clock=clock)
    assert b.gate(["engine:a"]) is None
    b.pause("gpu:1", "swap fans", "operator:bob")
    assert b.gate(["engine:a", "gpu:0"]) is None
    assert b.gate(decision_scopes("a", {"a": 1}, None)).scope == "gpu:1"     # engine a runs on GPU 1
    assert b.gate(decision_scopes("GPU-xyz", {"a": 1}, 1)).actor == "operator:bob"
    with pytest.raises(PauseError, match="scope"):
        b.pause("engine a", "x", "operator")
    with pytest.raises(PauseError, match="reason"):
        b.pause("all", "  ", "operator")
    with pytest.raises(PauseError, match="not paused"):
        b.resume("all", "operator")
    clock.advance(30)
    assert b.state()["pauses"][0]["paused_seconds"] == 30.0
    assert b.resume("gpu:1", "operator:bob").reason == "swap fans" and b.state()["paused"] is False


def test_maintenance_windows_absolute_and_weekly():
    w = MaintenanceWindow(scope="engine:main", reason="upgrade", start="2026-03-01T02:00:00Z",
                          end="2026-03-01T04:00:00Z")
    t = dt.datetime(2026, 3, 1, 3, 0, tzinfo=dt.timezone.utc).timestamp()
    assert w.active(t) and not w.active(t + 3600) and w.began(t) == t - 3600
    # Saturday 23:00 -> 01:00: Sunday 00:30 is inside, Sunday 23:30 is not
    weekly = MaintenanceWindow(reason="backup", days=["sat"], from_time="23:00", to_time="01:00")
    sat = dt.datetime(2026, 3, 7, 23, 30, tzinfo=dt.timezone.utc).timestamp()    # a Saturday
    assert weekly.active(sat) and weekly.active(sat + 3600) and not weekly.active(sat + 86400)
    assert weekly.began(sat + 3600) == sat - 1800
    with pytest.raises(ConfigError, match="maintenance.0"):
        parse_config({"maintenance": [{"reason": "x", "start": "2026-03-01T02:00:00Z", "end": "2026-03-01T01:00:00Z"}]})
    with pytest.raises(ConfigError, match=r"maintenance\[0\]\.scope"):
        parse_config({"maintenance": [{"reason": "x", "scope": "node:1", "days": ["mon"],
                                       "from_time": "01:00", "to_time": "02:00"}]})
    with pytest.raises(ConfigError, match="from_time"):
        parse_config({"maintenance": [{"reason": "x", "days": ["mon"], "from_time": "25:00", "to_time": "02:00"}]})


def test_paused_oom_is_would_have_acted_then_resume_acts(tmp_path):
    clock = FakeClock()
    client = FakeEngineClient()
    ctl, registry, log = make_controller(tmp_path, {"main": client}, clock=clock)
    ctl.tick()
    doc = ctl.pause("all", "load test", "operator:alice")
    assert doc["ok"] and "operator:alice" in doc["message"]
    client.faults = [_oom(1, clock())]
    ctl.tick()
    ctl.wait_for_actions(10)
    assert ("precision", "int8") not in client.calls                      # not executed
    [ev] = [e for e in log.query(kind="refusal", limit=10) if (e["inputs"] or {}).get("would_have_acted")]
    assert ev["source"] == "precision" and ev["outcome"] == {"action": "degrade", "executed": False}
    assert ev["inputs"]["paused_by"] == "operator:alice" and "would have acted: degrade" in ev["reason"]
    assert registry.get_sample_value("inferctl_automation_would_have_acted_total",
                                     {"policy": "precision", "action": "degrade"}) == 1.0
    assert ctl.status()["engines"]["main"]["policies"]["precision"]["state"] == "full"   # follows reality
    clock.advance(120)
    assert registry.get_sample_value("inferctl_automation_paused", {"scope": "all", "source": "operator"}) == 1.0
    assert registry.get_sample_value("inferctl_automation_paused_seconds",
                                     {"scope": "all", "source": "operator"}) == 120.0
    pause_ev = [e for e in log.query(kind="action", limit=10) if (e["outcome"] or {}).get("action") == "pause"]
    assert pause_ev[0]["source"] == "operator:alice"
    ctl.resume("all", "operator:alice")
    assert registry.get_sample_value("inferctl_automation_paused", {"scope": "all", "source": "operator"}) is None
    client.faults = [_oom(1, clock() - 120), _oom(2, clock())]
    ctl.tick()
    ctl.wait_for_actions(10)
    assert ("precision", "int8") in client.calls                          # acts again


def test_paused_engine_scope_leaves_other_engines_automatic(tmp_path):
    clock = FakeClock()
    a, b = FakeEngineClient("a"), FakeEngineClient("b")
    ctl, _, _ = make_controller(tmp_path, {"a": a, "b": b}, clock=clock)
    ctl.tick()
    ctl.pause("engine:a", "debugging", "operator")
    a.faults, b.faults = [_oom(1, clock())], [_oom(1, clock())]
    ctl.tick()
    ctl.wait_for_actions(10)
    assert ("precision", "int8") not in a.calls and ("precision", "int8") in b.calls


def test_maintenance_window_pauses_automation(tmp_path):
    clock = FakeClock(dt.datetime(2026, 3, 1, 3, 0, tzinfo=dt.timezone.utc).timestamp())
    client = FakeEngineClient()
    ctl, registry, log = make_controller(tmp_path, {"main": client}, clock=clock)
    ctl.pause_board.windows.append(MaintenanceWindow(reason="driver upgrade", start="2026-03-01T02:00:00Z",
                                                     end="2026-03-01T04:00:00Z"))
    ctl.tick()
    client.faults = [_oom(1, clock())]
    ctl.tick()
    ctl.wait_for_actions(10)
    assert ("precision", "int8") not in client.calls
    auto = ctl.status()["automation"]
    assert auto["paused"] is True and auto["pauses"][0]["source"] == "maintenance"
    assert auto["pauses"][0]["paused_seconds"] == 3600.0


def test_api_pause_resume_names_the_operator(tmp_path):
    http, ctl, client, log = api_setup(tmp_path, "t0ken-t0ken-t0ken-1")
    assert http.post("/actions/pause", json={"reason": "x"}).status_code == 401
    r = http.post("/actions/pause", json={"reason": "fan swap", "gpu": 0},
                  headers={**AUTH, "X-Inferctl-Actor": "carol"})
    assert r.status_code == 200 and r.json()["target"] == "gpu:0"
    st = http.get("/status").json()["automation"]
    assert st["pauses"][0]["actor"] == "operator:carol" and st["pauses"][0]["scope"] == "gpu:0"
    r = http.post("/actions/pause", json={"reason": "x", "engine": "nope"}, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["field"] == "engine"
    r = http.post("/actions/pause", json={"reason": "x", "engine": "main", "gpu": 0}, headers=AUTH)
    assert r.status_code == 400
    r = http.post("/actions/pause", json={"engine": "main"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["field"] == "reason"
    assert http.post("/actions/resume", json={"gpu": 0}, headers=AUTH).status_code == 200
    r = http.post("/actions/resume", json={"gpu": 0}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_paused"
    sources = {e["source"] for e in log.query(kind="action", limit=20)}
    assert {"operator:carol", "operator"} <= sources


def test_api_pause_refuses_an_unknown_gpu_and_a_reason_that_is_not_a_sentence(tmp_path):
    """A pause of a GPU the controller does not know is a 404 naming ``gpu`` (it made a metric
    series per number before); the reason is at most 1,024 characters, without control
    characters (they came back in messages and events)."""
    http, ctl, client, log = api_setup(tmp_path, "t0ken-t0ken-t0ken-1")
    known = ctl.state.known_gpu_indices()
    assert 0 in known and 99 not in known
    r = http.post("/actions/pause", json={"reason": "x", "gpu": 99}, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["field"] == "gpu" and "99" in r.json()["error"]["message"]
    r = http.post("/actions/pause", json={"reason": "r" * 1025}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["field"] == "reason" and "1024" in r.json()["error"]["message"]
    r = http.post("/actions/pause", json={"reason": "a\nb\u0000c"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["field"] == "reason"
    assert http.post("/actions/pause", json={"reason": "r" * 1024, "gpu": 0}, headers=AUTH).status_code == 200
    assert http.get("/status").json()["automation"]["pauses"][0]["scope"] == "gpu:0"


def test_an_operator_pause_survives_a_controller_restart(tmp_path):
    """A restart must not silently resume automation an operator paused: the new controller
    rebuilds the pause from the event log (same scope, reason, actor and start) and keeps
    refusing automatic actions until ``resume``."""
    clock = FakeClock()
    ctl, _, log = make_controller(tmp_path, {"main": FakeEngineClient()}, clock=clock)
    ctl.pause("all", "vendor maintenance", "operator:alice")
    ctl.pause("engine:main", "debugging", "operator:bob")
    since = clock()
    clock.advance(30)
    ctl.resume("engine:main", "operator:bob")
    log.close()
    clock.advance(30)
    client = FakeEngineClient()
    ctl2, registry, log2 = make_controller(tmp_path, {"main": client}, clock=clock)
    [p] = ctl2.status()["automation"]["pauses"]
    assert (p["scope"], p["reason"], p["actor"], p["since"]) == ("all", "vendor maintenance", "operator:alice", since)
    assert registry.get_sample_value("inferctl_automation_paused_seconds",
                                     {"scope": "all", "source": "operator"}) == 60.0
    ctl2.tick()
    client.faults = [_oom(1, clock())]
    ctl2.tick()
    ctl2.wait_for_actions(10)
    assert ("precision", "int8") not in client.calls            # still paused after the restart
    ctl2.resume("all", "operator:alice")
    assert ctl2.status()["automation"]["paused"] is False
