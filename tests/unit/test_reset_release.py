"""Releasing a lost / isolated GPU (``Controller.release_gpu``): the rails forget the lost mark
(also after a restart, until a newer lost mark), the hardware policy goes back to HEALTHY, and
a GPU the source shows lost now is never released. Resets run against tests/fake_bin/nvidia-smi."""

from __future__ import annotations

import pytest

from inferctl.controller.operator import ReleaseRefused
from inferctl.controller.policies import HardwarePolicy
from inferctl.controller.reset import GpuResetter
from tests.controller_helpers import FakeClock, FakeEngineClient, FakeNvidiaSmi, StaticGpuSource, gpu, make_controller

RESET0 = ["--gpu-reset", "-i", "0"]


def _controller(tmp_path, src, hw=None):
    ctl, _, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src, clock=FakeClock())
    if hw is not None:
        ctl.gpu_policies["hardware"] = hw
    return ctl, log


def test_lost_then_release_allows_a_reset_again_and_survives_a_restart(tmp_path, monkeypatch):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"persistence": False}})
    src = StaticGpuSource({0: gpu(0, lost=True), 1: gpu(1)})
    ctl, log = _controller(tmp_path, src)
    ctl.tick()                                   # the loop tells the rails GPU 0 is lost
    assert ctl.resetter.state()["lost"] == [0]
    src.gpus[0] = gpu(0)                         # the node was rebooted: the GPU answers again
    refused = ctl.reset_gpu(0, actor="operator")
    assert refused.refused and "lost" in refused.message
    assert smi.calls() == []
    doc = ctl.release_gpu(0, actor="operator:alice")
    assert doc["ok"] is True and doc["target"] == "gpu:0"
    assert "lost mark cleared" in doc["message"]
    assert ctl.resetter.state()["lost"] == []
    ev = log.query(kind="action", target="gpu:0", limit=10)[-1]
    assert ev["id"] == doc["event_id"]
    assert ev["source"] == "operator:alice" and ev["outcome"] == {"gpu": 0, "released": True}
    # a restarted controller's rails honour the release (same event log)
    again = GpuResetter(gpu_source=src, event_log=log, verify_interval_seconds=0.0, sleep=lambda s: None)
    assert again.state()["lost"] == []
    out = again.reset(0, reason="after release")
    assert out.outcome == "success", out.message
    assert smi.calls().count(RESET0) == 1


def test_a_lost_mark_newer_than_the_release_wins_after_a_restart(tmp_path, monkeypatch):
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    ctl, log = _controller(tmp_path, src)
    ctl.resetter.mark_lost(0, "Xid 79")
    ctl.resetter.mark_lost(1, "Xid 79")
    ctl.release_gpu(0)
    assert ctl.resetter.state()["lost"] == [1]
    assert GpuResetter(gpu_source=src, event_log=log).state()["lost"] == [1]
    assert ctl.resetter.mark_lost(0, "Xid 79 again") is True     # seen lost again after the release
    restarted = GpuResetter(gpu_source=src, event_log=log)
    assert restarted.state()["lost"] == [0, 1]
    assert restarted.reset(0, reason="t").outcome == "refused"


def test_release_is_refused_when_nothing_is_lost_or_isolated(tmp_path, monkeypatch):
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    ctl, log = _controller(tmp_path, src, HardwarePolicy())
    ctl.tick()
    with pytest.raises(ReleaseRefused, match="GPU 1 is neither isolated.*nor marked lost"):
        ctl.release_gpu(1)
    assert [e for e in log.query(kind="action", limit=100) if e["outcome"].get("released")] == []
    with pytest.raises(ValueError, match="gpu: must be a non-negative integer"):
        ctl.release_gpu(-1)


def test_release_is_refused_while_the_source_shows_the_gpu_lost(tmp_path, monkeypatch):
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0, lost=True), 1: gpu(1)})
    hw = HardwarePolicy()
    ctl, log = _controller(tmp_path, src, hw)
    ctl.tick()
    uuid = src.gpus[0].uuid
    assert hw.gpu_state(uuid) == "isolated" and ctl.resetter.state()["lost"] == [0]
    with pytest.raises(ReleaseRefused, match="GPU 0 .* is lost now .*fell off the bus"):
        ctl.release_gpu(0)
    src.gpus[0] = gpu(0)
    src.gpus[0].health = "lost"
    with pytest.raises(ReleaseRefused, match="is lost now"):
        ctl.release_gpu(0)
    src.ok = False
    with pytest.raises(ReleaseRefused, match="telemetry is down"):
        ctl.release_gpu(0)
    assert hw.gpu_state(uuid) == "isolated" and ctl.resetter.state()["lost"] == [0]


def test_release_returns_an_isolated_gpu_to_healthy_with_its_history_cleared(tmp_path, monkeypatch):
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0, lost=True), 1: gpu(1)})
    hw = HardwarePolicy()
    ctl, log = _controller(tmp_path, src, hw)
    ctl.tick()
    uuid = src.gpus[0].uuid
    src.gpus[0] = gpu(0)
    doc = ctl.release_gpu(0, actor="operator")
    assert hw.gpu_state(uuid) == "healthy"
    assert hw.state()["gpus"][uuid]["last_reset"] is None
    assert [(d["from_state"], d["to_state"]) for d in doc["decisions"]] == [("isolated", "healthy")]
    trans = [e for e in log.query(kind="transition", limit=100) if e["source"] == "hardware"]
    assert (trans[-1]["outcome"]["from"], trans[-1]["outcome"]["to"]) == ("isolated", "healthy")
    ctl.tick()                                   # the healthy reading keeps it healthy
    assert hw.gpu_state(uuid) == "healthy"
    with pytest.raises(ReleaseRefused, match="nothing to release"):
        ctl.release_gpu(0)
