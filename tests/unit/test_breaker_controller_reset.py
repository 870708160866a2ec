"""Breaking the GPU reset rails and the hardware path: concurrent resets (only one runs, and a
refused one touches no engine), a dry run that must not look like a reset, Xid events counted
once as the hardware policy sees them."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from inferctl.controller.actions import Actions
from inferctl.controller.api import create_app
from inferctl.controller.events import EventLog
from inferctl.controller.metrics import build_registry
from inferctl.controller.policies import HardwarePolicy
from inferctl.controller.reset import GpuResetter
from inferctl.controller.types import XidEvent
from tests.controller_helpers import (FakeEngineClient, FakeNvidiaSmi, StaticGpuSource, gpu, make_controller,
                                      run_until)

RESET = ["--gpu-reset", "-i", "0"]


class SlowSupervisor:
    """An EngineSupervisor double whose stop takes a while (SIGTERM grace), recording whether a
    GPU reset was running each time the engine is started again."""

    def __init__(self, resetter_ref: dict, stop_seconds: float = 0.3) -> None:
        self.resetter_ref = resetter_ref
        self.stop_seconds = stop_seconds
        self.running = True
        self.pid = 4242
        self.stops = 0
        self.restarts_during_reset: list[bool] = []
        self.smi_running = threading.Event()

    def stop(self) -> int:
        self.stops += 1
        time.sleep(self.stop_seconds)
        self.running = False
        return 0

    def restart(self) -> None:
        self.restarts_during_reset.append(self.smi_running.is_set())
        self.running = True


def test_a_concurrent_reset_is_refused_before_it_drains_or_restarts_anything(tmp_path, monkeypatch):
    """Two operators reset GPU 0 at once while its engine takes a while to stop: exactly one
    reset runs; the other is refused up front — it neither drains nor stops the engine, and it
    never starts the engine again while the first one's nvidia-smi --gpu-reset runs."""
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"mode": "hang", "hang_seconds": 0.8, "persistence": False}})
    log = EventLog(tmp_path / "ev.db")
    src = StaticGpuSource({0: gpu(0, persistence=False)})
    registry, metrics = build_registry()
    ref: dict = {}
    sup = SlowSupervisor(ref)
    resetter = GpuResetter(gpu_source=src, event_log=log, metrics=metrics, verify_interval_seconds=0.0,
                           allowed_pids=lambda: [sup.pid])
    client = FakeEngineClient()
    acts = Actions({"main": client}, {"main": sup}, resetter, log, metrics, engine_gpus={"main": 0},
                   drain_timeout_seconds=2.0, poll_interval_seconds=0.01)

    # mark the window in which nvidia-smi --gpu-reset runs
    real_cmd = None
    from inferctl.controller import reset as reset_mod
    real_cmd = reset_mod._Run.cmd

    def cmd(run, name, argv):
        if name == "reset":
            sup.smi_running.set()
            try:
                return real_cmd(run, name, argv)
            finally:
                sup.smi_running.clear()
        return real_cmd(run, name, argv)
    monkeypatch.setattr(reset_mod._Run, "cmd", cmd)

    from inferctl.controller.types import Decision
    results: dict[str, object] = {}

    def go(who: str, delay: float) -> None:
        time.sleep(delay)
        results[who] = acts.execute(Decision(who, "gpu:0", "reset_gpu", None, None, f"reset by {who}", {}))

    threads = [threading.Thread(target=go, args=("alice", 0.0)), threading.Thread(target=go, args=("bob", 0.1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    alice, bob = results["alice"], results["bob"]
    assert alice.ok and alice.details["outcome"] == "success", alice.message
    assert bob.refused and "one reset at a time" in bob.message
    assert bob.details["stopped_engines"] == [] and bob.details["restarted_engines"] == []
    assert sum(1 for c in smi.calls() if c == RESET) == 1
    assert sup.stops == 1
    assert sup.restarts_during_reset == [False]          # restarted once, after the reset
    assert client.calls.count(("drain", True)) == 1
    refusal = [e for e in log.query(kind="refusal") if e["inputs"]["actor"] == "bob"]
    assert len(refusal) == 1 and "one reset at a time" in refusal[0]["reason"]
    assert registry.get_sample_value("inferctl_gpu_resets_total", {"gpu": "0", "outcome": "refused"}) == 1.0


def test_concurrent_api_resets_run_one_and_refuse_the_rest(tmp_path, monkeypatch):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"mode": "hang", "hang_seconds": 0.5, "persistence": False},
                                                1: {}})
    src = StaticGpuSource({0: gpu(0, persistence=False), 1: gpu(1)})
    ctl, registry, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src)
    ctl.tick()
    http = TestClient(create_app(ctl, "tok"))
    codes: list[tuple[int, str]] = []
    lock = threading.Lock()

    def post() -> None:
        r = http.post("/actions/reset-gpu", json={"gpu": 0}, headers={"Authorization": "Bearer tok"})
        with lock:
            codes.append((r.status_code, r.json()["message"]))
    threads = [threading.Thread(target=post) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ok = [c for c in codes if c[0] == 200]
    refused = [c for c in codes if c[0] == 409]
    assert len(ok) == 1 and len(refused) == 5, codes
    assert all("one reset at a time" in m or "retry in" in m for _, m in refused), refused
    assert sum(1 for c in smi.calls() if c == RESET) == 1
    actions = [e for e in log.query(kind="action", limit=100) if e["source"] == "operator"]
    assert len(actions) == 6                              # every call is an event


def test_verification_does_not_count_an_impossible_memory_reading_as_readable(tmp_path, monkeypatch):
    FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"persistence": False}})
    log = EventLog(tmp_path / "ev.db")
    src = StaticGpuSource({0: gpu(0, persistence=False)})
    src.gpus[0].memory_total_bytes = "abc"
    r = GpuResetter(gpu_source=src, event_log=log, verify_interval_seconds=0.0, sleep=lambda s: None)
    out = r.reset(0, reason="t")
    assert out.outcome == "failed" and "memory not readable" in out.message
    assert src.gpus[0].memory_total_bytes == "abc"        # the source's own object is left alone


