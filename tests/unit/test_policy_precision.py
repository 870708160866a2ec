"""Precision policy: degrade on exhaustion OOMs only, roll back after a held recovery, flap guard.

Time is passed explicitly; nothing sleeps.
"""

from __future__ import annotations

import pytest

from inferctl.controller.policies import (FragmentationPolicy, PolicyError, PrecisionConfig,
                                 PrecisionPolicy, PrecisionState)
from inferctl.controller.signals import InvalidSampleCounter
from inferctl.controller.types import XidEvent
from tests.policy_helpers import (BUDGET, GiB, MiB, THRESHOLD, actions, engine, free_of, gpu, oom)

F12_MSG = ("CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of "
           "31.40 GiB of which 41.56 MiB is free.")

HIGH = free_of(THRESHOLD + 50_000)     # reserved leaving more than the threshold free
LOW = free_of(THRESHOLD - 50_000)


def policy(**kw) -> PrecisionPolicy:
    cfg = dict(hold_seconds=10.0, confirm_timeout_seconds=5.0, relapse_window_seconds=100.0,
               max_hold_seconds=80.0)
    cfg.update(kw)
    return PrecisionPolicy(PrecisionConfig(**cfg))


def degrade_and_confirm(p, t0=0.0, fid=1):
    ds = p.observe(t0, engine(t0, faults=[oom(fid, t0)]))
    assert actions(ds) == ["degrade"]
    p.observe(t0 + 1, engine(t0 + 1, precision="int8", reserved=LOW))
    assert p.current is PrecisionState.INT8
    return ds[0]


# --------------------------------------------------------------------------- F12
def test_f12_exactly_one_degrade_with_free_and_requested_in_bytes_and_words():
    p = policy()
    fault = {"id": 7, "time": 100.0, "kind": "exhaustion", "message": F12_MSG,
             "precision": "full", "source": "cuda"}        # numbers only in the message
    all_ds = []
    for t in (100.5, 101.0, 101.5):                          # the same fault on three polls
        all_ds += p.observe(t, engine(t, faults=[fault]))
    degrades = [d for d in all_ds if d.action == "degrade"]
    assert len(degrades) == 1
    d = degrades[0]
    assert (d.from_state, d.to_state) == ("full", "degrading")
    assert d.inputs["free_bytes"] == round(41.56 * MiB) and d.inputs["free"] == "41.56 MiB"
    assert d.inputs["requested_bytes"] == 96 * MiB and d.inputs["requested"] == "96.00 MiB"
    assert d.inputs["total_bytes"] == round(31.40 * GiB)
    assert "96.00 MiB requested" in d.reason and "41.56 MiB free" in d.reason
    assert d.severity == "warning" and d.policy == "precision" and d.target == "e0"


def test_several_new_faults_in_one_poll_make_one_degrade():
    p = policy()
    ds = p.observe(5.0, engine(5.0, faults=[oom(1, 4.0), oom(2, 4.5), oom(3, 4.9)]))
    assert actions(ds) == ["degrade"]
    assert ds[0].inputs["fault_ids"] == [1, 2, 3]


def test_engine_restart_reusing_fault_ids_is_still_new():
    p = policy()
    degrade_and_confirm(p, 0.0, fid=1)
    p.observe(2.0, engine(2.0, precision="int8", reserved=HIGH))
    p.observe(20.0, engine(20.0, precision="int8", reserved=HIGH))      # rollback decided
    p.observe(21.0, engine(21.0, precision="full", reserved=HIGH))      # confirmed
    assert p.current is PrecisionState.FULL
    # the engine restarted: its fault ids start at 1 again, at a new time
    ds = p.observe(300.0, engine(300.0, faults=[oom(1, 299.0)]))
    assert actions(ds) == ["degrade"]


def test_faults_older_than_max_age_are_history():
    p = policy(fault_max_age_seconds=300.0)
    assert p.observe(1000.0, engine(1000.0, faults=[oom(1, 500.0)])) == []
    assert p.current is PrecisionState.FULL


# --------------------------------------------------------------------------- kinds, F13
def test_fragmentation_oom_compacts_without_switch():
    p = policy()
    ds = p.observe(1.0, engine(1.0, faults=[oom(1, 1.0, "fragmentation",
                                                   reserved_unallocated_bytes=200 * MiB)]))
    assert actions(ds) == ["compact"]
    assert p.current is PrecisionState.FULL
    assert "200.00 MiB" in ds[0].reason


