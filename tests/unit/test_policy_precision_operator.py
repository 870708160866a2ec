"""PrecisionPolicy.operator_switch: a manual degrade/rollback moves the state machine, so the
policy follows the operator instead of undoing the switch. Time is passed explicitly."""

from __future__ import annotations

import pytest

from inferctl.controller.policies import PolicyError, PrecisionConfig, PrecisionPolicy, PrecisionState
from tests.policy_helpers import THRESHOLD, actions, engine, free_of, oom

HIGH = free_of(THRESHOLD + 50_000)     # more than the rollback threshold free
LOW = free_of(THRESHOLD - 50_000)


def policy(**kw) -> PrecisionPolicy:
    cfg = dict(hold_seconds=10.0, confirm_timeout_seconds=5.0, relapse_window_seconds=100.0,
               max_hold_seconds=80.0)
    cfg.update(kw)
    return PrecisionPolicy(PrecisionConfig(**cfg), engine="e0")


def to_int8_by_oom(p: PrecisionPolicy) -> None:
    assert actions(p.observe(0.0, engine(0.0, faults=[oom(1, 0.0)]))) == ["degrade"]
    p.observe(1.0, engine(1.0, precision="int8", reserved=LOW, faults=[oom(1, 0.0)]))
    assert p.current is PrecisionState.INT8


def test_manual_rollback_while_holding_int8_is_not_undone_without_a_new_oom():
    p = policy()
    to_int8_by_oom(p)
    [d] = p.operator_switch(2.0, "full", "alice")
    assert (d.from_state, d.to_state, d.action) == ("int8", "rolling_back", None)
    assert d.inputs["who"] == "alice" and "alice" in d.reason
    # the engine still reports int8 for a moment (the switch runs between steps): not adopted
    assert p.observe(2.5, engine(2.5, precision="int8", reserved=LOW, faults=[oom(1, 0.0)])) == []
    assert p.current is PrecisionState.ROLLING_BACK
    ds = p.observe(3.0, engine(3.0, precision="full", reserved=LOW, faults=[oom(1, 0.0)]))
    assert [(x.from_state, x.to_state) for x in ds] == [("rolling_back", "full")]
    # memory stays low, the old fault is still listed: no automatic re-degrade, however long
    for t in range(4, 200, 5):
        assert p.observe(float(t), engine(float(t), precision="full", reserved=LOW,
                                          faults=[oom(1, 0.0)])) == []
    assert p.current is PrecisionState.FULL
    # a new OOM degrades again (the operator's rollback did not make memory recover)
    ds = p.observe(200.0, engine(200.0, precision="full", faults=[oom(1, 0.0), oom(2, 199.5)]))
    assert actions(ds) == ["degrade"]


def test_new_oom_soon_after_a_manual_rollback_is_a_relapse():
    p = policy()
    to_int8_by_oom(p)
    p.operator_switch(2.0, "full", "alice")
    p.observe(3.0, engine(3.0, precision="full", reserved=LOW))
    [d] = p.observe(20.0, engine(20.0, precision="full", faults=[oom(2, 19.5)]))
    assert d.action == "degrade" and d.inputs["relapse"] is True and d.inputs["next_hold_seconds"] == 20.0


def test_manual_degrade_stays_int8_until_the_hold_has_passed():
    p = policy(hold_seconds=10.0)
    p.observe(0.0, engine(0.0, precision="full", reserved=HIGH))
    [d] = p.operator_switch(1.0, "int8", "bob")
    assert (d.from_state, d.to_state, d.action) == ("full", "degrading", None)
    assert "bob" in d.reason and d.inputs == {"who": "bob", "mode": "int8", "operator": True}
    # before the engine applies it, it still reports full: no "asking again" inside the timeout
    assert p.observe(1.5, engine(1.5, precision="full", reserved=HIGH)) == []
    ds = p.observe(2.0, engine(2.0, precision="int8", reserved=HIGH))
    assert [(x.from_state, x.to_state) for x in ds] == [("degrading", "int8")]
    rollback_at = []
    for t in range(3, 20):
        if "rollback" in actions(p.observe(float(t), engine(float(t), precision="int8", reserved=HIGH))):
            rollback_at.append(t)
            break
    assert rollback_at == [12]                   # held from the confirmation at t=2 for the 10 s hold
    assert p.state()["switches_last_hour"] == 0  # operator switches are not the flap guard's


def test_manual_degrade_in_int8_restarts_the_hold():
    p = policy(hold_seconds=10.0)
    to_int8_by_oom(p)
    for t in range(2, 8):
        p.observe(float(t), engine(float(t), precision="int8", reserved=HIGH))
    [d] = p.operator_switch(8.0, "int8", "carol")
    assert d.from_state == d.to_state == "int8" and "hold restarted" in d.reason
    first = next(t for t in range(9, 30)
                 if "rollback" in actions(p.observe(float(t), engine(float(t), precision="int8", reserved=HIGH))))
    assert first == 19                           # not 12: the hold started again at t=9


def test_manual_rollback_releases_a_pin():
    p = policy(max_switches_per_hour=1, relapse_window_seconds=0.0)
    to_int8_by_oom(p)
    p.operator_switch(2.0, "full", "alice")
    p.observe(3.0, engine(3.0, precision="full"))
    p.observe(4.0, engine(4.0, precision="full", faults=[oom(2, 3.9)]))
    assert p.current is PrecisionState.PINNED_INT8
    p.observe(5.0, engine(5.0, precision="int8", reserved=HIGH))
    [d] = p.operator_switch(6.0, "full", "dave")
    assert (d.from_state, d.to_state) == ("pinned_int8", "rolling_back")
    assert d.inputs["pinned_by"].startswith("flap guard") and "releases the pin" in d.reason
    p.observe(7.0, engine(7.0, precision="full"))
    assert p.current is PrecisionState.FULL and p.state()["pinned"] is False


def test_failed_manual_switch_returns_to_the_previous_state():
    p = policy()
    p.observe(0.0, engine(0.0, precision="full"))
    p.operator_switch(1.0, "int8", "bob")
    [d] = p.record_action_result(1.2, "degrade", False, "engine 503")
    assert (d.from_state, d.to_state) == ("degrading", "full")
    to_int8_by_oom(p)
    p.operator_switch(3.0, "full", "bob")
    [d] = p.record_action_result(3.2, "rollback", False, "engine 503")
    assert (d.from_state, d.to_state) == ("rolling_back", "int8")


def test_no_op_switches_are_records_and_bad_arguments_are_refused():
    p = policy()
    [d] = p.operator_switch(0.0, "full", "erin")
    assert d.from_state == d.to_state == "full" and d.action is None
    with pytest.raises(PolicyError, match="mode"):
        p.operator_switch(1.0, "fp8", "erin")
    with pytest.raises(PolicyError, match="who"):
        p.operator_switch(1.0, "int8", "")