# --------------------------------------------------------------------------- hardware + loop
def xid(src, index: int, code: int, t: float, text: str = "") -> None:
    src.gpus[index].xid_events = [XidEvent(xid=code, pci_bus_id=src.gpus[index].pci_bus_id,
                                           message=text or f"NVRM: Xid (PCI:{src.gpus[index].pci_bus_id}): {code}",
                                           time=t)]


def test_dry_run_reset_leaves_the_hardware_state_machine_where_it_was(tmp_path, monkeypatch):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    client = FakeEngineClient()
    hw = HardwarePolicy(config={"verify_seconds": 2, "drain_timeout_seconds": 30, "reset_timeout_seconds": 5},
                        gpu_engines={"0": ["main"]})
    ctl, registry, log = make_controller(tmp_path, {"main": client}, gpu_source=src,
                                         resetter_opts={"dry_run": True})
    ctl.gpu_policies["hardware"] = hw
    t0 = time.time()
    ctl.tick(t0)
    xid(src, 0, 48, t0 + 0.5)
    uuid = src.gpus[0].uuid
    t = run_until(ctl, lambda: any(e["inputs"].get("outcome") == "dry_run"
                                   for e in log.query(kind="observation", limit=200)), t0, n=25)
    src.gpus[0].xid_events = []
    assert hw.gpu_state(uuid) == "resetting"
    assert smi.calls() == []
    [dry] = [e for e in log.query(kind="observation", limit=200) if e["inputs"].get("outcome") == "dry_run"]
    assert dry["source"] == "hardware" and dry["target"] == uuid and "dry run" in dry["reason"]
    # time passes: no VERIFYING, no HEALTHY-with-undrain, no isolation for a missing result
    for _ in range(12):
        t += 1.0
        ctl.tick(t)
        ctl.wait_for_actions(10)
    assert hw.gpu_state(uuid) == "resetting"
    assert ("drain", False) not in client.calls
    assert hw.state()["gpus"][uuid]["last_reset"] is None
    assert not [e for e in log.query(kind="transition", limit=200) if e["outcome"]["to"] in ("verifying", "isolated")]
    assert registry.get_sample_value("inferctl_gpu_resets_total", {"gpu": "0", "outcome": "dry_run"}) == 1.0
    assert registry.get_sample_value("inferctl_gpu_resets_total", {"gpu": "0", "outcome": "success"}) == 0.0


