"""The fleet rails (controller/fleet.py) and the rolling restart built on them (controller/actions.py):
never the last ready replica while it has work (automatically or unforced), at most
max_unavailable replicas out at once, force skips both; each step an event; lifecycle in /status."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from inferctl.controller.actions import Actions, EngineSupervisor
from inferctl.controller.events import EventLog
from inferctl.controller.fleet import FleetRail, ReplicaView, rail_verdict
from inferctl.controller.metrics import build_registry
from inferctl.controller.state import ControllerState
from inferctl.controller.types import Decision
from tests.controller_helpers import FakeEngineClient, engine_snapshot


def view(name, ready=True, busy=False, group="m"):
    return ReplicaView(name, group, ready, busy)


# ------------------------------------------------------------------ the pure rail
def test_last_ready_replica_with_work_is_never_taken_out():
    views = {"a": view("a", busy=True), "b": view("b", ready=False)}
    v = rail_verdict("a", views, max_unavailable=1)
    assert not v.ok and v.rail == "last_ready" and "last ready replica of m" in v.reason


def test_last_ready_replica_goes_out_at_a_quiet_moment():
    views = {"a": view("a", busy=False), "b": view("b", ready=False)}
    assert rail_verdict("a", views, max_unavailable=2).ok


def test_a_queue_not_reported_is_not_a_quiet_moment():
    assert not rail_verdict("a", {"a": view("a", busy=None)}, max_unavailable=1).ok


def test_max_unavailable_counts_the_other_replicas_out():
    views = {"a": view("a", busy=True), "b": view("b", ready=False), "c": view("c")}
    v = rail_verdict("a", views, max_unavailable=1)
    assert not v.ok and v.rail == "max_unavailable" and "(b)" in v.reason
    assert rail_verdict("a", views, max_unavailable=2).ok          # c stays ready


def test_a_replica_already_out_may_be_acted_on():
    views = {"a": ReplicaView("a", "m", False, False, True), "b": view("b", ready=False), "c": view("c")}
    assert rail_verdict("a", views, max_unavailable=1).ok            # taking it out changes nothing


def test_other_groups_do_not_count():
    views = {"a": view("a", busy=True), "x": view("x", group="other"), "b": view("b", ready=False, group="other")}
    v = rail_verdict("a", views, max_unavailable=1)
    assert not v.ok and v.rail == "last_ready"


def test_force_skips_both_rails():
    views = {"a": view("a", busy=True), "b": view("b", ready=False)}
    assert rail_verdict("a", views, max_unavailable=1, force=True).ok
    with pytest.raises(ValueError, match="max_unavailable"):
        rail_verdict("a", views, max_unavailable=0)


# ------------------------------------------------------------------ FleetRail over the controller's view
def state_with(**snaps):
    st = ControllerState(list(snaps))
    for name, kw in snaps.items():
        st.record_engine(name, engine_snapshot(name, model="stories", **kw))
    return st


def test_hold_is_atomic_with_the_check_and_shows_on_the_supervisor():
    st = state_with(a={}, b={}, c={})
    sups = {n: EngineSupervisor(n, ["true"], "http://127.0.0.1:1") for n in "abc"}
    rail = FleetRail(st.latest, max_unavailable=1, supervisors=sups, lock=st.lock)
    assert rail.try_hold("a", "draining").ok
    assert sups["a"].lifecycle == "draining" and sups["b"].lifecycle == "stopped"
    second = rail.try_hold("b", "draining")
    assert not second.ok and second.rail == "max_unavailable" and "(a)" in second.reason
    assert rail.try_hold("a", "draining").rail == "held"
    rail.release("a")
    assert sups["a"].hold_state is None and rail.try_hold("b", "draining").ok


def test_a_model_is_remembered_while_the_engine_is_down():
    st = state_with(a={}, b={"running": 2})
    rail = FleetRail(st.latest, max_unavailable=1, lock=st.lock)
    rail.views()
    st.record_engine("a", dataclasses.replace(engine_snapshot("a"), ok=False, model=None))
    v = rail.try_hold("b", "draining")
    assert not v.ok and v.rail == "last_ready" and "stories" in v.reason


# ------------------------------------------------------------------ the rolling restart (Actions)
class CountingSupervisor:
    def __init__(self):
        self.pid, self.running, self.restarts, self.hold_state = 100, True, 0, None
        self.seen_hold: list = []

    def restart(self):
        self.seen_hold.append(self.hold_state)
        self.restarts += 1
        self.pid += 1

    def reset_crash_guard(self):
        return 0

    def wait_ready(self, timeout):
        self.seen_hold.append(self.hold_state)
        return True


@pytest.fixture
def fleet(tmp_path):
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics)
    clients = {"a": FakeEngineClient("a", running=1), "b": FakeEngineClient("b")}
    for c in clients.values():
        c.poll = _with_model(c.poll)
    st = ControllerState(list(clients))
    for n, c in clients.items():
        st.record_engine(n, c.poll(0.0))
    sups = {n: CountingSupervisor() for n in clients}
    acts = Actions(clients, supervisors=sups, event_log=log, metrics=metrics, state=st, drain_timeout_seconds=2,
                   quiet_wait_seconds=0.3, poll_interval_seconds=0.01, confirm_timeout_seconds=0.1)
    return acts, clients, sups, st, log


def _with_model(poll):
    return lambda now: dataclasses.replace(poll(now), model="stories")


def decision(action, target, policy, **inputs):
    return Decision(policy, target, action, None, None, f"test {action}", inputs)


def test_automatic_restart_of_the_last_ready_replica_with_work_is_postponed_without_a_drain(fleet):
    acts, clients, sups, st, log = fleet
    clients["a"].stuck = True                                   # keeps its request
    st.record_engine("b", dataclasses.replace(engine_snapshot("b", model="stories"), ok=False))  # b is down
    res = acts.execute(decision("drain_restart", "a", "fragmentation"))
    assert not res.ok and res.refused and res.details["rail"] == "last_ready"
    assert "--force" in res.message
    assert clients["a"].calls == [] and sups["a"].restarts == 0     # never drained, never restarted
    assert sups["a"].hold_state is None
    [step] = log.query(kind="step")
    assert step["source"] == "fragmentation" and step["target"] == "a" and step["inputs"]["step"] == "postponed"


def test_operator_force_takes_the_last_ready_replica_out(fleet):
    acts, clients, sups, st, log = fleet
    st.record_engine("b", dataclasses.replace(engine_snapshot("b", model="stories"), ok=False))
    res = acts.execute(decision("restart", "a", "operator", force=True))
    assert res.ok, res.message
    assert clients["a"].calls == [("drain", True), ("drain", False)] and sups["a"].restarts == 1
    steps = [e["inputs"]["step"] for e in log.query(kind="step")]
    assert steps == ["out_of_rotation", "drained", "restarted", "in_rotation"]
    assert {e["source"] for e in log.query(kind="step")} == {"operator"}
    assert sups["a"].seen_hold == ["restarting", "starting"] and sups["a"].hold_state is None


def test_with_another_ready_replica_a_busy_replica_rolls_at_once(fleet):
    acts, clients, sups, _, log = fleet
    res = acts.execute(decision("drain_restart", "a", "fragmentation"))
    assert res.ok, res.message
    assert clients["a"].calls[0] == ("drain", True) and sups["a"].restarts == 1
    assert "1 other ready replica(s) of stories: b" in log.query(kind="step")[0]["reason"]


def test_two_concurrent_restarts_never_take_both_replicas_out(fleet):
    acts, clients, sups, _, _ = fleet
    clients["a"].running = clients["b"].running = 0
    gate = threading.Event()
    real = sups["a"].restart

    def slow_restart():
        gate.wait(2)
        real()
    sups["a"].restart = slow_restart
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("a", acts.execute(decision("drain_restart", "a", "frag"))))
    t.start()
    while acts.rail.held().get("a") != "restarting":
        pass
    out["b"] = acts.execute(decision("drain_restart", "b", "frag"))
    gate.set()
    t.join(5)
    assert out["a"].ok and not out["b"].ok and out["b"].details["rail"] == "max_unavailable"
    assert sups["b"].restarts == 0 and clients["b"].calls == []


def test_precision_switch_stays_immediate_without_a_drain(fleet):
    acts, clients, _, _, _ = fleet
    assert acts.execute(decision("degrade", "a", "precision")).ok
    assert clients["a"].calls == [("precision", "int8")]
    assert acts.rail.held() == {}


def test_a_hung_engine_is_restarted_without_waiting_for_work_that_never_finishes(fleet):
    """The liveness policy's restart of a hung engine carries ``skip_drain_wait``: the drain is
    still sent, but the restart does not wait ``drain_timeout_seconds`` for in-flight work the
    hung engine will never finish (without it: ~200 polls over the 2 s timeout here)."""
    acts, clients, sups, _, log = fleet
    clients["a"].stuck = True
    polls = []
    inner = clients["a"].poll
    clients["a"].poll = lambda now: (polls.append(now), inner(now))[1]
    res = acts.execute(decision("restart_engine", "a", "liveness", force=True, skip_drain_wait=True))
    assert res.ok, res.message
    assert sups["a"].restarts == 1 and clients["a"].calls[0] == ("drain", True)
    # the rail's look, one idle check and the restart proof's one poll before and one after: no wait loop
    assert len(polls) <= 4
    drained = [e for e in log.query(kind="step") if e["inputs"]["step"] == "drained"]
    assert drained and drained[0]["outcome"]["idle"] is False


# ------------------------------------------------------------------ a GPU reset under the rails
class StoppableSupervisor(CountingSupervisor):
    def stop(self):
        self.running = False

    def restart(self):
        super().restart()
        self.running = True


@pytest.fixture
def gpu_fleet(tmp_path, monkeypatch):
    """Three ready replicas of one model: a and b on GPU 0, c on GPU 1 (max_unavailable 1)."""
    from inferctl.controller.reset import GpuResetter
    from tests.controller_helpers import FakeClock, FakeNvidiaSmi, StaticGpuSource

    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics)
    clients = {n: FakeEngineClient(n) for n in "abc"}
    for c in clients.values():
        c.poll = _with_model(c.poll)
    st = ControllerState(list(clients))
    for n, c in clients.items():
        st.record_engine(n, c.poll(0.0))
    sups = {n: StoppableSupervisor() for n in clients}
    resetter = GpuResetter(gpu_source=StaticGpuSource(), event_log=log, metrics=metrics, clock=FakeClock(),
                           verify_interval_seconds=0)
    acts = Actions(clients, supervisors=sups, event_log=log, metrics=metrics, state=st, drain_timeout_seconds=0.2,
                   quiet_wait_seconds=0.2, poll_interval_seconds=0.01, confirm_timeout_seconds=0.1,
                   resetter=resetter, engine_gpus={"a": 0, "b": 0, "c": 1})
    return acts, clients, sups, log, smi


def test_a_gpu_reset_that_would_exceed_max_unavailable_is_deferred_with_an_event(gpu_fleet):
    acts, clients, sups, log, smi = gpu_fleet
    res = acts.execute(decision("reset_gpu", "gpu:0", "hardware"))
    assert not res.ok and res.refused and res.details["outcome"] == "deferred"
    assert res.details["rail"] == "max_unavailable" and res.details["engine"] == "b"
    assert "GPU 0: reset deferred" in res.message and "rails.max_unavailable is 1" in res.message
    assert ["--gpu-reset", "-i", "0"] not in smi.calls()               # the GPU was not reset
    assert all(s.running and s.restarts == 0 for s in sups.values())   # nothing stopped
    assert clients["a"].calls == [] and clients["b"].calls == []       # nothing drained
    assert acts.rail.held() == {}                                      # a, held first, is back
    [step] = log.query(kind="step")
    assert step["target"] == "b" and step["inputs"]["step"] == "postponed"
    assert "reset of GPU 0 is deferred" in step["reason"]


def test_a_gpu_reset_within_the_rails_stops_and_restarts_its_engines(gpu_fleet):
    acts, clients, sups, log, smi = gpu_fleet
    acts.rail.max_unavailable = 2
    res = acts.execute(decision("reset_gpu", "gpu:0", "hardware"))
    assert res.ok, res.message
    assert res.details["stopped_engines"] == ["a", "b"] and sups["c"].restarts == 0
    assert ["--gpu-reset", "-i", "0"] in smi.calls()
    assert acts.rail.held() == {}


def test_an_operator_forced_gpu_reset_skips_the_rails(gpu_fleet):
    acts, clients, sups, log, smi = gpu_fleet
    res = acts.execute(decision("reset_gpu", "gpu:0", "operator", force=True))
    assert res.ok, res.message
    assert res.details["stopped_engines"] == ["a", "b"]
