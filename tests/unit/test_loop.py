"""The control loop: timeouts and backoff per source, reconcile → policies → actions → events."""

from __future__ import annotations

import time

import pytest

from inferctl.controller.actions import Actions
from inferctl.controller.loop import Controller
from inferctl.controller.sources import SourceJob
from inferctl.controller.metrics import build_registry
from inferctl.controller.policies.precision import PrecisionPolicy
from inferctl.controller.signals import InvalidSampleCounter
from inferctl.controller.types import GpuReading
from tests.controller_helpers import FakeClock, FakeEngineClient, StaticGpuSource, loop_parts

MIB = 1024 * 1024


def build(tmp_path, clients, gpu_source=None, intervals=None, policies=None, clock=time.time):
    cfg, registry, metrics, log = loop_parts(
        tmp_path, [{"name": n, "url": f"http://127.0.0.1:{9000 + i}"} for i, n in enumerate(clients)],
        intervals)
    acts = Actions(clients, event_log=log, metrics=metrics, confirm_timeout_seconds=0.5,
                   poll_interval_seconds=0.01)
    counter = InvalidSampleCounter()
    if policies is None:
        policies = {n: {"precision": PrecisionPolicy({"hold_seconds": 2.0, "confirm_timeout_seconds": 5},
                                                     engine=n, counter=counter)} for n in clients}
    ctl = Controller(cfg, clients, gpu_source or StaticGpuSource(), policies, acts, log, metrics,
                     registry=registry, counter=counter, clock=clock)
    return ctl, registry, log


def oom_fault(fid, t):
    return {"id": fid, "time": t, "kind": "exhaustion", "requested_bytes": 96 * MIB,
            "free_bytes": 41 * MIB, "allocated_bytes": 900 * MIB, "reserved_unallocated_bytes": 1 * MIB,
            "total_bytes": 1024 * MIB, "message": "out of memory", "source": "budget", "precision": "full"}


def test_source_job_backs_off_exponentially_and_recovers():
    clock = FakeClock(1000.0)
    _, metrics = build_registry()
    state = {"fail": True}

    def fn(now):
        if state["fail"]:
            raise ConnectionError("refused")
        return GpuReading(source="x", ok=True, time=now)

    job = SourceJob("gpu", fn, lambda now, err: GpuReading(source="x", ok=False, error=err, time=now),
                    interval=1.0, timeout=0.5, max_backoff=5.0, metrics=metrics, clock=clock)
    delays = []
    for _ in range(4):
        r = job.run()
        assert r is not None and r.ok is False and "refused" in r.error
        delays.append(job.next_attempt - clock.t)
        assert job.run() is None                 # backing off: skipped
        clock.t = job.next_attempt
    assert delays == [2.0, 4.0, 5.0, 5.0]        # interval × 2^failures, capped at 5
    state["fail"] = False
    assert job.run().ok and job.failures == 0 and job.next_attempt == 0.0


def test_source_job_timeout_must_be_shorter_than_interval():
    with pytest.raises(ValueError, match="call_timeout_seconds"):
        SourceJob("e", lambda n: None, lambda n, e: None, interval=1.0, timeout=1.0, max_backoff=5,
                  metrics={})


def test_slow_gpu_source_does_not_delay_engine_polls(tmp_path):
    client = FakeEngineClient()
    slow = StaticGpuSource(delay=1.5)                     # sleeps ten times past its 0.15 s timeout
    ctl, registry, _ = build(tmp_path, {"main": client}, gpu_source=slow)
    ctl.start()
    try:
        time.sleep(2.0)
    finally:
        ctl.stop()
    # 0.2 s interval for 2 s: ~10 engine polls; a stall behind the GPU source would give ≤ 2
    assert client.polls >= 6, client.polls
    assert slow.polls <= 2                                # timed out once, then backed off
    assert registry.get_sample_value("inferctl_gpu_telemetry_up", {"source": "static"}) == 0.0
    assert registry.get_sample_value("inferctl_poll_errors_total", {"poller": "gpu"}) >= 1
    assert registry.get_sample_value("inferctl_engine_up", {"engine": "main"}) == 1.0
    st = ctl.status()
    # "timed out after 0.15 s", then "previous call still running (more than 0.15 s)"
    assert "0.15 s" in st["gpus"]["poll"]["last_error"]
    assert st["gpus"]["poll"]["failures"] >= 1


