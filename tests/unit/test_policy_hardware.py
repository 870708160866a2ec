"""Hardware policy: Xid catalogue actions, drain → reset → verify, lost GPUs isolated and never
reset (F09), telemetry down decides nothing (F08)."""

from __future__ import annotations

import pytest

from inferctl.controller.gpu.xid import XidAction, XidCatalog, parse_kernel_line
from inferctl.controller.policies import GpuHealth, HardwareConfig, HardwarePolicy, PolicyError
from inferctl.controller.types import XidEvent
from tests.policy_helpers import engine, gpu, reading

GPUS = [gpu(f"GPU-{i}", i) for i in range(4)]
MAP = {"GPU-0": ["e0"], 1: ["e1"], "2": ["e2"], "GPU-3": ["e3"]}


def policy(**cfg) -> HardwarePolicy:
    return HardwarePolicy(None, HardwareConfig(**cfg), gpu_engines=MAP)


def four(**override):
    """The 4 GPUs, with keyword overrides for one of them: ``g2=gpu(...)``."""
    gs = list(GPUS)
    for k, v in override.items():
        gs[int(k[1:])] = v
    return reading(*gs)


def xid(code, index=0, t=0.0, msg="", lost=False):
    return XidEvent(xid=code, pci_bus_id=f"0000:{0x40 + index:02x}:00.0", message=msg, time=t,
                    source="kernel", lost=lost)


def all_actions(ds):
    return [(d.target, d.action) for d in ds if d.action is not None]


# --------------------------------------------------------------------------- F09 lost GPU
def test_f09_lost_gpu_is_isolated_drained_escalated_and_never_reset():
    p = policy()
    assert p.observe(0.0, four()) == []
    ds = p.observe(10.0, four(g2=gpu("GPU-2", 2, free=None, total=None, lost=True,
                                     health="lost")))
    assert all_actions(ds) == [("GPU-2", "isolate_gpu"), ("e2", "drain"),
                               ("GPU-2", "reboot_node")]
    assert all(d.severity == "critical" for d in ds)
    assert ds[0].to_state == "isolated" and "never reset" in ds[0].reason
    assert p.gpu_state("GPU-2") == "isolated"
    assert [p.gpu_state(f"GPU-{i}") for i in (0, 1, 3)] == ["healthy"] * 3
    # later polls: still lost, plus both kernel lines for its PCI address → nothing new
    lines = ["NVRM: Xid (PCI:0000:42:00): 79, GPU has fallen off the bus.",
             "NVRM: The NVIDIA GPU 0000:42:00.0 (PCI ID: 10de:26b5) installed in this system "
             "has fallen off the bus and is not responding to commands."]
    evs = [parse_kernel_line(line, time=20.0 + i) for i, line in enumerate(lines)]
    for t in (20.0, 30.0, 400.0):
        later = p.observe(t, four(g2=gpu("GPU-2", 2, free=None, total=None, lost=True,
                                         xids=evs)))
        assert later == []
        # the whole run never asked for a reset
    assert "reset_gpu" not in [a for _, a in all_actions(ds)]


def test_f09_kernel_lines_alone_make_one_isolation_event():
    p = policy()
    p.observe(0.0, four())
    lines = ["NVRM: Xid (PCI:0000:42:00): 79, GPU has fallen off the bus.",
             "NVRM: The NVIDIA GPU 0000:42:00.0 (PCI ID: 10de:26b5) installed in this system "
             "has fallen off the bus and is not responding to commands."]
    first = p.observe(5.0, four(g2=gpu("GPU-2", 2, xids=[parse_kernel_line(lines[0], 5.0)])))
    second = p.observe(65.0, four(g2=gpu("GPU-2", 2, xids=[parse_kernel_line(lines[1], 65.0)])))
    assert [a for _, a in all_actions(first)] == ["isolate_gpu", "drain", "reboot_node"]
    assert second == []


