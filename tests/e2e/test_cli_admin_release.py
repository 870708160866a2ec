"""``inferctl release-gpu N`` against a running controller (real uvicorn on a free port)."""

from __future__ import annotations

import pytest

from tests.controller_helpers import FakeClock, FakeEngineClient, FakeNvidiaSmi, StaticGpuSource, gpu, make_controller
from tests.e2e.test_cli_admin import TOKEN, Served, run


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.delenv("INFERCTL_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("INFERCTL_URL", raising=False)
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    ctl, _, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src, clock=FakeClock())
    ctl.tick()
    ctl.resetter.mark_lost(0, "Xid 79")
    with Served(ctl) as s:
        yield s, ctl, src


def test_release_gpu_asks_and_releases(served):
    s, ctl, src = served
    r = run("release-gpu", "0", "--url", s.url, "--token", TOKEN, input="n\n")
    assert r.exit_code == 1 and "aborted: nothing done" in r.output
    r = run("release-gpu", "0", "--url", s.url, "--token", TOKEN)           # no stdin: no release
    assert r.exit_code == 1 and "aborted" in r.output
    assert ctl.resetter.state()["lost"] == [0]
    r = run("release-gpu", "1", "--url", s.url, "--token", TOKEN, "--yes")
    assert r.exit_code == 1 and "nothing to release (HTTP 409)" in r.output
    r = run("release-gpu", "0", "--url", s.url, "--yes")
    assert r.exit_code == 1 and "admin token is required" in r.output
    r = run("release-gpu", "0", "--url", s.url, "--token", TOKEN, input="y\n")
    assert r.exit_code == 0, r.output
    assert "ok: GPU 0" in r.output and "lost mark cleared" in r.output and "(event #" in r.output
    assert ctl.resetter.state()["lost"] == []


def test_release_gpu_refused_while_lost_now(served):
    s, ctl, src = served
    src.gpus[0] = gpu(0, lost=True)
    r = run("release-gpu", "0", "--url", s.url, "--token", TOKEN, "-y")
    assert r.exit_code == 1 and "is lost now" in r.output and "Traceback" not in r.output
    assert ctl.resetter.state()["lost"] == [0]