def test_fault_without_kind_is_classified_from_its_message():
    msg = ("CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity of "
           "15.77 GiB of which 514.19 MiB is free. Of the allocated memory 13.73 GiB is allocated "
           "by PyTorch, and 736.86 MiB is reserved by PyTorch but unallocated.")
    p = policy()
    ds = p.observe(1.0, engine(1.0, faults=[{"id": 1, "time": 1.0, "message": msg}]))
    assert actions(ds) == ["compact"] and ds[0].inputs["kind"] == "fragmentation"


def test_recurring_fragmentation_oom_asks_fragmentation_policy_for_a_rate_limited_restart():
    frag = FragmentationPolicy({"min_interval_seconds": 600.0})
    p = PrecisionPolicy(PrecisionConfig(compact_window_seconds=300.0), fragmentation=frag)
    f = dict(kind="fragmentation", reserved_unallocated_bytes=200 * MiB)
    assert actions(p.observe(1.0, engine(1.0, faults=[oom(1, 1.0, **f)]))) == ["compact"]
    ds = p.observe(50.0, engine(50.0, faults=[oom(2, 50.0, **f)]))
    assert actions(ds) == ["drain_restart"] and ds[0].policy == "fragmentation"
    assert p.current is PrecisionState.FULL


def test_impossible_request_is_rejected_without_switch():
    p = policy()
    ds = p.observe(1.0, engine(1.0, faults=[oom(1, 1.0, "impossible",
                                                   requested=round(124.68 * GiB),
                                                   total_bytes=round(95.22 * GiB))]))
    assert len(ds) == 1 and ds[0].action is None
    assert "rejected request" in ds[0].reason and "124.68 GiB" in ds[0].reason
    assert p.current is PrecisionState.FULL


# --------------------------------------------------------------------------- hardware, never int8
@pytest.mark.parametrize("message", [
    "CUDA out of memory (NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.)",
    "out of memory: GPU is lost",
    "CUDA error: uncorrectable ECC error encountered",
])
def test_hardware_text_is_never_a_degrade_even_when_labelled_oom(message):
    p = policy()
    ds = p.observe(1.0, engine(1.0, faults=[oom(1, 1.0, "exhaustion", message=message)]))
    assert "degrade" not in actions(ds)
    assert ds[0].inputs["handoff"] == "hardware" and ds[0].severity == "critical"
    assert p.current is PrecisionState.FULL


def test_gpu_snapshot_evidence_blocks_the_degrade():
    lost = policy()
    ds = lost.observe(1.0, engine(1.0, faults=[oom(1, 1.0)]), gpu(lost=True))
    assert "degrade" not in actions(ds) and "lost" in ds[0].reason
    xid = policy()
    ev = XidEvent(xid=48, pci_bus_id="0000:40:00.0", message="Double Bit ECC Error", time=0.5)
    ds = xid.observe(1.0, engine(1.0, faults=[oom(1, 1.0)]), gpu(xids=[ev]))
    assert "degrade" not in actions(ds) and "Xid 48" in ds[0].reason
    ecc = policy()
    ecc.observe(0.0, engine(0.0), gpu(ecc_uncorrected=0))
    ds = ecc.observe(1.0, engine(1.0, faults=[oom(1, 1.0)]), gpu(ecc_uncorrected=2))
    assert "degrade" not in actions(ds) and "ECC" in ds[0].reason


def test_benign_xid_does_not_block_a_real_exhaustion():
    p = policy()
    ev = XidEvent(xid=43, pci_bus_id="0000:40:00.0", message="GPU stopped processing", time=0.5)
    ds = p.observe(1.0, engine(1.0, faults=[oom(1, 1.0)]), gpu(xids=[ev]))
    assert actions(ds) == ["degrade"]


# --------------------------------------------------------------------------- confirmation
def test_degrade_confirmed_by_engine_and_reissued_if_not():
    p = policy(confirm_timeout_seconds=5.0)
    p.observe(0.0, engine(0.0, faults=[oom(1, 0.0)]))
    assert p.observe(3.0, engine(3.0)) == []                 # still full, within the timeout
    again = p.observe(5.0, engine(5.0))
    assert actions(again) == ["degrade"] and "asking again" in again[0].reason
    ds = p.observe(6.0, engine(6.0, precision="int8"))
    assert (ds[0].from_state, ds[0].to_state, ds[0].action) == ("degrading", "int8", None)