def test_lost_gpu_mid_reset_is_isolated_not_reset():
    p = policy()
    p.observe(0.0, four(g1=gpu("GPU-1", 1, xids=[xid(48, 1, 0.0, "DBE")])))
    assert p.gpu_state("GPU-1") == "draining"
    ds = p.observe(5.0, four(g1=gpu("GPU-1", 1, lost=True)))
    assert [a for _, a in all_actions(ds)] == ["isolate_gpu", "drain", "reboot_node"]
    assert p.observe(500.0, four(g1=gpu("GPU-1", 1, lost=True))) == []   # no drain-timeout reset


# --------------------------------------------------------------------------- reset path
@pytest.mark.parametrize("code", [48, 64, 95, 119, 120])
def test_reset_class_xid_drains_then_resets_then_verifies(code):
    p = policy(verify_seconds=60.0)
    ds = p.observe(0.0, four(g0=gpu("GPU-0", 0, xids=[xid(code, 0, 0.0, "err")])))
    assert all_actions(ds) == [("e0", "drain")]
    assert (ds[0].from_state, ds[0].to_state) == ("healthy", "draining")
    # e0 still has work: no reset yet
    busy = {"e0": engine(1.0, draining=True, running=3)}
    assert p.observe(1.0, four(), busy) == []
    drained = {"e0": engine(2.0, draining=True, running=0)}
    ds = p.observe(2.0, four(), drained)
    assert all_actions(ds) == [("GPU-0", "reset_gpu")]
    assert ds[0].inputs["gpu_index"] == 0 and ds[0].inputs["drained"] is True
    ds = p.record_action_result(3.0, "GPU-0", "reset_gpu", True, "exit 0")
    assert ds[0].to_state == "verifying"
    assert p.observe(30.0, four()) == []
    ds = p.observe(63.0, four())
    assert ds[0].to_state == "healthy" and all_actions(ds) == [("e0", "undrain")]


def test_drain_timeout_resets_anyway():
    p = policy(drain_timeout_seconds=120.0)
    p.observe(0.0, four(g0=gpu("GPU-0", 0, xids=[xid(48, 0, 0.0)])))
    busy = {"e0": engine(1.0, draining=True, running=3)}
    assert p.observe(119.0, four(), busy) == []
    ds = p.observe(120.0, four(), busy)
    assert all_actions(ds) == [("GPU-0", "reset_gpu")]
    assert "drain timeout" in ds[0].reason and ds[0].inputs["drained"] is False


def test_failed_reset_isolates_and_escalates():
    p = policy()
    p.observe(0.0, four(g0=gpu("GPU-0", 0, xids=[xid(95, 0, 0.0)])))
    p.observe(1.0, four(), {"e0": engine(1.0, ok=False)})          # engine down counts as drained
    assert p.gpu_state("GPU-0") == "resetting"
    ds = p.record_action_result(2.0, "GPU-0", "reset_gpu", False, "In use by another client")
    assert [a for _, a in all_actions(ds)] == ["isolate_gpu", "drain", "reboot_node"]
    assert "In use by another client" in ds[0].reason


def test_reset_without_result_times_out_to_isolation():
    p = policy(reset_timeout_seconds=300.0)
    p.observe(0.0, four(g0=gpu("GPU-0", 0, xids=[xid(48, 0, 0.0)])))
    p.observe(1.0, four(), {"e0": engine(1.0, draining=True, running=0)})
    assert p.observe(200.0, four()) == []
    ds = p.observe(301.0, four())
    assert ds[0].to_state == "isolated"


def test_fault_while_verifying_means_the_reset_did_not_help():
    p = policy()
    p.observe(0.0, four(g0=gpu("GPU-0", 0, xids=[xid(48, 0, 0.0)])))
    p.observe(1.0, four(), {"e0": engine(1.0, draining=True, running=0)})
    p.record_action_result(2.0, "GPU-0", "reset_gpu", True)
    ds = p.observe(10.0, four(g0=gpu("GPU-0", 0, xids=[xid(48, 0, 10.0, "again")])))
    assert [a for _, a in all_actions(ds)] == ["isolate_gpu", "drain", "reboot_node"]


