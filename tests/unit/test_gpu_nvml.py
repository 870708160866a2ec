"""NVML source against a fake pynvml module that raises pynvml's real exceptions (F08, F09, F10)."""

from __future__ import annotations

import logging
import threading
import time

import pynvml
import pytest

from inferctl.controller.gpu.factory import make_gpu_source
from inferctl.controller.gpu.nvml import NvmlGpuSource, probe_nvml
from inferctl.controller.gpu.sim import SimGpuSource
from tests.gpu_helpers import MIB, FakeGpu, FakeNvml


def four_gpus() -> list[FakeGpu]:
    return [FakeGpu(uuid=f"GPU-{i}", pci=f"00000000:{0x18 + i * 0x10:02X}:00.0") for i in range(4)]


def test_reads_memory_v2_and_converts_units() -> None:
    g = FakeGpu(uuid="GPU-a", pci="00000000:44:00.0", total_mib=81559, used_mib=19818, reserved_mib=479,
                util_gpu=100, util_mem=11, power_mw=219000, power_limit_mw=700000, pstate=0,
                ecc=(3, 1), remapped=(0, 0, 1, 0), recovery_action=1, processes=[(11327, 2566 * MIB)])
    src = NvmlGpuSource(FakeNvml([g]), timeout_s=1.0)
    r = src.poll(100.0)
    assert r.ok and r.error is None
    s = r.gpus["GPU-a"]
    assert (s.memory_total_bytes, s.memory_used_bytes, s.memory_reserved_bytes) == (
        81559 * MIB, 19818 * MIB, 479 * MIB)
    assert s.memory_free_bytes == (81559 - 19818 - 479) * MIB
    assert s.pci_bus_id == "0000:44:00.0"
    assert s.utilization_ratio == 1.0 and s.memory_bandwidth_utilization_ratio == pytest.approx(0.11)
    assert s.power_watts == 219.0 and s.power_limit_watts == 700.0
    assert s.pstate == "P0" and s.clocks_sm_mhz == 1980.0
    assert (s.ecc_corrected, s.ecc_uncorrected) == (3, 1)
    assert s.remapped_rows_pending is True and s.remapped_rows_failure is False
    assert s.recovery_action == 1 and s.persistence_mode is True and s.mig_enabled is False
    assert s.fan_ratio is None                               # NotSupported -> no data, not 0
    assert [(p.pid, p.used_memory_bytes, p.name) for p in s.processes] == [(11327, 2566 * MIB, "proc-11327")]


def test_memory_v1_fallback_leaves_reserved_unknown() -> None:
    g = FakeGpu(uuid="GPU-old", used_mib=1000, reserved_mib=300, memory_v2=False)
    s = NvmlGpuSource(FakeNvml([g])).poll(0.0).gpus["GPU-old"]
    assert s.memory_reserved_bytes is None
    assert s.memory_used_bytes == 1300 * MIB            # v1 "used" includes reserved
    assert s.memory_free_bytes == (81920 - 1300) * MIB


def test_f10_power_not_supported_is_none_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    gpus = [FakeGpu(uuid="GPU-0", power_mw=219000),
            FakeGpu(uuid="GPU-1", power_mw=pynvml.NVMLError_NotSupported())]
    src = NvmlGpuSource(FakeNvml(gpus))
    with caplog.at_level(logging.INFO, logger="inferctl.controller.gpu.nvml"):
        readings = [src.poll(float(t)) for t in range(5)]
    assert all(r.ok for r in readings)
    assert readings[-1].gpus["GPU-0"].power_watts == 219.0
    assert readings[-1].gpus["GPU-1"].power_watts is None
    power_lines = [r for r in caplog.records if "power_watts" in r.getMessage()]
    assert len(power_lines) == 1 and "GPU-1" in power_lines[0].getMessage()
    # the fan (NotSupported on both GPUs) is logged once per GPU, not once per poll
    fan_lines = [r for r in caplog.records if "fan_ratio" in r.getMessage()]
    assert len(fan_lines) == 2


def test_f09_one_gpu_lost_others_keep_reporting() -> None:
    gpus = four_gpus()
    for g in gpus:
        g.used_mib = 1000
    fake = FakeNvml(gpus)
    src = NvmlGpuSource(fake)
    assert src.poll(0.0).ok
    gpus[2].lost = True
    r = src.poll(1.0)
    assert r.ok, "one lost GPU does not take telemetry down"
    assert set(r.gpus) == {"GPU-0", "GPU-1", "GPU-2", "GPU-3"}
    lost = r.gpus["GPU-2"]
    assert lost.lost is True and lost.health == "lost"
    assert lost.memory_used_bytes is None and lost.memory_total_bytes is None
    for key in ("GPU-0", "GPU-1", "GPU-3"):
        assert r.gpus[key].lost is False
        assert r.gpus[key].memory_used_bytes == 1000 * MIB