def test_failed_degrade_returns_to_full():
    p = policy()
    p.observe(0.0, engine(0.0, faults=[oom(1, 0.0)]))
    ds = p.record_action_result(0.5, "degrade", False, "HTTP 503")
    assert ds[0].to_state == "full" and ds[0].severity == "critical"


def test_engine_restart_in_int8_reapplies_int8():
    p = policy()
    degrade_and_confirm(p)
    ds = p.observe(5.0, engine(5.0, precision="full", reserved=LOW))
    assert actions(ds) == ["degrade"] and ds[0].to_state == "degrading"


# --------------------------------------------------------------------------- rollback
def test_rollback_only_after_free_memory_held_above_threshold():
    p = policy(hold_seconds=10.0, confirm_timeout_seconds=5.0)
    degrade_and_confirm(p)                                   # INT8 at t=1
    got = {}
    for t in range(2, 16):
        got[t] = p.observe(float(t), engine(float(t), precision="int8", reserved=HIGH))
    rollbacks = [t for t, ds in got.items() if "rollback" in actions(ds)]
    assert rollbacks == [12]                                 # held from t=2 for 10 s
    d = got[12][0]
    assert (d.from_state, d.to_state) == ("int8", "rolling_back")
    assert d.inputs["threshold_bytes"] == THRESHOLD
    assert d.inputs["extra_weights_bytes"] == 300_000 and d.inputs["margin_bytes"] == 100_000
    assert d.inputs["held_seconds"] == 10.0
    ds = p.observe(16.0, engine(16.0, precision="full", reserved=HIGH))
    assert ds[0].to_state == "full" and p.current is PrecisionState.FULL


def test_unconfirmed_rollback_returns_to_int8_and_holds_again():
    p = policy(hold_seconds=10.0, confirm_timeout_seconds=5.0)
    degrade_and_confirm(p)
    for t in range(2, 13):
        p.observe(float(t), engine(float(t), precision="int8", reserved=HIGH))
    assert p.current is PrecisionState.ROLLING_BACK          # decided at t=12
    ds = p.observe(17.0, engine(17.0, precision="int8", reserved=HIGH))
    assert (ds[0].from_state, ds[0].to_state) == ("rolling_back", "int8")
    assert ds[0].severity == "warning" and "hold restarts" in ds[0].reason
    assert "rollback" not in actions(p.observe(26.0, engine(26.0, precision="int8",
                                                            reserved=HIGH)))
    assert "rollback" in actions(p.observe(27.0, engine(27.0, precision="int8", reserved=HIGH)))


def test_free_exactly_at_threshold_counts_and_just_below_does_not():
    below = policy(hold_seconds=0.0)
    degrade_and_confirm(below)
    assert below.observe(5.0, engine(5.0, precision="int8",
                                     reserved=free_of(THRESHOLD - 1))) == []
    at = policy(hold_seconds=0.0)
    degrade_and_confirm(at)
    assert actions(at.observe(5.0, engine(5.0, precision="int8",
                                          reserved=free_of(THRESHOLD)))) == ["rollback"]


