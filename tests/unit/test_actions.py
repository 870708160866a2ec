"""Actions (precision switch, drain, drain-restart, route, reset, isolate) and EngineSupervisor."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from inferctl.controller.actions import Actions, EngineSupervisor
from inferctl.controller.events import EventLog
from inferctl.controller.metrics import build_registry
from inferctl.controller.reset import GpuResetter
from inferctl.controller.types import Decision
from tests.controller_helpers import (FAKE_ENGINE_SRC, FakeClock, FakeEngineClient, FakeNvidiaSmi,
                                      StaticGpuSource, free_port, port_is_free)


def decision(action, target="main", policy="operator", **inputs):
    return Decision(policy=policy, target=target, action=action, from_state=None, to_state=None,
                    reason=f"test {action}", inputs=inputs)


@pytest.fixture
def env(tmp_path):
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics)
    return registry, metrics, log


def make_actions(env, clients, **kw):
    registry, metrics, log = env
    kw.setdefault("confirm_timeout_seconds", 1.0)
    kw.setdefault("poll_interval_seconds", 0.01)
    return Actions(clients, event_log=log, metrics=metrics, **kw)


def fake_supervisor(name="main", mode="", stop_timeout=5.0):
    port = free_port()
    argv = [sys.executable, "-c", FAKE_ENGINE_SRC, str(port)] + ([mode] if mode else [])
    return EngineSupervisor(name, argv, f"http://127.0.0.1:{port}", health_timeout_seconds=15,
                            stop_timeout_seconds=stop_timeout), port


def test_degrade_is_confirmed_by_poll_and_counted(env):
    registry, _, log = env
    client = FakeEngineClient()
    acts = make_actions(env, {"main": client})
    res = acts.execute(decision("degrade", policy="precision"))
    assert res.ok and res.details["confirmed"] is True
    assert client.calls == [("precision", "int8")]
    assert client.precision == "int8"
    assert registry.get_sample_value("inferctl_precision_switches_total", {"engine": "main", "to": "int8"}) == 1
    [ev] = log.query(kind="action")
    assert ev["source"] == "precision" and ev["target"] == "main"
    assert ev["outcome"]["confirmed"] is True and ev["outcome"]["mode"] == "int8"
    res = acts.execute(decision("rollback", policy="precision"))
    assert res.ok and client.precision == "full"
    assert registry.get_sample_value("inferctl_precision_switches_total", {"engine": "main", "to": "full"}) == 1


def test_unconfirmed_switch_says_so(env):
    client = FakeEngineClient(apply_precision=False)
    acts = make_actions(env, {"main": client}, confirm_timeout_seconds=0.1)
    res = acts.execute(decision("degrade"))
    assert res.details["confirmed"] is False
    assert "not confirmed" in res.message and "engine reports full" in res.message


def test_failed_admin_call_is_a_failed_result_not_an_exception(env):
    _, _, log = env
    client = FakeEngineClient(fail=ConnectionError("refused"))
    acts = make_actions(env, {"main": client})
    res = acts.execute(decision("degrade"))
    assert not res.ok and "refused" in res.message
    assert log.query(kind="action")[0]["severity"] == "warning"


def test_unknown_engine_and_action(env):
    acts = make_actions(env, {"main": FakeEngineClient()})
    assert "unknown engine" in acts.execute(decision("drain", target="nope")).message
    assert "unknown action" in acts.execute(decision("teleport")).message
    assert acts.execute(decision(None)) is None


def test_drain_and_undrain(env):
    registry, _, _ = env
    client = FakeEngineClient()
    acts = make_actions(env, {"main": client})
    assert acts.execute(decision("drain")).ok and client.draining
    assert acts.execute(decision("undrain")).ok and not client.draining
    assert registry.get_sample_value("inferctl_engine_drains_total", {"engine": "main"}) == 1


def test_drain_restart_waits_for_in_flight_then_restarts(env):
    registry, _, log = env
    sup, port = fake_supervisor()
    sup.start()
    try:
        client = FakeEngineClient(running=3)
        acts = make_actions(env, {"main": client}, supervisors={"main": sup}, drain_timeout_seconds=5)
        old = sup.pid
        res = acts.execute(decision("drain_restart", policy="fragmentation"))
        assert res.ok, res.message
        assert client.running == 0                    # waited until in-flight work finished
        assert sup.pid != old and sup.running
        assert client.calls == [("drain", True), ("drain", False)]
        assert registry.get_sample_value("inferctl_engine_restarts_total",
                                         {"engine": "main", "reason": "fragmentation"}) == 1
        assert log.query(kind="action")[-1]["outcome"]["new_pid"] == sup.pid
    finally:
        sup.stop()
    assert port_is_free(port)


def test_drain_restart_postponed_when_work_does_not_finish(env):
    sup, _ = fake_supervisor()
    sup.start()
    try:
        client = FakeEngineClient(running=2)
        client.stuck = True
        acts = make_actions(env, {"main": client}, supervisors={"main": sup}, drain_timeout_seconds=0.2)
        old = sup.pid
        res = acts.execute(decision("drain_restart"))
        assert not res.ok and "postponed" in res.message
        assert sup.pid == old                          # nothing dropped: no restart
        assert client.draining is False                # and the engine admits again
    finally:
        sup.stop()


def test_restart_refused_for_an_engine_we_did_not_launch(env):
    client = FakeEngineClient()
    acts = make_actions(env, {"vllm": client})
    res = acts.execute(decision("restart", target="vllm"))
    assert not res.ok and "not launched by the controller" in res.message
    assert client.calls == []


def test_route_light_and_back(env):
    client = FakeEngineClient()
    acts = make_actions(env, {"main": client}, light_models={"main": "light"})
    assert acts.execute(decision("route_light", policy="breaker", model="stories")).ok
    assert client.routes == {"stories": "light"}
    assert acts.execute(decision("route_main", policy="breaker", model="stories")).ok
    assert client.routes == {"stories": None}
    no_light = make_actions(env, {"main": FakeEngineClient()})
    assert "no light model" in no_light.execute(decision("route_light")).message


def test_reset_gpu_by_uuid_stops_and_restarts_our_engine(env, tmp_path, monkeypatch):
    _, metrics, log = env
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource()
    resetter = GpuResetter(gpu_source=src, event_log=log, metrics=metrics, clock=FakeClock(),
                           verify_interval_seconds=0)
    sup, _ = fake_supervisor()
    sup.start()
    try:
        client = FakeEngineClient()
        uuid = src.gpus[0].uuid
        acts = make_actions(env, {"main": client}, supervisors={"main": sup}, resetter=resetter,
                            engine_gpus={"main": 0}, gpu_index_of={uuid: 0}.get)
        old = sup.pid
        res = acts.execute(decision("reset_gpu", target=uuid, policy="hardware"))
        assert res.ok and res.details["outcome"] == "success"
        assert res.details["stopped_engines"] == ["main"] and res.details["restarted_engines"] == ["main"]
        assert sup.running and sup.pid != old
        assert ["--gpu-reset", "-i", "0"] in smi.calls()
        # a second one is refused by the rate limit before any engine is touched
        pid = sup.pid
        res2 = acts.execute(decision("reset_gpu", target=uuid, policy="hardware"))
        assert not res2.ok and "retry in" in res2.message
        assert sup.pid == pid
    finally:
        sup.stop()


def test_reset_gpu_dry_run_touches_nothing(env, tmp_path, monkeypatch):
    _, metrics, log = env
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    resetter = GpuResetter(gpu_source=StaticGpuSource(), event_log=log, clock=FakeClock())
    client = FakeEngineClient()
    acts = make_actions(env, {"main": client}, resetter=resetter, engine_gpus={"main": 0})
    res = acts.execute(decision("reset_gpu", target="gpu:0"), dry_run=True)
    assert res.ok and res.details["outcome"] == "dry_run"
    assert smi.calls() == [] and client.calls == []


def test_isolate_gpu_drains_and_escalates(env):
    _, _, log = env
    a, b = FakeEngineClient("a"), FakeEngineClient("b")
    acts = make_actions(env, {"a": a, "b": b}, engine_gpus={"a": 2, "b": 0})
    res = acts.execute(decision("isolate_gpu", target="gpu:2", policy="hardware"))
    assert res.ok and res.details["drained"] == ["a"]
    assert a.draining and not b.draining
    [esc] = log.query(kind="escalation")
    assert esc["severity"] == "critical" and esc["target"] == "gpu:2"


def test_supervisor_sigkill_after_timeout_when_sigterm_is_ignored():
    sup, port = fake_supervisor(mode="ignore-term", stop_timeout=0.5)
    sup.start()
    t0 = time.monotonic()
    code = sup.stop()
    assert code == -9                     # SIGKILL
    assert time.monotonic() - t0 < 5
    assert port_is_free(port)


def test_supervisor_sigterm_stops_cleanly():
    sup, _ = fake_supervisor()
    sup.start()
    assert sup.exited_unexpectedly() is None
    assert sup.stop() == -15
    assert sup.exited_unexpectedly() is None      # stopped by us, not a crash


def test_supervisor_reports_an_engine_that_exits_before_healthy():
    sup, _ = fake_supervisor(mode="exit")
    with pytest.raises(RuntimeError, match="exited with code 3"):
        sup.start()


def test_drain_restart_does_not_read_an_unreported_queue_as_empty(env):
    """``waiting`` None (the engine did not report its queue) is no data, not 0: the engine is
    not known idle, so the restart is postponed rather than dropping queued requests."""
    import dataclasses

    class NoQueueClient(FakeEngineClient):
        def poll(self, now):
            return dataclasses.replace(super().poll(now), waiting=None)

    class CountingSupervisor:
        pid, running, restarts = 4242, True, 0

        def restart(self):
            self.restarts += 1

    sup = CountingSupervisor()
    client = NoQueueClient(running=0)
    acts = make_actions(env, {"main": client}, supervisors={"main": sup}, drain_timeout_seconds=0.1)
    res = acts.execute(decision("drain_restart"))
    assert not res.ok and "postponed" in res.message
    assert sup.restarts == 0 and client.draining is False
    assert res.details["last_poll"] == {"running": 0, "waiting": None, "ok": True}


def test_a_crash_check_never_waits_behind_a_start_in_progress():
    """The supervise job (every second) asked while another thread starts the engine (which
    holds the supervisor while it waits for /health): it answers at once, not after the start."""
    from tests.obs_helpers import lock_held_elsewhere

    sup, _ = fake_supervisor()
    sup.start()
    try:
        os.kill(sup.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while sup.exited_unexpectedly() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sup.exited_unexpectedly() == -9            # a crash is seen when nothing holds it
        with lock_held_elsewhere(sup._lock):
            t0 = time.monotonic()
            assert sup.exited_unexpectedly() is None       # busy: not judged now
            assert time.monotonic() - t0 < 0.5
        assert sup.exited_unexpectedly() == -9
    finally:
        sup.stop()
