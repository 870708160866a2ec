"""``POST /actions/release-gpu``: bearer token (401), strict body (400 naming ``gpu``), 409
when there is nothing to release or the source shows the GPU lost now, 200 with the event."""

from __future__ import annotations

from fastapi.testclient import TestClient

from inferctl.controller.api import create_app
from tests.controller_helpers import (FakeClock, FakeEngineClient, FakeNvidiaSmi, StaticGpuSource, gpu,
                                      make_controller, strict_json)

TOKEN = "t0ken-for-release"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_release_gpu_endpoint(tmp_path, monkeypatch):
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0, lost=True), 1: gpu(1)})
    ctl, _, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src, clock=FakeClock())
    ctl.tick()
    http = TestClient(create_app(ctl, TOKEN))
    r = http.post("/actions/release-gpu", json={"gpu": 0})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    for body in ({"gpu": "0"}, {"gpu": -1}, {"gpu": 0, "force": True}, {}, {"gpu": 1.5}):
        r = http.post("/actions/release-gpu", json=body, headers=AUTH)
        assert r.status_code == 400, body
        assert strict_json(r.text)["error"]["field"] in ("gpu", "force"), body
    assert strict_json(http.post("/actions/release-gpu", json={"gpu": -1}, headers=AUTH).text)[
        "error"]["message"] == "gpu: must be 0..999, got -1"
    r = http.post("/actions/release-gpu", json={"gpu": 1}, headers=AUTH)      # not lost, not isolated
    assert r.status_code == 409 and "nothing to release" in strict_json(r.text)["error"]["message"]
    r = http.post("/actions/release-gpu", json={"gpu": 0}, headers=AUTH)      # still lost in the source
    assert r.status_code == 409 and "is lost now" in strict_json(r.text)["error"]["message"]
    assert ctl.resetter.state()["lost"] == [0]
    src.gpus[0] = gpu(0)
    r = http.post("/actions/release-gpu", json={"gpu": 0}, headers={**AUTH, "X-Inferctl-Actor": "bob"})
    doc = strict_json(r.text)
    assert r.status_code == 200 and doc["ok"] is True and doc["refused"] is False
    assert ctl.resetter.state()["lost"] == []
    ev = [e for e in log.query(kind="action", limit=100) if e["id"] == doc["event_id"]][0]
    assert ev["source"] == "operator:bob" and ev["outcome"] == {"gpu": 0, "released": True}
