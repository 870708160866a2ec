"""The loop wires the precision policy's hardware hand-off to HardwarePolicy.report_fault, and
every reset_gpu outcome (success, failure, refusal) back to HardwarePolicy.record_action_result."""

from __future__ import annotations

import time

from inferctl.controller.actions import Actions
from inferctl.controller.loop import Controller
from inferctl.controller.policies import HardwarePolicy
from inferctl.controller.policies.precision import PrecisionPolicy
from inferctl.controller.reset import GpuResetter
from inferctl.controller.types import XidEvent
from tests.controller_helpers import (FakeEngineClient, FakeNvidiaSmi, StaticGpuSource, gpu, loop_parts,
                                      run_until)

MIB = 1024 * 1024
XID48_TEXT = "CUDA error: uncorrectable ECC error encountered (Xid 48) during the forward pass"


def build(tmp_path, engine_gpu, src, hw_config=None):
    cfg, registry, metrics, log = loop_parts(
        tmp_path, [{"name": "main", "url": "http://127.0.0.1:9000", "gpu": engine_gpu}])
    client = FakeEngineClient()
    resetter = GpuResetter("nvidia-smi", src, log, min_interval_seconds=0, metrics=metrics)
    acts = Actions({"main": client}, resetter=resetter, event_log=log, metrics=metrics,
                   engine_gpus={"main": engine_gpu}, confirm_timeout_seconds=0.2, poll_interval_seconds=0.01,
                   drain_timeout_seconds=1)
    hw = HardwarePolicy(config=hw_config or {"verify_seconds": 2, "drain_timeout_seconds": 30},
                        gpu_engines={} if engine_gpu is None else {str(engine_gpu): ["main"]})
    ctl = Controller(cfg, {"main": client}, src, {"main": {"precision": PrecisionPolicy({}, engine="main")}},
                     acts, log, metrics, registry=registry, gpu_policies={"hardware": hw})
    acts.gpu_index_of = ctl.gpu_index_of
    return ctl, hw, client, log


def hw_fault(t):
    return {"id": 1, "time": t, "kind": "exhaustion", "requested_bytes": 2 * MIB, "free_bytes": 1 * MIB,
            "message": XID48_TEXT, "source": "cuda", "precision": "full"}


def test_engine_hardware_fault_goes_to_the_hardware_policy_not_int8(tmp_path, monkeypatch):
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    ctl, hw, client, log = build(tmp_path, 0, src)
    t0 = time.time()
    ctl.tick(t0)
    client.faults.append(hw_fault(t0 + 0.5))
    ctl.tick(t0 + 1)
    ctl.wait_for_actions(10)
    uuid = src.gpus[0].uuid
    assert hw.gpu_state(uuid) == "draining"            # Xid 48 from the engine's text: reset path
    assert ("drain", True) in client.calls
    assert ("precision", "int8") not in client.calls   # never a degrade
    [handoff] = [e for e in log.query(limit=100) if e["inputs"].get("handoff") == "hardware"]
    assert handoff["source"] == "precision" and handoff["severity"] == "critical"
    [to_drain] = [e for e in log.query(kind="transition", limit=100) if e["source"] == "hardware"]
    assert to_drain["target"] == uuid and "Xid 48" in to_drain["reason"]


def test_without_a_gpu_for_the_engine_the_handoff_is_an_observation(tmp_path):
    src = StaticGpuSource({0: gpu(0)})
    ctl, hw, client, log = build(tmp_path, None, src)
    t0 = time.time()
    ctl.tick(t0)
    client.faults.append(hw_fault(t0 + 0.5))
    ctl.tick(t0 + 1)
    ctl.wait_for_actions(10)
    assert hw.gpu_state(src.gpus[0].uuid) == "healthy"
    [obs] = [e for e in log.query(kind="observation", limit=100) if e["source"] == "controller"]
    assert "no GPU configured for the engine" in obs["reason"] and XID48_TEXT in obs["inputs"]["text"]
    assert client.calls == []


def xid48_until_isolated(tmp_path, monkeypatch, smi_gpus):
    """GPU 0 (the engine's) reports Xid 48 with the fake nvidia-smi set up as ``smi_gpus``; the
    loop runs until the hardware policy isolates it. Returns the event log."""
    FakeNvidiaSmi(tmp_path, monkeypatch, gpus=smi_gpus)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    ctl, hw, client, log = build(tmp_path, 0, src)
    t0 = time.time()
    ctl.tick(t0)
    src.gpus[0].xid_events = [XidEvent(xid=48, pci_bus_id=src.gpus[0].pci_bus_id, message="Xid 48", time=t0)]
    uuid = src.gpus[0].uuid
    run_until(ctl, lambda: hw.gpu_state(uuid) == "isolated", t0)
    return log


def test_failed_reset_reaches_the_hardware_policy_and_isolates(tmp_path, monkeypatch):
    log = xid48_until_isolated(tmp_path, monkeypatch, {0: {"mode": "lost_on_reset"}, 1: {}})
    trans = [(e["outcome"]["from"], e["outcome"]["to"]) for e in log.query(kind="transition", limit=100)
             if e["source"] == "hardware"]
    assert trans == [("healthy", "draining"), ("draining", "resetting"), ("resetting", "isolated")]
    assert any(e["outcome"].get("action") == "reboot_node" for e in log.query(kind="escalation", limit=100))


def test_refused_reset_reaches_the_hardware_policy_and_isolates(tmp_path, monkeypatch):
    log = xid48_until_isolated(tmp_path, monkeypatch, {0: {"processes": [[4242, "stranger", 512]]}, 1: {}})
    [iso] = [e for e in log.query(kind="transition", limit=100)
             if e["source"] == "hardware" and e["outcome"]["to"] == "isolated"]
    assert iso["outcome"]["from"] == "resetting" and "reset failed" in iso["reason"]
    [ref] = log.query(kind="refusal", limit=100)
    assert "4242" in ref["reason"], ref["reason"]