def test_slow_engine_does_not_delay_other_engine(tmp_path):
    fast, slow = FakeEngineClient("fast"), FakeEngineClient("slow")
    slow.delay = 1.0
    ctl, registry, _ = build(tmp_path, {"fast": fast, "slow": slow})
    ctl.start()
    try:
        time.sleep(1.5)
    finally:
        ctl.stop()
    assert fast.polls >= 5
    assert registry.get_sample_value("inferctl_engine_up", {"engine": "slow"}) == 0.0
    assert registry.get_sample_value("inferctl_engine_up", {"engine": "fast"}) == 1.0


def test_oom_fault_degrades_within_one_poll_and_is_recorded(tmp_path):
    client = FakeEngineClient()
    client.memory = {"memory_budget_bytes": 1024 * MIB, "memory_reserved_bytes": 1000 * MIB,
                     "memory_allocated_bytes": 990 * MIB, "full_weights_bytes": 4 * MIB,
                     "weights_bytes": 4 * MIB}
    ctl, registry, log = build(tmp_path, {"main": client})
    now = time.time()
    assert ctl.tick(now) == []
    client.faults.append(oom_fault(1, now + 0.5))
    decisions = ctl.tick(now + 1)                           # the poll that sees the fault
    assert [(d.action, d.to_state) for d in decisions] == [("degrade", "degrading")]
    assert ctl.wait_for_actions(5)
    assert client.calls == [("precision", "int8")]
    ctl.tick(now + 2)                                       # engine reports int8 → INT8
    assert ctl.policies["main"]["precision"].current.value == "int8"
    assert registry.get_sample_value("inferctl_precision_mode", {"engine": "main", "mode": "int8"}) == 1.0
    assert registry.get_sample_value("inferctl_precision_mode", {"engine": "main", "mode": "full"}) == 0.0
    assert registry.get_sample_value("inferctl_precision_switches_total", {"engine": "main", "to": "int8"}) == 1
    assert registry.get_sample_value("inferctl_engine_oom_events_total",
                                     {"engine": "main", "kind": "exhaustion"}) == 1
    kinds = [(e["kind"], e["source"]) for e in log.query(limit=100)]
    assert ("transition", "precision") in kinds and ("action", "precision") in kinds
    trans = log.query(kind="transition")[0]
    assert trans["inputs"]["free_bytes"] == 41 * MIB and trans["inputs"]["requested_bytes"] == 96 * MIB
    # the same fault seen on later polls acts once
    ctl.tick(now + 3)
    ctl.wait_for_actions(5)
    assert client.calls == [("precision", "int8")]


def test_rollback_after_hold_when_memory_recovers(tmp_path):
    client = FakeEngineClient()
    client.precision = "int8"
    client.memory = {"memory_budget_bytes": 1024 * MIB, "memory_reserved_bytes": 100 * MIB,
                     "memory_allocated_bytes": 90 * MIB, "full_weights_bytes": 4 * MIB, "weights_bytes": 1 * MIB}
    ctl, registry, log = build(tmp_path, {"main": client})
    t = time.time()
    ctl.tick(t)                               # adopts int8
    ctl.tick(t + 0.5)                         # hold starts with a good sample
    assert client.calls == []
    ctl.tick(t + 1.5)                         # 1 s held < 2 s hold
    assert client.calls == []
    ctl.tick(t + 2.6)                         # 2.1 s held ≥ 2 s → rollback
    ctl.wait_for_actions(5)
    assert client.calls == [("precision", "full")]
    ctl.tick(t + 3)
    assert ctl.policies["main"]["precision"].current.value == "full"
    assert registry.get_sample_value("inferctl_precision_mode", {"engine": "main", "mode": "full"}) == 1.0


def test_policy_exception_is_an_event_not_a_crash(tmp_path):
    class Broken:
        def observe(self, now, snap):
            raise RuntimeError("bug")

        def state(self, now=None):
            return {"state": "broken"}

    client = FakeEngineClient()
    ctl, _, log = build(tmp_path, {"main": client}, policies={"main": {"broken": Broken()}})
    ctl.tick()
    [err] = log.query(kind="error")
    assert "bug" in err["reason"] and err["severity"] == "critical"


def test_status_is_strict_json_with_engines_gpus_policies(tmp_path):
    import json

    client = FakeEngineClient()
    ctl, _, _ = build(tmp_path, {"main": client})
    ctl.tick()
    st = ctl.status()
    text = json.dumps(st, allow_nan=False)
    assert st["engines"]["main"]["precision"] == "full"
    assert st["engines"]["main"]["policies"]["precision"]["state"] == "full"
    assert [d["index"] for d in st["gpus"]["devices"]] == [0, 1]
    assert st["engines"]["main"]["supervised"] is False
    assert "NaN" not in text


