"""The rollback waits for the engine's queue to empty (field case: a drill under CI load rolled back
with 9 long prompts still queued from the pressure; the first of them ran out of memory 20 ms later
and the engine went back to int8 — a rollback that was wrong the moment it was made)."""

from __future__ import annotations

from inferctl.controller.policies import PrecisionConfig, PrecisionPolicy, PrecisionState
from tests.policy_helpers import THRESHOLD, actions, engine, free_of, oom

HIGH = free_of(THRESHOLD + 50_000)
LOW = free_of(THRESHOLD - 50_000)


def degraded() -> PrecisionPolicy:
    p = PrecisionPolicy(PrecisionConfig(hold_seconds=10.0, confirm_timeout_seconds=5.0))
    assert actions(p.observe(0.0, engine(0.0, faults=[oom(1, 0.0)]))) == ["degrade"]
    p.observe(1.0, engine(1.0, precision="int8", reserved=LOW))
    assert p.current is PrecisionState.INT8
    return p


def test_a_queue_defers_the_rollback_until_it_empties_with_one_note():
    p = degraded()
    got = {}
    for t in range(2, 20):                       # memory held from t=2; requests queued until t=16
        got[t] = p.observe(float(t), engine(float(t), precision="int8", reserved=HIGH,
                                            waiting=9 if t < 16 else 0, running=4))
    rollbacks = [t for t, ds in got.items() if "rollback" in actions(ds)]
    assert rollbacks == [16]                     # the hold was met at 12; the queue emptied at 16
    notes = [(t, d.reason) for t, ds in got.items() for d in ds if d.action is None]
    assert len(notes) == 1 and notes[0][0] == 12, notes
    assert "9 requests waiting" in notes[0][1] and notes[0][1].startswith("rollback deferred")
    d = next(d for d in got[16] if d.action == "rollback")
    assert d.inputs["held_seconds"] == 14.0 and d.inputs["waiting"] == 0
    assert d.from_state == "int8" and d.to_state == "rolling_back"


def test_a_queue_never_counts_as_a_rollback_while_memory_is_short():
    p = degraded()
    for t in range(2, 30):
        ds = p.observe(float(t), engine(float(t), precision="int8", reserved=LOW, waiting=0))
        assert "rollback" not in actions(ds) and not [d for d in ds if d.action is None]


def test_no_queue_count_leaves_the_decision_to_memory_alone():
    p = degraded()
    got = {t: p.observe(float(t), engine(float(t), precision="int8", reserved=HIGH, waiting=None))
           for t in range(2, 16)}
    assert [t for t, ds in got.items() if "rollback" in actions(ds)] == [12]
    assert got[12][0].inputs["waiting"] is None


def test_a_second_backlog_after_the_queue_emptied_is_noted_again():
    p = degraded()
    waiting = {12: 3, 13: 0, 14: 5}                # the hold is met at 12
    notes = []
    for t in range(2, 15):
        # memory dips at 13 (the hold restarts): the queue at 14 is a new deferral only after a new hold
        reserved = LOW if t == 13 else HIGH
        ds = p.observe(float(t), engine(float(t), precision="int8", reserved=reserved, waiting=waiting.get(t, 0)))
        notes += [t for d in ds if d.action is None]
        assert "rollback" not in actions(ds)
    assert notes == [12]
    for t in range(15, 30):
        ds = p.observe(float(t), engine(float(t), precision="int8", reserved=HIGH, waiting=2 if t < 26 else 0))
        notes += [t for d in ds if d.action is None]
        if "rollback" in actions(ds):
            break
    assert notes == [12, 24] and t == 26             # held again from 14 for 10 s