def test_second_reset_within_the_interval_isolates():
    p = policy(verify_seconds=10.0, reset_min_interval_seconds=3600.0)
    p.observe(0.0, four(g0=gpu("GPU-0", 0, xids=[xid(48, 0, 0.0)])))
    p.observe(1.0, four(), {"e0": engine(1.0, draining=True, running=0)})
    p.record_action_result(2.0, "GPU-0", "reset_gpu", True)
    p.observe(20.0, four())
    assert p.gpu_state("GPU-0") == "healthy"
    ds = p.observe(1000.0, four(g0=gpu("GPU-0", 0, xids=[xid(48, 0, 1000.0, "new")])))
    assert [a for _, a in all_actions(ds)] == ["isolate_gpu", "drain", "reboot_node"]
    assert "does not hold" in ds[0].reason


def test_ecc_uncorrected_growth_and_recovery_action():
    p = policy()
    assert p.observe(0.0, four(g3=gpu("GPU-3", 3, ecc_uncorrected=0))) == []   # baseline
    assert p.observe(1.0, four(g3=gpu("GPU-3", 3, ecc_uncorrected=0))) == []
    ds = p.observe(2.0, four(g3=gpu("GPU-3", 3, ecc_uncorrected=2)))
    assert ds[0].to_state == "draining" and "0 -> 2" in ds[0].reason
    q = policy()
    ds = q.observe(0.0, four(g1=gpu("GPU-1", 1, recovery_action=4)))
    assert ds[0].to_state == "draining" and all_actions(ds) == [("e1", "drain")]
    r = policy()
    ds = r.observe(0.0, four(g1=gpu("GPU-1", 1, recovery_action=2)))
    assert [a for _, a in all_actions(ds)] == ["isolate_gpu", "drain", "reboot_node"]


# --------------------------------------------------------------------------- restart / ignore
@pytest.mark.parametrize("code", [13, 31, 94])
def test_restart_class_xid_restarts_the_engine(code):
    p = policy(degraded_clear_seconds=600.0)
    ds = p.observe(0.0, four(g1=gpu("GPU-1", 1, xids=[xid(code, 1, 0.0, "app fault")])))
    assert all_actions(ds) == [("e1", "restart_engine")]
    assert ds[0].to_state == "degraded"
    assert p.observe(300.0, four()) == []
    ds = p.observe(600.0, four())
    assert ds[0].to_state == "healthy"


def test_repeated_restart_class_xids_escalate_to_reset():
    p = policy(restart_escalate_count=3)
    p.observe(0.0, four(g1=gpu("GPU-1", 1, xids=[xid(13, 1, 0.0, "a")])))
    p.observe(10.0, four(g1=gpu("GPU-1", 1, xids=[xid(31, 1, 10.0, "b")])))
    ds = p.observe(20.0, four(g1=gpu("GPU-1", 1, xids=[xid(94, 1, 20.0, "c")])))
    assert ds[0].to_state == "draining" and "escalate" in ds[0].reason


@pytest.mark.parametrize("code", [43, 63, 92])
def test_ignore_class_xid_is_recorded_without_action(code):
    p = policy()
    ds = p.observe(0.0, four(g0=gpu("GPU-0", 0, xids=[xid(code, 0, 0.0, "noise")])))
    assert len(ds) == 1 and ds[0].action is None and "no action" in ds[0].reason
    assert p.gpu_state("GPU-0") == "healthy"


def test_same_xid_event_on_several_polls_acts_once():
    p = policy()
    ev = xid(13, 1, 0.0, "app fault")
    first = p.observe(0.0, four(g1=gpu("GPU-1", 1, xids=[ev])))
    again = p.observe(5.0, four(g1=gpu("GPU-1", 1, xids=[ev])))
    assert all_actions(first) == [("e1", "restart_engine")] and again == []


