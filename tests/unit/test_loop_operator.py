"""Operator switches through the loop with the real precision policy: a manual rollback is not
undone without a new OOM; a manual degrade stays in int8 until the hold has passed."""

from __future__ import annotations

from inferctl.controller.actions import Actions
from inferctl.controller.loop import Controller
from inferctl.controller.policies.precision import PrecisionPolicy
from tests.controller_helpers import FakeClock, FakeEngineClient, StaticGpuSource, loop_parts

MIB = 1024 * 1024
# budget 1024 MiB, full weights 4 MiB, int8 1 MiB: threshold = 3 MiB + 10 % of 1024 MiB
LOW = {"memory_budget_bytes": 1024 * MIB, "memory_reserved_bytes": 1000 * MIB, "memory_allocated_bytes": 990 * MIB,
       "full_weights_bytes": 4 * MIB, "weights_bytes": 1 * MIB}
HIGH = {**LOW, "memory_reserved_bytes": 100 * MIB, "memory_allocated_bytes": 100 * MIB}
HOLD = 2.0


def build(tmp_path, client, clock):
    cfg, registry, metrics, log = loop_parts(tmp_path, [{"name": "main", "url": "http://127.0.0.1:9000"}])
    acts = Actions({"main": client}, event_log=log, metrics=metrics, confirm_timeout_seconds=0.5,
                   poll_interval_seconds=0.01)
    pol = PrecisionPolicy({"hold_seconds": HOLD, "confirm_timeout_seconds": 5}, engine="main")
    ctl = Controller(cfg, {"main": client}, StaticGpuSource(), {"main": {"precision": pol}}, acts, log,
                     metrics, registry=registry, clock=clock)
    return ctl, pol, log


def oom(fid, t):
    return {"id": fid, "time": t, "kind": "exhaustion", "requested_bytes": 96 * MIB, "free_bytes": 41 * MIB,
            "message": "out of memory", "source": "budget", "precision": "full"}


def test_manual_rollback_is_not_undone_without_a_new_oom(tmp_path):
    clock = FakeClock()
    client = FakeEngineClient()
    client.memory = dict(LOW)
    ctl, pol, log = build(tmp_path, client, clock)
    client.faults.append(oom(1, clock.t))
    ctl.tick(clock.t)
    assert ctl.wait_for_actions(5)
    clock.advance(0.5)
    ctl.tick(clock.t)
    assert pol.current.value == "int8"
    res = ctl.manual("rollback", "main", actor="alice")
    assert res.ok and client.precision == "full" and pol.current.value == "full"
    for _ in range(20):                       # 20 s of low memory, the old fault still listed
        clock.advance(1.0)
        ctl.tick(clock.t)
        ctl.wait_for_actions(5)
    assert client.calls == [("precision", "int8"), ("precision", "full")]
    assert pol.current.value == "full"
    manual = [e for e in log.query(kind="transition", limit=100) if "alice" in e["reason"]]
    assert [(e["outcome"]["from"], e["outcome"]["to"]) for e in manual] == [("int8", "rolling_back")]
    assert manual[0]["inputs"]["who"] == "alice"
    # a new OOM degrades again
    client.faults.append(oom(2, clock.t))
    clock.advance(0.5)
    ctl.tick(clock.t)
    ctl.wait_for_actions(5)
    assert client.calls[-1] == ("precision", "int8")


def test_manual_degrade_stays_int8_until_the_hold_passes(tmp_path):
    clock = FakeClock()
    client = FakeEngineClient()
    client.memory = dict(HIGH)                # plenty free: only the hold keeps int8
    ctl, pol, log = build(tmp_path, client, clock)
    ctl.tick(clock.t)
    assert ctl.manual("degrade", "main", actor="bob").ok
    assert client.precision == "int8" and pol.current.value == "int8"
    t0 = clock.t
    while clock.t - t0 < HOLD - 0.5:
        clock.advance(0.5)
        ctl.tick(clock.t)
        ctl.wait_for_actions(5)
    assert client.calls == [("precision", "int8")]   # no rollback inside the hold
    for _ in range(3):
        clock.advance(0.5)
        ctl.tick(clock.t)
        ctl.wait_for_actions(5)
    assert client.calls == [("precision", "int8"), ("precision", "full")]
    [rb] = [e for e in log.query(kind="transition", limit=100) if e["outcome"]["action"] == "rollback"]
    assert rb["inputs"]["held_seconds"] >= HOLD


def test_failed_manual_degrade_is_reported_to_the_policy(tmp_path):
    clock = FakeClock()
    client = FakeEngineClient(fail=RuntimeError("engine 503"))
    client.memory = dict(HIGH)
    ctl, pol, log = build(tmp_path, client, clock)
    ctl.tick(clock.t)
    res = ctl.manual("degrade", "main", actor="bob")
    assert not res.ok and "engine 503" in res.message
    assert pol.current.value == "full"
    back = log.query(kind="transition", limit=100)[-1]
    assert (back["outcome"]["from"], back["outcome"]["to"]) == ("degrading", "full")
    assert "engine 503" in back["reason"]
