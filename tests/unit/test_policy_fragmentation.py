"""Fragmentation policy: above the threshold for the hold → drain_restart; rate-limited;
invalid samples reset the hold."""

from __future__ import annotations

import pytest

from inferctl.controller.policies import FragmentationConfig, FragmentationPolicy, FragmentationState
from inferctl.controller.signals import InvalidSampleCounter
from tests.policy_helpers import MiB, acts, engine

R = 1000 * MiB


def snap(t, frag, **kw):
    """Idle engine (running 0, waiting 0 unless given) with reserved 1000 MiB and the given
    fragmentation (None = nothing reserved)."""
    kw.setdefault("running", 0)
    kw.setdefault("waiting", 0)
    if frag is None:
        return engine(t, reserved=0, allocated=0, **kw)
    return engine(t, reserved=R, allocated=round(R * (1 - frag)), **kw)


def policy(**kw):
    cfg = dict(hold_seconds=60.0, min_interval_seconds=600.0, restart_timeout_seconds=120.0)
    cfg.update(kw)
    return FragmentationPolicy(FragmentationConfig(**cfg))


def test_restart_after_hold_above_threshold():
    p = policy()
    for t in range(0, 60, 10):
        assert p.observe(float(t), snap(t, 0.35)) == []
    ds = p.observe(60.0, snap(60, 0.35))
    assert acts(ds) == ["drain_restart"]
    d = ds[0]
    assert (d.from_state, d.to_state) == ("normal", "restarting")
    assert d.inputs["fragmentation_ratio"] == pytest.approx(0.35, abs=1e-6)
    assert d.inputs["held_seconds"] == 60.0 and d.inputs["unallocated"] == "350.00 MiB"
    assert "35.0%" in d.reason


def test_exactly_at_threshold_is_not_above():
    p = policy(hold_seconds=0.0)
    assert p.observe(0.0, snap(0, 0.30)) == []
    assert acts(p.observe(1.0, snap(1, 0.31))) == ["drain_restart"]


def test_dip_below_threshold_resets_the_hold():
    p = policy()
    p.observe(0.0, snap(0, 0.4))
    p.observe(50.0, snap(50, 0.2))
    assert p.observe(60.0, snap(60, 0.4)) == []
    assert p.observe(119.0, snap(119, 0.4)) == []
    assert acts(p.observe(120.0, snap(120, 0.4))) == ["drain_restart"]


@pytest.mark.parametrize("bad", ["nothing_reserved", "allocated_above_reserved", "nan",
                                 "engine_down"])
def test_invalid_samples_reset_the_hold(bad):
    c = InvalidSampleCounter()
    p = FragmentationPolicy(FragmentationConfig(hold_seconds=60.0), counter=c)
    p.observe(0.0, snap(0, 0.5))
    if bad == "nothing_reserved":
        s = snap(30, None)
    elif bad == "allocated_above_reserved":
        s = engine(30.0, reserved=R, allocated=2 * R)
    elif bad == "nan":
        s = engine(30.0, reserved=R, allocated=float("nan"))
    else:
        s = engine(30.0, ok=False)
    assert p.observe(30.0, s) == []
    assert p.state()["hold_started"] is None
    assert p.observe(60.0, snap(60, 0.5)) == []            # would have fired without the reset
    assert acts(p.observe(120.0, snap(120, 0.5))) == ["drain_restart"]
    expected_invalid = {"allocated_above_reserved": 1, "nan": 1}.get(bad, 0)
    assert c.count("fragmentation_ratio") == expected_invalid


def test_restart_confirmed_then_rate_limited_refusal_once_then_allowed():
    p = policy(hold_seconds=0.0, min_interval_seconds=600.0)
    assert acts(p.observe(0.0, snap(0, 0.5, raw={"engine": {"instance_id": "old"}}))) == ["drain_restart"]
    assert p.observe(5.0, engine(5.0, ok=False)) == []       # engine restarting
    # a new process (another instance id than the poll before the decision) reads low
    done = p.observe(20.0, snap(20, 0.05, raw={"engine": {"instance_id": "new"}}))
    assert done[0].to_state == "normal" and done[0].action is None
    assert p.current is FragmentationState.NORMAL
    refused = p.observe(100.0, snap(100, 0.6))
    assert len(refused) == 1 and refused[0].action is None
    assert "rate limit" in refused[0].reason and refused[0].inputs["next_allowed"] == 600.0
    assert p.observe(200.0, snap(200, 0.6)) == []             # refusal recorded once
    assert p.observe(599.0, snap(599, 0.6)) == []
    assert acts(p.observe(600.0, snap(600, 0.6))) == ["drain_restart"]


def test_unconfirmed_restart_times_out():
    p = policy(hold_seconds=0.0, restart_timeout_seconds=120.0)
    p.observe(0.0, snap(0, 0.5))
    assert p.observe(60.0, snap(60, 0.5)) == []
    ds = p.observe(120.0, snap(120, 0.5))
    assert ds[0].to_state == "normal" and ds[0].severity == "warning"


def test_configurable_threshold_and_minimum_unallocated():
    p = policy(threshold_ratio=0.5, hold_seconds=0.0)
    assert p.observe(0.0, snap(0, 0.45)) == []
    assert acts(p.observe(1.0, snap(1, 0.55))) == ["drain_restart"]
    q = FragmentationPolicy({"hold_seconds": 0.0, "min_unallocated_bytes": 500 * MiB})
    assert q.observe(0.0, snap(0, 0.4)) == []                # 400 MiB unallocated: too small
    with pytest.raises(ValueError, match="threshold_ratio"):
        FragmentationConfig(threshold_ratio=1.5)


def test_request_restart_from_another_policy_honours_the_rate_limit():
    p = policy(min_interval_seconds=600.0)
    d = p.request_restart(0.0, "fragmentation OOM recurred", {"fault_id": 3})
    assert d.action == "drain_restart" and d.inputs["fault_id"] == 3
    again = p.request_restart(10.0, "again")
    assert again.action is None and "in progress" in again.reason
