"""A restart is done only when a NEW engine process answers (issue 9, hole 1): a failed poll
(a busy engine's timeout) followed by a good poll of the OLD process is not a restart, for the
fragmentation policy's watch nor for the rolling restart's own result (controller/restart_proof.py)."""

from __future__ import annotations

import dataclasses

import pytest

from inferctl.controller.actions import Actions
from inferctl.controller.events import EventLog
from inferctl.controller.metrics import build_registry
from inferctl.controller.policies import FragmentationConfig, FragmentationPolicy, FragmentationState
from inferctl.controller.policies.liveness import EngineLiveness, instance_id_of, restart_evidence
from inferctl.controller.restart_proof import prove_restart
from inferctl.controller.state import ControllerState
from inferctl.controller.types import Decision
from tests.controller_helpers import FakeEngineClient
from tests.policy_helpers import MiB, acts, engine

R = 1000 * MiB


def snap(t, frag, instance=None, **kw):
    """An idle engine at ``frag`` fragmentation, reporting ``engine.instance_id`` ``instance``."""
    raw = {"engine": {"instance_id": instance}} if instance else kw.pop("raw", None)
    return engine(t, reserved=R, allocated=round(R * (1 - frag)), running=0, waiting=0, raw=raw, **kw)


def policy():
    return FragmentationPolicy(FragmentationConfig(hold_seconds=0.0, min_interval_seconds=600.0,
                                                   restart_timeout_seconds=120.0))


# ------------------------------------------------------------------ the fragmentation policy's watch
def test_a_failed_poll_then_the_old_process_reading_low_is_not_a_restart():
    p = policy()
    assert acts(p.observe(0.0, snap(0, 0.5, "old"))) == ["drain_restart"]
    assert p.observe(1.0, engine(1.0, ok=False, error="timed out after 0.8 s")) == []   # busy: poll timed out
    # the same process, drained and idle: its allocator reads 0 % before any restart
    assert p.observe(2.0, snap(2, 0.0, "old")) == []
    assert p.current is FragmentationState.RESTARTING


def test_a_new_process_reading_low_ends_the_restart_with_its_evidence():
    p = policy()
    p.observe(0.0, snap(0, 0.5, "old"))
    p.observe(1.0, engine(1.0, ok=False))
    [done] = p.observe(3.0, snap(3, 0.0, "new"))
    assert (done.from_state, done.to_state) == ("restarting", "normal")
    assert "new engine process" in done.reason
    assert done.inputs["evidence"] == [{"signal": "instance_id", "before": "old", "after": "new"}]


def test_without_any_identity_only_the_action_result_ends_the_restart():
    p = policy()
    p.observe(0.0, snap(0, 0.5))
    p.observe(1.0, engine(1.0, ok=False))
    assert p.observe(2.0, snap(2, 0.0)) == []                  # nothing proves a new process
    [done] = p.record_action_result(3.0, "drain_restart", True, "restarted, a new process answers")
    assert done.to_state == "normal" and p.current is FragmentationState.NORMAL


# ------------------------------------------------------------------ the evidence
def test_instance_ids_decide_over_counters_and_uptime():
    a = engine(0.0, steps_total=100.0, raw={"engine": {"instance_id": "x", "uptime_seconds": 50.0}})
    b = engine(1.0, steps_total=3.0, raw={"engine": {"instance_id": "x", "uptime_seconds": 1.0}})
    assert instance_id_of(a) == "x" and restart_evidence(a, b) == []        # the same process
    c = dataclasses.replace(b, raw={"engine": {"instance_id": "y"}})
    assert restart_evidence(a, c) == [{"signal": "instance_id", "before": "x", "after": "y"}]
    no_id = dataclasses.replace(b, raw={"engine": {"uptime_seconds": 1.0}})
    assert [e["signal"] for e in restart_evidence(a, no_id)] == ["uptime_seconds", "steps_total"]


def test_liveness_names_an_instance_id_change_as_a_restart():
    live = EngineLiveness(engine="e0")
    live.observe(0.0, engine(0.0, name="e0", raw={"engine": {"instance_id": "aaa"}}))
    [d] = live.observe(1.0, engine(1.0, name="e0", raw={"engine": {"instance_id": "bbb"}}))
    assert "instance_id aaa → bbb" in d.reason and live.counts["restarts"] == 1


def test_prove_restart_same_id_fails_changed_id_or_pid_passes():
    old, same, new = (engine(0.0, raw={"engine": {"instance_id": i}}) for i in ("a", "a", "b"))
    assert not prove_restart(old, same, 10, 11).ok
    proof = prove_restart(old, new, 10, 11)
    assert proof.ok and proof.verified_by == "instance_id"
    fallback = prove_restart(None, new, 10, 11)
    assert fallback.ok and fallback.verified_by == "pid" and "10 → 11" in fallback.message


# ------------------------------------------------------------------ the rolling restart's own result
class IdClient(FakeEngineClient):
    """A fake engine reporting ``engine.instance_id`` (``instance``) and a model."""

    def __init__(self, name, instance):
        super().__init__(name)
        self.instance = instance

    def poll(self, now):
        s = super().poll(now)
        return dataclasses.replace(s, model="stories", raw={"engine": {"instance_id": self.instance}})


class Sup:
    def __init__(self, client, changes_process):
        self.client, self.changes = client, changes_process
        self.pid, self.running, self.hold_state, self.restarts = 100, True, None, 0

    def restart(self):
        self.restarts += 1
        self.pid += 1
        if self.changes:
            self.client.instance = f"new-{self.restarts}"

    def reset_crash_guard(self):
        return 0

    def wait_ready(self, timeout):
        return True


@pytest.fixture
def rolled(tmp_path):
    def run(changes_process):
        _, metrics = build_registry()
        log = EventLog(tmp_path / f"ev{int(changes_process)}.db", metrics=metrics)
        clients = {"a": IdClient("a", "old"), "b": IdClient("b", "b0")}
        st = ControllerState(list(clients))
        for n, c in clients.items():
            st.record_engine(n, c.poll(0.0))
        sups = {"a": Sup(clients["a"], changes_process)}
        actions = Actions(clients, supervisors=sups, event_log=log, metrics=metrics, state=st,
                          drain_timeout_seconds=1, quiet_wait_seconds=0.2, poll_interval_seconds=0.01,
                          confirm_timeout_seconds=0.1)
        res = actions.execute(Decision("fragmentation", "a", "drain_restart", None, None, "test", {}))
        return res, log, actions
    return run


def test_a_restart_after_which_the_same_process_answers_is_not_done(rolled):
    res, log, actions = rolled(False)
    assert not res.ok and "did not take" in res.message and res.details["restart_verified_by"] == "instance_id"
    steps = [e["inputs"]["step"] for e in log.query(kind="step")]
    assert steps[-1] == "not_restarted" and actions.rail.held() == {}     # back in rotation, not held


def test_a_restart_proven_by_a_new_instance_id_is_done(rolled):
    res, log, _ = rolled(True)
    assert res.ok, res.message
    assert res.details["restart_verified_by"] == "instance_id"
    assert res.details["evidence"] == [{"signal": "instance_id", "before": "old", "after": "new-1"}]
    assert [e["inputs"]["step"] for e in log.query(kind="step")][-1] == "in_rotation"
