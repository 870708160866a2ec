"""Item 1 of issue 10: a hardware fault is not an OOM. The standing fault state (not only growing
counts) makes an OOM a hardware fault; volatile counters reset; correctable storms only warn."""

from __future__ import annotations

import pytest

from inferctl.controller.policies import HardwareConfig, HardwarePolicy, PrecisionPolicy
from inferctl.controller.policies.hardware_state import CounterRate, counter_increase, standing_faults
from tests.policy_helpers import actions, engine, gpu, oom, reading

STANDING = [dict(ecc_uncorrected=3), dict(ecc_uncorrected=0, ecc_uncorrected_aggregate=2),
            dict(retired_pages_pending=True), dict(remapped_rows_pending=True),
            dict(remapped_rows_failure=True)]


@pytest.mark.parametrize("fault", STANDING, ids=lambda f: next(iter(f.items()))[0] if len(f) == 1 else "aggregate")
def test_oom_on_a_gpu_with_a_standing_fault_is_hardware_not_int8(fault):
    p = PrecisionPolicy({"hold_seconds": 60.0})
    # the fault was already there before the OOM: no count grows during the test
    assert actions(p.observe(0.0, engine(0.0), gpu(**fault))) == []
    ds = p.observe(5.0, engine(5.0, faults=[oom(1, 5.0)]), gpu(**fault))
    assert "degrade" not in actions(ds)
    assert ds[0].severity == "critical" and ds[0].inputs["handoff"] == "hardware"
    assert any("standing fault" in e for e in ds[0].inputs["hardware_evidence"])
    assert p.current.value == "full"


def test_clean_gpu_oom_still_degrades():
    p = PrecisionPolicy()
    ds = p.observe(5.0, engine(5.0, faults=[oom(1, 5.0)]),
                   gpu(ecc_uncorrected=0, ecc_uncorrected_aggregate=0, retired_pages_pending=False,
                       remapped_rows_pending=False, remapped_rows_failure=False))
    assert actions(ds) == ["degrade"]


def test_handed_over_oom_on_a_standing_gpu_drains_resets_and_stops_routing():
    hw = HardwarePolicy(None, HardwareConfig(), gpu_engines={0: ["e0"]})
    snap = gpu("GPU-0", 0, ecc_uncorrected=0, ecc_uncorrected_aggregate=2)
    assert hw.observe(0.0, reading(snap)) == []                  # history alone: no action
    assert hw.state()["gpus"]["GPU-0"]["routable"] is True       # aggregate only is not blocking
    pp = PrecisionPolicy()
    [note] = pp.observe(1.0, engine(1.0, faults=[oom(1, 1.0)]), snap)
    text = "; ".join([note.inputs["message"]] + note.inputs["hardware_evidence"])   # the dispatcher's hand-off text
    ds = hw.report_fault(1.0, "GPU-0", text)
    assert ds[0].to_state == "draining" and ("e0", "drain") in [(d.target, d.action) for d in ds]
    st = hw.state()["gpus"]["GPU-0"]
    assert st["routable"] is False and "draining" in st["routing_reason"]
    assert hw.engine_routing()["e0"]["routable"] is False


def test_first_sight_of_volatile_uncorrectable_errors_asks_for_a_reset():
    hw = HardwarePolicy(None, HardwareConfig(), gpu_engines={0: ["e0"]})
    ds = hw.observe(0.0, reading(gpu("GPU-0", 0, ecc_uncorrected=1)))
    assert ds[0].to_state == "draining" and "standing fault" in ds[0].reason
    assert hw.state()["gpus"]["GPU-0"]["standing_faults"] == {
        "ecc_uncorrected_volatile": "1 uncorrectable ECC error(s) since the last driver load"}


def test_failed_row_remap_on_a_handed_over_oom_isolates():
    hw = HardwarePolicy(None, HardwareConfig(), gpu_engines={0: ["e0"]})
    hw.observe(0.0, reading(gpu("GPU-0", 0)))
    hw._gpus["GPU-0"].standing = standing_faults(gpu(remapped_rows_failure=True))
    ds = hw.report_fault(1.0, "GPU-0", "CUDA out of memory.")
    assert ds[0].to_state == "isolated"


def test_volatile_counter_reset_is_not_negative_errors():
    assert counter_increase(5, 0) == (0, True)
    assert counter_increase(5, 2) == (2, True)
    assert counter_increase(2, 7) == (5, False)
    assert counter_increase(None, 7) == (None, False)
    hw = HardwarePolicy(None, HardwareConfig(), gpu_engines={0: ["e0"]})
    hw.observe(0.0, reading(gpu("GPU-0", 0, ecc_uncorrected=0)))
    hw._gpus["GPU-0"].ecc_uncorrected = 5                         # seen before a driver reload
    ds = hw.observe(1.0, reading(gpu("GPU-0", 0, ecc_uncorrected=0)))
    assert [d.action for d in ds] == [None] and "counter reset" in ds[0].reason
    assert hw.gpu_state("GPU-0") == "healthy"
    ds = hw.observe(2.0, reading(gpu("GPU-0", 0, ecc_uncorrected=1)))   # a new error after the reset
    assert ds[0].to_state == "draining" and "0 -> 1" in ds[0].reason
    p = PrecisionPolicy()
    p.observe(0.0, engine(0.0), gpu(ecc_uncorrected=4))
    ds = p.observe(1.0, engine(1.0, faults=[oom(1, 1.0)]), gpu(ecc_uncorrected=0))   # reset, then OOM
    assert actions(ds) == ["degrade"]


def test_correctable_storm_is_a_warning_with_a_rate_never_a_reset():
    hw = HardwarePolicy(None, HardwareConfig(ecc_correctable_storm_per_second=0.5,
                                             ecc_correctable_window_seconds=100.0),
                        gpu_engines={0: ["e0"]})
    out = []
    for i in range(0, 101, 10):                                   # +10 errors every 10 s = 1 error/s
        out += hw.observe(float(i), reading(gpu("GPU-0", 0, ecc_corrected=1000 + i)))
    storms = [d for d in out if "storm" in d.reason]
    assert len(storms) == 1 and storms[0].severity == "warning" and storms[0].action is None
    assert storms[0].inputs["ecc_corrected_per_second"] == pytest.approx(1.0)
    assert all(d.severity != "critical" and d.action is None for d in out)
    assert hw.gpu_state("GPU-0") == "healthy" and hw.state()["gpus"]["GPU-0"]["correctable_storm"] is True
    # a counter reset (driver reload) in the storm is not a negative rate
    r = CounterRate(100.0)
    assert [r.update(t, v) for t, v in ((0, 50), (50, 0), (60, 10))] == [None, 0.0, pytest.approx(10 / 60)]
