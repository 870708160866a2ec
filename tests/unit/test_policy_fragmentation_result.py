"""Fragmentation policy and the drain_restart's result (issue 9, a fragmentation restart rolled
through the fleet rails): a drained engine's low sample is not a finished restart; a restart the
rails postponed goes back to NORMAL without counting against the rate limit; a done one ends
RESTARTING at once."""

from __future__ import annotations

from inferctl.controller.policies import FragmentationConfig, FragmentationPolicy, FragmentationState
from tests.policy_helpers import MiB, acts, engine

R = 1000 * MiB


def snap(t, frag, running=0):
    return engine(t, reserved=R, allocated=round(R * (1 - frag)), running=running, waiting=0)


def policy(**kw):
    return FragmentationPolicy(FragmentationConfig(**{"hold_seconds": 0.0, "min_interval_seconds": 600.0,
                                                      "restart_timeout_seconds": 120.0, **kw}))


def test_a_drained_engine_reading_low_before_its_restart_is_not_a_finished_restart():
    p = policy()
    assert acts(p.observe(0.0, engine(0.0, reserved=R, allocated=R // 2, running=0, waiting=0,
                                      raw={"engine": {"uptime_seconds": 900.0}}))) == ["drain_restart"]
    # drained, idle, its allocator cache released: 0 % while the old process still runs
    assert p.observe(1.0, snap(1, 0.0)) == []
    assert p.current is FragmentationState.RESTARTING
    assert p.observe(2.0, engine(2.0, ok=False)) == []         # the restart: down
    [done] = p.observe(3.0, engine(3.0, reserved=R, allocated=R, running=0, waiting=0,
                                   raw={"engine": {"uptime_seconds": 0.5}}))   # a new process: uptime reset
    assert done.to_state == "normal" and "restart done" in done.reason


def test_a_postponed_restart_does_not_count_against_the_rate_limit():
    p = policy(confirm_idle=False)
    assert acts(p.observe(0.0, snap(0, 0.5, running=4))) == ["drain_restart"]
    [d] = p.record_action_result(30.0, "drain_restart", False, "restart postponed: rails.max_unavailable is 1")
    assert (d.from_state, d.to_state, d.severity) == ("restarting", "normal", "warning")
    assert "not done" in d.reason and "max_unavailable" in d.reason
    assert p.state()["last_restart"] is None
    # still fragmented: decided again (not refused by the 600 s rate limit)
    assert acts(p.observe(31.0, snap(31, 0.5, running=4))) == ["drain_restart"]


def test_a_done_restart_ends_restarting_and_starts_the_rate_limit():
    p = policy(confirm_idle=False)
    p.observe(0.0, snap(0, 0.5, running=4))
    [d] = p.record_action_result(25.0, "drain_restart", True, "engine main-0 drained, restarted and ready")
    assert d.to_state == "normal" and d.reason.startswith("restart done: engine main-0")
    # the restarted engine, busy again, reads high at once: refused by the rate limit, not restarted
    [r] = p.observe(26.0, snap(26, 0.5, running=4))
    assert r.action is None and "rate limit" in r.reason
    # a result for another action, or with no restart in progress, changes nothing
    assert p.record_action_result(27.0, "drain_restart", False, "late") == []
    assert p.record_action_result(27.0, "compact", False, "x") == []