def test_manual_actions_and_unpin(tmp_path):
    from inferctl.controller.policies.common import PolicyError

    client = FakeEngineClient()
    ctl, _, log = build(tmp_path, {"main": client})
    res = ctl.manual("drain", "main")
    assert res.ok and client.draining
    with pytest.raises(KeyError):
        ctl.manual("drain", "nope")
    with pytest.raises(ValueError, match="action"):
        ctl.manual("explode", "main")
    with pytest.raises(PolicyError, match="not pinned"):
        ctl.unpin("main")
    assert log.query(kind="action")[-1]["source"] == "operator"


def test_no_data_removes_gauges_instead_of_zero(tmp_path):
    client = FakeEngineClient()
    client.memory = {"memory_reserved_bytes": 100 * MIB, "memory_allocated_bytes": 60 * MIB}
    ctl, registry, _ = build(tmp_path, {"main": client})
    ctl.tick()
    assert registry.get_sample_value("inferctl_fragmentation_ratio", {"engine": "main"}) == pytest.approx(0.4)
    client.memory = {"memory_reserved_bytes": None, "memory_allocated_bytes": None}
    ctl.tick()
    assert registry.get_sample_value("inferctl_fragmentation_ratio", {"engine": "main"}) is None


def test_manual_switch_is_told_to_the_precision_policy_first(tmp_path):
    from inferctl.controller.types import Decision

    class Pol:
        def __init__(self):
            self.calls = []

        def observe(self, now, snap, gpu=None, telemetry_ok=True):
            return []

        def operator_switch(self, now, mode, who):
            self.calls.append((mode, who))
            return [Decision("precision", "main", None, "int8", "full", f"operator {who} forced {mode}", {})]

        def state(self, now=None):
            return {"state": "x"}

    client = FakeEngineClient()
    pol = Pol()
    ctl, _, log = build(tmp_path, {"main": client}, policies={"main": {"precision": pol}})
    assert ctl.manual("rollback", "main", actor="alice").ok
    assert pol.calls == [("full", "alice")]
    assert client.calls == [("precision", "full")]
    [t] = log.query(kind="transition")
    assert t["reason"] == "operator alice forced full"
    assert t["id"] < log.query(kind="action")[-1]["id"]        # the policy hears it first


def test_supervise_restarts_a_crashed_engine(tmp_path):
    import os
    import signal
    import sys

    from inferctl.controller.actions import EngineSupervisor
    from tests.controller_helpers import FAKE_ENGINE_SRC, free_port

    port = free_port()
    sup = EngineSupervisor("main", [sys.executable, "-c", FAKE_ENGINE_SRC, str(port)],
                           f"http://127.0.0.1:{port}", health_timeout_seconds=15)
    sup.start()
    client = FakeEngineClient()
    ctl, registry, log = build(tmp_path, {"main": client})
    ctl.supervisors["main"] = sup
    ctl.actions.supervisors["main"] = sup
    try:
        ctl.supervise()
        assert log.query(kind="error") == []            # alive: nothing to do
        old = sup.pid
        os.kill(old, signal.SIGKILL)
        deadline = time.time() + 5
        while sup.exited_unexpectedly() is None and time.time() < deadline:
            time.sleep(0.05)
        ctl.supervise()
        assert ctl.wait_for_actions(20)
        assert sup.running and sup.pid != old
        [err] = log.query(kind="error")
        assert "exited with code -9" in err["reason"]
        assert registry.get_sample_value("inferctl_engine_restarts_total", {"engine": "main", "reason": "crash"}) == 1
    finally:
        sup.stop()


def test_concurrent_callers_of_one_source_never_record_a_false_failure():
    import threading as th

    _, metrics = build_registry()
    gate = th.Event()

    def fn(now):
        gate.wait(2)
        return GpuReading(source="x", ok=True, time=now)

    job = SourceJob("gpu", fn, lambda now, err: GpuReading(source="x", ok=False, error=err, time=now),
                    interval=5.0, timeout=1.0, max_backoff=10.0, metrics=metrics)
    first = {}
    t = th.Thread(target=lambda: first.setdefault("r", job.run()))
    t.start()
    time.sleep(0.1)
    assert job.run() is None                      # scheduled caller: skips while the first runs
    gate.set()
    forced = job.run(force=True)                  # forced caller: waits its turn, then polls
    t.join()
    assert first["r"].ok and forced.ok
    assert job.failures == 0 and job.polls == 2
