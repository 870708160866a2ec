"""Controller HTTP API: auth (401), strict bodies (400 naming the field), 404, actions, events."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from inferctl.controller.api import create_app
from tests.controller_helpers import (FakeClock, FakeEngineClient, FakeNvidiaSmi, StaticGpuSource, api_setup,
                                      gpu, make_controller, strict_json)

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def setup(tmp_path):
    return api_setup(tmp_path, TOKEN)


def strict(resp):
    return strict_json(resp.text)


@pytest.mark.parametrize("path, body", [
    ("/actions/degrade", {"engine": "main"}), ("/actions/rollback", {"engine": "main"}),
    ("/actions/drain", {"engine": "main"}), ("/actions/undrain", {"engine": "main"}),
    ("/actions/restart", {"engine": "main"}), ("/actions/unpin", {"engine": "main"}),
    ("/actions/reset-gpu", {"gpu": 0, "dry_run": True})])
def test_actions_need_the_bearer_token(setup, path, body):
    http, _, client, _ = setup
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": "Bearer"}):
        r = http.post(path, json=body, headers=headers)
        assert r.status_code == 401, (path, headers)
        assert r.headers["www-authenticate"] == "Bearer"
        assert strict(r)["error"]["code"] == "unauthorized"
    # auth is checked before the body: a bad body without a token is still 401
    assert http.post(path, content=b"{not json", headers={}).status_code == 401
    assert client.calls == []


def test_degrade_with_token_switches_the_engine(setup):
    http, ctl, client, log = setup
    r = http.post("/actions/degrade", json={"engine": "main"}, headers=AUTH)
    assert r.status_code == 200, r.text
    doc = strict(r)
    assert doc["ok"] is True and doc["target"] == "main" and doc["details"]["mode"] == "int8"
    assert client.precision == "int8"
    ev = [e for e in log.query(kind="action") if e["id"] == doc["event_id"]][0]
    assert ev["source"] == "operator" and ev["outcome"]["confirmed"] is True


@pytest.mark.parametrize("content, field", [
    (b'{"engine": "main", "extra": 1}', "extra"),
    (b'{"engine": 5}', "engine"),
    (b'{}', "engine"),
    (b'[1, 2]', "body"),
    (b'{"engine": NaN}', "body"),
    (b'{"engine": "main"', "body"),
])
def test_bad_bodies_are_400_naming_the_field(setup, content, field):
    http, _, client, _ = setup
    r = http.post("/actions/drain", content=content, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = strict(r)["error"]
    assert err["field"] == field and err["message"].startswith(field)
    assert client.calls == []


@pytest.mark.parametrize("body, field", [({"gpu": "0"}, "gpu"), ({"gpu": 0, "dry_run": "yes"}, "dry_run"),
                                         ({"gpu": -1}, "gpu"), ({"gpu": 1.5}, "gpu")])
def test_reset_body_is_strict(setup, body, field):
    http, *_ = setup
    r = http.post("/actions/reset-gpu", json=body, headers=AUTH)
    assert r.status_code == 400 and strict(r)["error"]["field"] == field


def test_unknown_engine_is_404(setup):
    http, *_ = setup
    r = http.post("/actions/drain", json={"engine": "ghost"}, headers=AUTH)
    assert r.status_code == 404
    assert "ghost" in strict(r)["error"]["message"] and "main" in strict(r)["error"]["message"]


def test_restart_of_an_engine_we_did_not_launch_is_409(setup):
    http, *_ = setup
    r = http.post("/actions/restart", json={"engine": "main"}, headers=AUTH)
    assert r.status_code == 409 and strict(r)["refused"] is True


def test_reset_gpu_outcomes_map_to_status_codes(tmp_path, monkeypatch):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"mode": "in_use"}, 1: {}, 2: {}})
    src = StaticGpuSource({0: gpu(0), 1: gpu(1), 2: gpu(2, lost=True)})
    ctl, _, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src, clock=FakeClock())
    ctl.tick()
    http = TestClient(create_app(ctl, TOKEN))
    dry = http.post("/actions/reset-gpu", json={"gpu": 1, "dry_run": True}, headers=AUTH)
    assert dry.status_code == 200 and strict(dry)["details"]["outcome"] == "dry_run"
    assert smi.calls() == []
    ok = http.post("/actions/reset-gpu", json={"gpu": 1}, headers=AUTH)
    assert ok.status_code == 200 and strict(ok)["details"]["outcome"] == "success"
    failed = http.post("/actions/reset-gpu", json={"gpu": 0}, headers=AUTH)
    assert failed.status_code == 502 and "in use" in strict(failed)["message"]
    lost = http.post("/actions/reset-gpu", json={"gpu": 2}, headers=AUTH)
    assert lost.status_code == 409 and strict(lost)["details"]["escalated"] is True
    assert not any(c[:3] == ["--gpu-reset", "-i", "2"] for c in smi.calls())


def test_events_endpoint_and_parameter_errors(setup):
    http, ctl, _, log = setup
    for i in range(5):
        log.append("action", "test", f"e{i}")
    r = http.get("/events", params={"limit": 2})
    assert r.status_code == 200
    doc = strict(r)
    assert [e["reason"] for e in doc["events"]] == ["e3", "e4"]
    first = doc["events"][0]["id"]
    r = http.get("/events", params={"since_id": first, "kind": "action"})
    assert [e["reason"] for e in strict(r)["events"]] == ["e4"]
    for params, field in (({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"limit": "x"}, "limit"),
                          ({"since_id": -1}, "since_id"), ({"since_id": "abc"}, "since_id"),
                          ({"kind": "nope"}, "kind")):
        r = http.get("/events", params=params)
        assert r.status_code == 400, params
        assert strict(r)["error"]["field"] == field
    assert http.get("/events", params={"limit": 1000}).status_code == 200


def test_status_metrics_health_are_open_and_strict(setup):
    http, *_ = setup
    st = strict(http.get("/status"))
    assert st["engines"]["main"]["precision"] == "full"
    assert st["engines"]["main"]["policies"]["precision"]["state"] == "full"
    m = http.get("/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    assert 'inferctl_precision_mode{engine="main",mode="full"} 1.0' in m.text
    assert strict(http.get("/health")) == {"status": "ok"}
    assert http.get("/nope").status_code == 404


def test_unpin_when_not_pinned_is_409(setup):
    http, *_ = setup
    r = http.post("/actions/unpin", json={"engine": "main"}, headers=AUTH)
    assert r.status_code == 409 and "not pinned" in strict(r)["error"]["message"]


def test_empty_token_is_refused(setup):
    _, ctl, _, _ = setup
    with pytest.raises(ValueError, match="admin_token"):
        create_app(ctl, "")
