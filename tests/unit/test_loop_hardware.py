"""GPU faults through the whole loop: hardware policy → drain → reset rails (fake nvidia-smi) →
verification, and a lost GPU that is isolated and never reset."""

from __future__ import annotations

import time

from inferctl.controller.policies import HardwarePolicy
from inferctl.controller.types import XidEvent
from tests.controller_helpers import (FakeEngineClient, FakeNvidiaSmi, StaticGpuSource, gpu, make_controller,
                                      run_until)


def test_xid_48_drains_resets_verifies_and_undrains(tmp_path, monkeypatch):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    client = FakeEngineClient()
    hw = HardwarePolicy(config={"verify_seconds": 2, "drain_timeout_seconds": 30},
                        gpu_engines={"0": ["main"]})
    ctl, registry, log = make_controller(tmp_path, {"main": client}, gpu_source=src)
    ctl.gpu_policies["hardware"] = hw
    t0 = time.time()
    ctl.tick(t0)
    src.gpus[0].xid_events = [XidEvent(xid=48, pci_bus_id=src.gpus[0].pci_bus_id,
                                       message="NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable ECC error",
                                       time=t0 + 0.5)]
    uuid = src.gpus[0].uuid
    run_until(ctl, lambda: hw.gpu_state(uuid) == "verifying", t0)
    assert client.calls[0] == ("drain", True)
    assert ["--gpu-reset", "-i", "0"] in smi.calls()
    assert smi.state(0)["persistence"] is True
    src.gpus[0].xid_events = []
    run_until(ctl, lambda: hw.gpu_state(uuid) == "healthy", t0 + 20)
    assert ("drain", False) in client.calls
    assert registry.get_sample_value("inferctl_gpu_resets_total", {"gpu": "0", "outcome": "success"}) == 1
    assert registry.get_sample_value("inferctl_gpu_healthy", {"gpu": "0", "uuid": uuid}) == 1.0
    trans = [(e["outcome"]["from"], e["outcome"]["to"]) for e in log.query(kind="transition", limit=100)
             if e["source"] == "hardware"]
    assert trans == [("healthy", "draining"), ("draining", "resetting"), ("resetting", "verifying"),
                     ("verifying", "healthy")]
    steps = [e["outcome"]["step"] for e in log.query(kind="step", limit=100)]
    assert steps[:5] == ["query_processes", "query_persistence", "disable_persistence", "reset",
                         "restore_persistence"]


def test_lost_gpu_is_isolated_escalated_and_never_reset(tmp_path, monkeypatch):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    client = FakeEngineClient()
    hw = HardwarePolicy(gpu_engines={"1": ["main"]})
    ctl, registry, log = make_controller(tmp_path, {"main": client}, gpu_source=src)
    ctl.gpu_policies["hardware"] = hw
    t0 = time.time()
    ctl.tick(t0)
    src.gpus[1].lost = True
    run_until(ctl, lambda: hw.gpu_state(src.gpus[1].uuid) == "isolated", t0)
    ctl.wait_for_actions(10)
    for _ in range(3):
        ctl.tick()
        ctl.wait_for_actions(10)
    assert client.draining is True
    assert smi.calls() == []
    assert registry.get_sample_value("inferctl_gpu_lost", {"gpu": "1", "uuid": src.gpus[1].uuid}) == 1.0
    esc = log.query(kind="escalation")
    assert esc and all(e["severity"] == "critical" for e in esc)
    # an operator reset of the lost GPU is refused too, and runs nothing
    res = ctl.reset_gpu(1)
    assert res.refused and "lost" in res.message
    assert smi.calls() == []


def test_xid_in_a_reading_replaced_before_reconcile_is_not_lost(tmp_path, monkeypatch):
    """NVML delivers an Xid event once. When the GPU source is polled again before a reconcile
    (a GPU poll faster than the reconcile job), the Xid of the unseen reading still reaches
    the hardware policy — exactly once."""
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    hw = HardwarePolicy(gpu_engines={"0": ["main"]})
    ctl, registry, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src)
    ctl.gpu_policies["hardware"] = hw
    t0 = time.time()
    ctl.tick(t0)
    uuid = src.gpus[0].uuid
    src.gpus[0].xid_events = [XidEvent(xid=48, pci_bus_id=src.gpus[0].pci_bus_id,
                                       message="NVRM: Xid (PCI:0000:3b:00): 48, ECC", time=t0 + 0.5)]
    ctl.poll_gpu(t0 + 0.5, force=True)
    src.gpus[0].xid_events = []                 # delivered once
    ctl.poll_gpu(t0 + 1.0, force=True)
    ctl.reconcile(t0 + 1.0)
    assert hw.gpu_state(uuid) == "draining"
    ctl.poll_gpu(t0 + 1.5, force=True)
    ctl.reconcile(t0 + 1.5)
    ctl.wait_for_actions(10)
    assert registry.get_sample_value("inferctl_gpu_xid_events_total",
                                     {"gpu": "0", "xid": "48", "action": "reset_gpu"}) == 1.0