def test_gpu_lost_before_first_poll_keeps_its_index() -> None:
    gpus = four_gpus()
    gpus[2].lost = True
    r = NvmlGpuSource(FakeNvml(gpus)).poll(0.0)
    assert r.ok
    lost = [s for s in r.gpus.values() if s.lost]
    assert [(s.index, s.uuid) for s in lost] == [(2, "GPU-unknown-index-2")]


def test_f08_unknown_error_marks_telemetry_down_backs_off_and_recovers() -> None:
    g = FakeGpu(uuid="GPU-0", total_mib=81920, used_mib=61440)
    fake = FakeNvml([g])
    now = {"t": 0.0}
    fake.clock = lambda: now["t"]
    src = NvmlGpuSource(fake, backoff_initial_s=1.0, backoff_max_s=4.0)
    readings = {}
    for t in range(0, 3):                      # polls 1-3 normal
        now["t"] = float(t)
        readings[t] = src.poll(float(t))
        assert readings[t].ok and readings[t].gpus["GPU-0"].memory_used_bytes == 61440 * MIB
    fake.broken = True                         # from poll 4, NVML raises NVMLError_Unknown
    for t in range(3, 14):
        now["t"] = float(t)
        readings[t] = src.poll(float(t))
        assert readings[t].ok is False
        assert readings[t].gpus == {}, "no memory numbers while NVML is down (never 0)"
        assert readings[t].error
    assert "Unknown" in readings[3].error
    # re-init attempts back off: 1 s, then 2 s, then capped at 4 s
    retries = [t for t in fake.init_times if t >= 3]
    assert retries == [4.0, 6.0, 10.0]
    fake.broken = False
    recovered = None
    for t in range(14, 20):
        now["t"] = float(t)
        r = src.poll(float(t))
        if r.ok:
            recovered = t
            break
    assert recovered == 14                     # next retry was due at 10 + 4 = 14
    assert r.gpus["GPU-0"].memory_used_bytes == 61440 * MIB


def test_hung_call_marks_down_without_stalling() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-0")])
    src = NvmlGpuSource(fake, timeout_s=0.2, poll_interval_s=1.0)
    assert src.poll(0.0).ok
    fake.hang = threading.Event()
    t0 = time.monotonic()
    r1 = src.poll(1.0)
    r2 = src.poll(2.0)                          # still hung: answered at once
    elapsed = time.monotonic() - t0
    assert r1.ok is False and "did not return within 0.2 s" in r1.error
    assert r2.ok is False and "hung" in r2.error
    assert elapsed < 1.0
    fake.hang.set()
    time.sleep(0.05)
    fake.hang = None
    assert src.poll(3.0).ok


def test_xid_events_are_drained_per_gpu() -> None:
    gpus = four_gpus()
    gpus[1].xids = [79, 48]
    src = NvmlGpuSource(FakeNvml(gpus))
    r = src.poll(5.0)
    ev = r.gpus["GPU-1"].xid_events
    assert [(e.xid, e.pci_bus_id, e.source, e.lost) for e in ev] == [
        (79, "0000:28:00.0", "nvml", True), (48, "0000:28:00.0", "nvml", False)]
    assert r.gpus["GPU-0"].xid_events == []
    assert src.poll(6.0).gpus["GPU-1"].xid_events == []      # drained once


def test_timeout_must_be_shorter_than_interval() -> None:
    with pytest.raises(ValueError, match="timeout_s .* shorter than poll_interval_s"):
        NvmlGpuSource(FakeNvml([]), timeout_s=5.0, poll_interval_s=5.0)


def test_auto_picks_nvml_when_init_works_and_sim_otherwise(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-0")])
    assert probe_nvml(fake) is None
    assert isinstance(make_gpu_source("auto", nvml=fake, stats_fn=dict), NvmlGpuSource)
    fake.broken = True
    with caplog.at_level(logging.WARNING):
        src = make_gpu_source("auto", nvml=fake, stats_fn=lambda: {"memory": {"budget_bytes": 10,
                                                                               "reserved_bytes": 4}})
    assert isinstance(src, SimGpuSource)
    warn = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no NVIDIA driver found" in r.getMessage() and "SIMULATED" in r.getMessage() for r in warn)


def test_factory_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="gpu source kind 'cuda'"):
        make_gpu_source("cuda")


def test_missing_binding_function_is_one_field_not_telemetry_down(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-0", remapped=(0, 0, 1, 1))])
    fake.nvmlDeviceGetRemappedRows = None          # an older nvidia-ml-py without the call
    src = NvmlGpuSource(fake)
    with caplog.at_level(logging.INFO, logger="inferctl.controller.gpu.nvml"):
        r1, r2 = src.poll(0.0), src.poll(1.0)
    assert r1.ok and r2.ok and r2.gpus["GPU-0"].remapped_rows_pending is None
    assert r2.gpus["GPU-0"].power_watts == 100.0
    assert sum("remapped_rows" in r.getMessage() for r in caplog.records) == 1