def test_oscillating_memory_never_ping_pongs():
    """Free memory alternates above/below the threshold every 3 s for a minute, then stays
    high: one degrade, no rollback while it oscillates, one rollback a hold after it settles."""
    p = policy(hold_seconds=10.0)
    timeline: list[tuple[float, str]] = []

    def step(t: float, reserved: int, **kw) -> None:
        for d in p.observe(t, engine(t, reserved=reserved, **kw)):
            if d.action:
                timeline.append((t, d.action))

    step(0.0, LOW, faults=[oom(1, 0.0)])
    lows = []
    for t in range(1, 61):
        high = (t // 3) % 2 == 0
        if not high:
            lows.append(t)
        step(float(t), HIGH if high else LOW, precision="int8")
    assert timeline == [(0.0, "degrade")]
    for t in range(61, 100):
        step(float(t), HIGH, precision="int8")
        if timeline[-1][1] == "rollback":
            break
    settled = max(lows) + 1                     # first high sample after the last low one
    assert timeline == [(0.0, "degrade"), (float(settled + 10), "rollback")]


@pytest.mark.parametrize("bad", ["telemetry_down", "free_none", "free_negative", "free_nan",
                                 "engine_down"])
def test_missing_or_invalid_memory_sample_resets_the_hold(bad):
    """F08 (telemetry down) and F01 (invalid sample): no data is not recovery."""
    counter = InvalidSampleCounter()
    p = PrecisionPolicy(PrecisionConfig(hold_seconds=10.0), counter=counter)
    p.observe(0.0, engine(0.0, faults=[oom(1, 0.0)]), gpu(free=1 * GiB))
    p.observe(1.0, engine(1.0, precision="int8"), gpu(free=14 * GiB))   # INT8, hold starts
    for t in range(2, 8):
        assert p.observe(float(t), engine(float(t), precision="int8"), gpu(free=14 * GiB)) == []
    t = 8.0
    if bad == "telemetry_down":
        ds = p.observe(t, engine(t, precision="int8"), None, telemetry_ok=False)
    elif bad == "free_none":
        ds = p.observe(t, engine(t, precision="int8"), gpu(free=None, used=1))
    elif bad == "free_negative":
        ds = p.observe(t, engine(t, precision="int8"), gpu(free=-5, used=1))
    elif bad == "free_nan":
        ds = p.observe(t, engine(t, precision="int8"), gpu(free=float("nan"), used=1))
    else:
        ds = p.observe(t, engine(t, precision="int8", ok=False), gpu(free=14 * GiB))
    assert ds == [] and p.state()["hold_started"] is None
    assert p.state()["last_hold_reset"]["time"] == 8.0
    # without the reset, t=11 would roll back (held since 1); with it, the earliest is 19
    for t in range(9, 19):
        assert "rollback" not in actions(p.observe(float(t), engine(float(t), precision="int8"),
                                                   gpu(free=14 * GiB)))
    assert "rollback" in actions(p.observe(19.0, engine(19.0, precision="int8"),
                                           gpu(free=14 * GiB)))
    if bad in ("free_negative", "free_nan"):
        assert counter.count("gpu_memory_free_bytes") == 1


def test_f11_idle_baseline_does_not_block_recovery():
    # RTX 3060: total 12288 MiB, used 116, reserved 368, free 11806; full weights 4 GiB more
    p = PrecisionPolicy(PrecisionConfig(hold_seconds=5.0, full_weights_extra_bytes=4 * GiB))
    snap = dict(total=12288 * MiB, free=11806 * MiB, used=116 * MiB,
                memory_reserved_bytes=368 * MiB)
    p.observe(0.0, engine(0.0, faults=[oom(1, 0.0)]), gpu(**snap))
    p.observe(1.0, engine(1.0, precision="int8"), gpu(**snap))
    ds = p.observe(6.0, engine(6.0, precision="int8"), gpu(**snap))
    assert actions(ds) == ["rollback"]
    assert ds[0].inputs["threshold_bytes"] == pytest.approx(4 * GiB + 0.1 * 12288 * MiB)
    assert ds[0].inputs["memory_source"] == "gpu"


def test_new_oom_in_int8_resets_hold_without_switch():
    p = policy(hold_seconds=10.0)
    degrade_and_confirm(p)
    p.observe(2.0, engine(2.0, precision="int8", reserved=HIGH))
    ds = p.observe(9.0, engine(9.0, precision="int8", reserved=HIGH,
                               faults=[oom(1, 0.0), oom(2, 8.5)]))
    assert actions(ds) == [] and ds[0].severity == "warning" and "in int8" in ds[0].reason
    assert "rollback" not in actions(p.observe(12.0, engine(12.0, precision="int8",
                                                            reserved=HIGH)))
    assert "rollback" in actions(p.observe(19.0, engine(19.0, precision="int8", reserved=HIGH)))


def test_unknown_weight_sizes_never_roll_back():
    p = policy(hold_seconds=0.0)
    p.observe(0.0, engine(0.0, faults=[oom(1, 0.0)]))
    p.observe(1.0, engine(1.0, precision="int8", full_weights_bytes=None))
    assert p.observe(5.0, engine(5.0, precision="int8", full_weights_bytes=None,
                                 reserved=0)) == []
    assert "weight size unknown" in p.state()["last_hold_reset"]["reason"]


# --------------------------------------------------------------------------- flap guard
#: These tests exercise the relapse hold and the hourly pin alone: the ping-pong guard (a cap on
#: switches per window, a pin per size class: test_policy_precision_pingpong.py) is lifted.
NO_PINGPONG_GUARD = {"max_switches_per_window": 1000, "pin_after_class_relapses": 1000}
def _cycle(p, t, fid, hold):
    """OOM at t (degrade), confirm at t+1, memory high from t+1, rollback after ``hold``,
    confirm. Returns (degrade decision, rollback time, time after the cycle)."""
    ds = p.observe(t, engine(t, faults=[oom(fid, t)]))
    deg = [d for d in ds if d.action == "degrade"][0]
    p.observe(t + 1, engine(t + 1, precision="int8", reserved=HIGH))
    rb = None
    for k in range(1, int(hold) + 5):
        now = t + 1 + k
        if "rollback" in actions(p.observe(now, engine(now, precision="int8", reserved=HIGH))):
            rb = now
            break
    p.observe(rb + 1, engine(rb + 1, reserved=HIGH))       # confirmed full
    return deg, rb, rb + 2


def test_relapse_doubles_the_hold_up_to_the_cap():
    p = policy(hold_seconds=10.0, max_hold_seconds=35.0, max_switches_per_hour=10, **NO_PINGPONG_GUARD)
    d1, rb1, t = _cycle(p, 0.0, 1, 10)
    assert d1.inputs["relapse"] is False and rb1 == 0.0 + 1 + 1 + 10 - 1
    d2, rb2, t2 = _cycle(p, t + 5, 2, 20)      # OOM 5 s after the rollback: a relapse
    assert d2.inputs["relapse"] is True and d2.inputs["next_hold_seconds"] == 20.0
    assert rb2 - (t + 5 + 1) == 20              # hold from the first high sample (t+6)
    assert p.state()["relapses"] == 1
    d3, rb3, t3 = _cycle(p, t2 + 5, 3, 40)
    assert d3.inputs["relapses"] == 2
    assert d3.inputs["next_hold_seconds"] == 35.0          # 40 capped at 35
    assert rb3 - (t2 + 5 + 1) == 35
    # a degrade long after the relapse window is not a relapse: the hold is back to base
    d4, rb4, _ = _cycle(p, t3 + 500, 4, 10)
    assert d4.inputs["relapse"] is False and d4.inputs["next_hold_seconds"] == 10.0
    assert rb4 - (t3 + 500 + 1) == 10


def test_relapse_hold_measured_from_recovery():
    p = policy(hold_seconds=10.0, max_switches_per_hour=10, **NO_PINGPONG_GUARD)
    _, _, t = _cycle(p, 0.0, 1, 10)
    p.observe(t + 5, engine(t + 5, faults=[oom(2, t + 5)]))
    start = t + 6
    p.observe(start, engine(start, precision="int8", reserved=HIGH))    # hold starts
    assert "rollback" not in actions(p.observe(start + 19, engine(start + 19, precision="int8",
                                                                  reserved=HIGH)))
    assert "rollback" in actions(p.observe(start + 20, engine(start + 20, precision="int8",
                                                              reserved=HIGH)))


def test_more_than_max_switches_per_hour_pins_int8_until_operator_unpins():
    p = policy(hold_seconds=1.0, max_hold_seconds=1.0, max_switches_per_hour=4, **NO_PINGPONG_GUARD,
               relapse_window_seconds=0.0)
    t = 0.0
    for fid in range(1, 5):                               # four full cycles in minutes
        d, _, t = _cycle(p, t, fid, 1)
        assert d.to_state == "degrading"
    ds = p.observe(t, engine(t, faults=[oom(5, t)]))      # the fifth degrade within the hour
    assert actions(ds) == ["degrade"]
    assert ds[0].to_state == "pinned_int8" and ds[0].severity == "critical"
    assert ds[0].inputs["switches_last_hour"] == 5
    st = p.state()
    assert st["pinned"] is True and st["switches_last_hour"] == 5
    # memory recovers for a long time: no rollback while pinned
    for k in range(1, 200):
        assert "rollback" not in actions(p.observe(t + k, engine(t + k, precision="int8",
                                                                 reserved=HIGH)))
    ud = p.unpin(t + 200, "alice")
    assert (ud[0].from_state, ud[0].to_state) == ("pinned_int8", "int8")
    assert "alice" in ud[0].reason
    p.observe(t + 201, engine(t + 201, precision="int8", reserved=HIGH))
    assert "rollback" in actions(p.observe(t + 202, engine(t + 202, precision="int8",
                                                           reserved=HIGH)))
    with pytest.raises(PolicyError, match="not pinned"):
        p.unpin(t + 300, "alice")


def test_switches_older_than_an_hour_do_not_count():
    p = policy(hold_seconds=1.0, max_hold_seconds=1.0, max_switches_per_hour=2, **NO_PINGPONG_GUARD,
               relapse_window_seconds=0.0)
    _, _, t = _cycle(p, 0.0, 1, 1)
    _, _, t = _cycle(p, t, 2, 1)
    d, _, _ = _cycle(p, 3700.0, 3, 1)                     # first two fell out of the hour
    assert d.to_state == "degrading"


def test_pinned_engine_reporting_full_is_sent_back_to_int8():
    p = policy(hold_seconds=1.0, max_hold_seconds=1.0, max_switches_per_hour=1, **NO_PINGPONG_GUARD,
               relapse_window_seconds=0.0)
    _, _, t = _cycle(p, 0.0, 1, 1)
    p.observe(t, engine(t, faults=[oom(2, t)]))
    assert p.current is PrecisionState.PINNED_INT8
    ds = p.observe(t + 10, engine(t + 10, precision="full"))
    assert actions(ds) == ["degrade"] and ds[0].to_state == "pinned_int8"


# --------------------------------------------------------------------------- misc
def test_state_dict_for_status():
    p = policy()
    degrade_and_confirm(p)
    st = p.state(3.0)
    assert st["state"] == "int8" and st["since"] == 1.0 and st["hold_seconds"] == 10.0
    assert st["relapses"] == 0 and st["switches_last_hour"] == 1 and st["pinned"] is False
    assert st["last_fault"]["requested"] == "96.00 MiB"


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="hold_seconds"):
        PrecisionConfig(hold_seconds=-1)
    with pytest.raises(ValueError, match="max_switches_per_hour"):
        PrecisionConfig(max_switches_per_hour=0)
    with pytest.raises(ValueError, match="bogus"):
        PrecisionPolicy({"bogus": 1})
    assert PrecisionPolicy({"enabled": True, "hold_seconds": 5}).config.hold_seconds == 5