def test_xid_events_are_counted_once_by_gpu_xid_and_action(tmp_path, monkeypatch):
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    hw = HardwarePolicy(gpu_engines={"0": ["main"]})
    ctl, registry, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src)
    ctl.gpu_policies["hardware"] = hw
    t0 = time.time()
    ctl.tick(t0)
    v = registry.get_sample_value
    xid(src, 1, 43, t0 + 0.5)                     # ignore-class, on GPU 1
    ctl.tick(t0 + 1)
    ctl.tick(t0 + 2)                              # the same report polled again: one event
    assert v("inferctl_gpu_xid_events_total", {"gpu": "1", "xid": "43", "action": "ignore"}) == 1.0
    xid(src, 1, 43, t0 + 60)                      # the same code a minute later: a new event
    ctl.tick(t0 + 61)
    assert v("inferctl_gpu_xid_events_total", {"gpu": "1", "xid": "43", "action": "ignore"}) == 2.0
    # F09: a GPU that fell off the bus, reported by two kernel lines: one Xid 79 event
    src.gpus[1].xid_events = [
        XidEvent(xid=79, pci_bus_id=src.gpus[1].pci_bus_id, message="GPU has fallen off the bus.", time=t0 + 70,
                 lost=True),
        XidEvent(xid=None, pci_bus_id=src.gpus[1].pci_bus_id, message="GPU has fallen off the bus.", time=t0 + 70.2,
                 lost=True)]
    ctl.tick(t0 + 71)
    ctl.wait_for_actions(10)
    assert v("inferctl_gpu_xid_events_total", {"gpu": "1", "xid": "79", "action": "reboot_node"}) == 1.0
    assert v("inferctl_gpu_xid_events_total", {"gpu": "0", "xid": "43", "action": "ignore"}) is None
    text = __import__("prometheus_client").generate_latest(registry).decode()
    assert text.count("inferctl_gpu_xid_events_total{") == 2


@pytest.mark.parametrize("with_policy", [True, False], ids=["hardware-policy", "no-hardware-policy"])
def test_a_gpu_seen_lost_once_is_never_reset_even_when_the_source_forgets(tmp_path, monkeypatch, with_policy):
    """NVML delivers an Xid 79 event once; the device may still answer the next polls. The
    rails poll the source at reset time and would see a healthy GPU: they must remember."""
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    ctl, registry, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src)
    if with_policy:
        ctl.gpu_policies["hardware"] = HardwarePolicy(gpu_engines={"1": ["main"]})
    t0 = time.time()
    ctl.tick(t0)
    src.gpus[1].xid_events = [XidEvent(xid=79, pci_bus_id=src.gpus[1].pci_bus_id,
                                       message="Xid 79 reported by NVML event",
                                       time=t0 + 1, source="nvml", lost=True)]
    ctl.tick(t0 + 1)
    ctl.wait_for_actions(10)
    src.gpus[1].xid_events = []                      # delivered once; the GPU still answers
    ctl.tick(t0 + 2)
    res = ctl.reset_gpu(1)
    assert res.refused and "lost" in res.message, res.message
    assert not any(c[:1] == ["--gpu-reset"] for c in smi.calls())
    assert ctl.status()["rails"]["lost"] == [1]
    # a controller restart reads it back from the event log
    again = GpuResetter(gpu_source=src, event_log=log)
    assert again.state()["lost"] == [1]


def test_a_gpu_whose_source_says_health_lost_is_refused(tmp_path, monkeypatch):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0)})
    src.gpus[0].health = "Lost"
    log = EventLog(tmp_path / "ev.db")
    out = GpuResetter(gpu_source=src, event_log=log, verify_interval_seconds=0.0).reset(0, reason="t")
    assert out.outcome == "refused" and "lost" in out.message and out.escalated
    assert smi.calls() == []


def test_a_lost_gpu_reported_by_an_engine_is_remembered_by_the_rails(tmp_path, monkeypatch):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    ctl, registry, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src)
    hw = ctl.gpu_policies["hardware"] = HardwarePolicy(gpu_engines={"0": ["main"]})
    t0 = time.time()
    ctl.tick(t0)
    for d in hw.report_fault(t0 + 1, src.gpus[0].uuid, "CUDA error: GPU has fallen off the bus"):
        ctl._handle(d, t0 + 1)
    ctl.wait_for_actions(10)
    assert hw.gpu_state(src.gpus[0].uuid) == "isolated"
    res = ctl.reset_gpu(0)
    assert res.refused and "lost" in res.message
    assert not any(c[:1] == ["--gpu-reset"] for c in smi.calls())
    assert ctl.reset_gpu(1).ok                      # the other GPU is not affected


def test_a_lost_mark_is_remembered_behind_more_than_ten_thousand_newer_events(tmp_path):
    """The rails rebuild from the whole event log: a lost GPU never ages out of it."""
    log = EventLog(tmp_path / "events.db")
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    GpuResetter(gpu_source=src, event_log=log).mark_lost(1, "Xid 79")
    with log._lock, log._conn:       # 10,050 newer observations of the same kind and source, fast
        log._conn.executemany(
            "INSERT INTO events (time, kind, source, target, severity, reason, inputs, outcome) "
            "VALUES (?, 'observation', 'gpu_reset', 'gpu:0', 'info', 'noise', '{}', '{}')",
            [(time.time(),)] * 10_050)
    assert log.count() > 10_050
    again = GpuResetter(gpu_source=src, event_log=log)
    assert again.state()["lost"] == [1]
