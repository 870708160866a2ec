"""Issue 10 items 1 and 3 through the real loop: an OOM on a GPU carrying a standing fault is a
hardware fault (no int8, engine drained, /status routing not ready, metrics); MIG instance memory
reaches /status and /metrics."""

from __future__ import annotations

import time

from inferctl.controller.policies import HardwarePolicy
from inferctl.controller.types import MigInstance
from tests.controller_helpers import FakeEngineClient, FakeNvidiaSmi, StaticGpuSource, gpu, make_controller

GIB = 1 << 30


def test_oom_on_gpu_with_uncorrectable_history_is_hardware_and_stops_routing(tmp_path, monkeypatch):
    FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0), 1: gpu(1)})
    src.gpus[0].ecc_uncorrected, src.gpus[0].ecc_uncorrected_aggregate = 0, 2
    client = FakeEngineClient()
    hw = HardwarePolicy(config={"drain_timeout_seconds": 600}, gpu_engines={"0": ["main"]})
    ctl, registry, log = make_controller(tmp_path, {"main": client}, gpu_source=src)
    ctl.gpu_policies["hardware"] = hw
    t0 = time.time()
    ctl.tick(t0)
    ctl.wait_for_actions(10)
    uuid = src.gpus[0].uuid
    assert ctl.status()["engines"]["main"]["routing"]["ready"] is True
    client.faults = [{"id": 1, "time": t0 + 1, "kind": "exhaustion", "requested_bytes": 2 * GIB,
                      "free_bytes": GIB, "message": "CUDA out of memory.", "precision": "full"}]
    ctl.tick(t0 + 2)
    ctl.wait_for_actions(10)
    assert ("precision", "int8") not in client.calls
    assert ("drain", True) in client.calls
    assert hw.gpu_state(uuid) == "draining"
    st = ctl.status()
    assert st["engines"]["main"]["routing"]["ready"] is False
    assert st["engines"]["main"]["policies"]["precision"]["state"] == "full"
    dev = next(d for d in st["gpus"]["devices"] if d["index"] == 0)
    assert dev["standing_faults"] == {"ecc_uncorrected_aggregate": "2 uncorrectable ECC error(s) on record (aggregate)"}
    assert registry.get_sample_value("inferctl_gpu_healthy", {"gpu": "0", "uuid": uuid}) == 0.0
    assert registry.get_sample_value("inferctl_gpu_standing_fault",
                                     {"gpu": "0", "uuid": uuid, "kind": "ecc_uncorrected_aggregate"}) == 1.0


def test_mig_instance_memory_reaches_status_and_metrics(tmp_path):
    src = StaticGpuSource({0: gpu(0)})
    src.gpus[0].mig_enabled = True
    src.gpus[0].mig_instances = [MigInstance(gpu_instance_id=3, profile="1g.6gb", memory_total_bytes=6 * GIB,
                                             memory_used_bytes=GIB, memory_free_bytes=5 * GIB)]
    ctl, registry, _ = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src)
    ctl.tick(time.time())
    [dev] = ctl.status()["gpus"]["devices"]
    assert dev["mig_instances"][0]["memory_free_bytes"] == 5 * GIB and dev["mig_instances"][0]["profile"] == "1g.6gb"
    lab = {"gpu": "0", "uuid": src.gpus[0].uuid, "gpu_instance_id": "3", "profile": "1g.6gb"}
    assert registry.get_sample_value("inferctl_gpu_mig_memory_used_bytes", lab) == GIB
    assert registry.get_sample_value("inferctl_gpu_mig_memory_total_bytes", lab) == 6 * GIB
    src.gpus[0].mig_instances = []                       # the instance was destroyed: its series goes
    ctl.tick(time.time() + 5)
    assert registry.get_sample_value("inferctl_gpu_mig_memory_used_bytes", lab) is None