def test_unknown_xid_needs_a_person():
    p = policy()
    ds = p.observe(0.0, four(g0=gpu("GPU-0", 0, xids=[xid(999, 0, 0.0, "?")])))
    assert all_actions(ds) == [] and ds[0].to_state == "degraded"
    assert ds[0].severity == "warning" and "investigate" in ds[0].reason


# --------------------------------------------------------------------------- F08 telemetry down
def test_f08_telemetry_down_decides_nothing():
    p = policy(drain_timeout_seconds=60.0)
    p.observe(0.0, four(g0=gpu("GPU-0", 0, xids=[xid(48, 0, 0.0)])))    # draining
    for t in (10.0, 100.0, 1000.0):
        assert p.observe(t, reading(ok=False, error="NVMLError_Unknown")) == []
    assert p.gpu_state("GPU-0") == "telemetry_down"
    assert p.gpu_state("GPU-1") == "telemetry_down"
    st = p.state()
    assert st["telemetry"]["up"] is False and st["telemetry"]["down_since"] == 10.0
    assert st["gpus"]["GPU-0"]["policy_state"] == "draining"
    # telemetry back: the policy resumes where it was
    ds = p.observe(1001.0, four())
    assert p.state()["telemetry"]["up"] is True
    assert all_actions(ds) == [("GPU-0", "reset_gpu")]


# --------------------------------------------------------------------------- catalogue forms
def test_catalogue_as_callable_enum_mapping_or_strings(fixtures_dir):
    cat = XidCatalog.from_dir(fixtures_dir / "xid")
    by_callable = HardwarePolicy(cat.action)
    by_enum = HardwarePolicy({48: XidAction.RESET_GPU, 13: XidAction.RESTART_ENGINE})
    by_str = HardwarePolicy({"48": "reset_gpu", 13: "RESTART_APP"})
    for p in (by_callable, by_enum, by_str):
        assert p.xid_action(48) == "reset_gpu"
        assert p.xid_action(13) == "restart_engine"
        assert p.xid_action(79) == "reboot_node"
    assert by_callable.xid_action(43) == "ignore"
    assert by_enum.xid_action(500) == "unknown"
    with pytest.raises(ValueError, match="xid_actions"):
        HardwarePolicy(42)


def test_report_fault_text_from_the_engine():
    p = policy()
    p.observe(0.0, four())
    ds = p.report_fault(5.0, "GPU-2", "CUDA error: GPU is lost (Xid 79)")
    assert [a for _, a in all_actions(ds)] == ["isolate_gpu", "drain", "reboot_node"]
    q = policy()
    q.observe(0.0, four())
    ds = q.report_fault(5.0, "GPU-0", "uncorrectable ECC error encountered")
    assert ds[0].to_state == "draining"
    assert q.report_fault(6.0, "GPU-1", "CUDA out of memory") == []


def test_release_after_repair():
    p = policy()
    p.observe(0.0, four(g2=gpu("GPU-2", 2, lost=True)))
    with pytest.raises(PolicyError, match="not isolated"):
        p.release(1.0, "GPU-0", "bob")
    ds = p.release(100.0, "GPU-2", "bob")
    assert ds[0].to_state == "healthy" and p.gpu_state("GPU-2") == GpuHealth.HEALTHY.value


def test_same_restart_xid_repeating_escalates_but_duplicates_merge():
    p = policy(restart_escalate_count=3, xid_duplicate_seconds=10.0)
    first = p.observe(0.0, four(g1=gpu("GPU-1", 1, xids=[xid(13, 1, 0.0, "a"),
                                                         xid(13, 1, 0.5, "a (nvml)")])))
    assert all_actions(first) == [("e1", "restart_engine")]     # one fault, two reports
    p.observe(60.0, four(g1=gpu("GPU-1", 1, xids=[xid(13, 1, 60.0, "b")])))
    ds = p.observe(120.0, four(g1=gpu("GPU-1", 1, xids=[xid(13, 1, 120.0, "c")])))
    assert ds[0].to_state == "draining" and "3 restart-class faults" in ds[0].reason