def test_snapshot_of_another_engine_is_refused():
    p = policy()
    p.observe(0.0, engine(0.0))
    with pytest.raises(ValueError, match="engine"):
        p.observe(1.0, engine(1.0, name="other"))


def test_adopts_int8_started_outside_the_policy():
    p = policy()
    ds = p.observe(0.0, engine(0.0, precision="int8", reserved=LOW))
    assert ds[0].to_state == "int8" and ds[0].action is None
    assert BUDGET > THRESHOLD


def test_reusable_allocator_cache_counts_as_rollback_headroom():
    """An engine under steady light load is never idle, so its caching allocator keeps the
    peak's activation segments reserved: free = budget − reserved stays below the threshold
    although 200,000 B of the reserved bytes are unused and reusable by the engine. Those
    count (free + reserved − allocated); a missing ``allocated`` counts nothing."""
    reserved = free_of(THRESHOLD - 50_000)             # free alone is 50,000 B short
    cached = engine(0.0, precision="int8", reserved=reserved, allocated=reserved - 200_000)
    p = policy(hold_seconds=10.0, confirm_timeout_seconds=5.0)
    degrade_and_confirm(p)
    got = {t: p.observe(float(t), engine(float(t), precision="int8", reserved=reserved,
                                         allocated=cached.memory_allocated_bytes)) for t in range(2, 14)}
    rollbacks = [t for t, ds in got.items() if "rollback" in actions(ds)]
    assert rollbacks == [12]
    d = got[12][0]
    assert d.inputs["free_bytes"] == THRESHOLD - 50_000
    assert d.inputs["reclaimable_bytes"] == 200_000
    assert d.inputs["headroom_bytes"] == THRESHOLD + 150_000
    # the same poll without the allocator's numbers: no headroom is assumed, no rollback
    q = policy(hold_seconds=10.0, confirm_timeout_seconds=5.0)
    degrade_and_confirm(q)
    later = [q.observe(float(t), engine(float(t), precision="int8", reserved=reserved, allocated=None))
             for t in range(2, 30)]
    assert not any("rollback" in actions(ds) for ds in later)
    # allocated above reserved is inconsistent: counts nothing either
    r = policy(hold_seconds=10.0, confirm_timeout_seconds=5.0)
    degrade_and_confirm(r)
    bad = [r.observe(float(t), engine(float(t), precision="int8", reserved=reserved, allocated=reserved + 1))
           for t in range(2, 30)]
    assert not any("rollback" in actions(ds) for ds in bad)
