"""The liveness policies through the real loop (fakes from tests/controller_helpers.py): an
engine outage, a GPU telemetry outage and an engine hang each land in the event log once
(issue 10 items 7 and 11)."""

from __future__ import annotations

from inferctl.controller.policies.liveness import EngineLiveness, GpuTelemetryLiveness
from inferctl.controller.types import EngineSnapshot
from tests.controller_helpers import FakeEngineClient, StaticGpuSource, make_controller

T0 = 1_800_000_000.0


class SteppingClient(FakeEngineClient):
    """A fake engine that reports ``steps_total`` and a queue; ``stuck`` stops its steps."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0.0
        self.waiting = 0
        self.hung = False

    def poll(self, now: float) -> EngineSnapshot:
        s = super().poll(now)
        if s.ok:
            if not self.hung:
                self.steps += 1
            s.steps_total, s.waiting = self.steps, self.waiting
        return s


def liveness_events(log, source: str) -> list[tuple[str, str, str]]:
    return [(e["kind"], e["outcome"]["from"], e["outcome"]["to"])
            for e in log.query(limit=200) if e["source"] == source and e["kind"] != "action"]


def test_engine_and_gpu_outages_are_one_event_pair_each_in_the_log(tmp_path):
    client = SteppingClient()
    src = StaticGpuSource()
    ctl, _, log = make_controller(tmp_path, {"main": client}, gpu_source=src,
                                  policies={"main": {"liveness": EngineLiveness(engine="main")}})
    ctl.gpu_policies["telemetry"] = GpuTelemetryLiveness()
    t = T0
    for step in range(8):
        client.ok = step not in (2, 3, 4)          # engine down for three polls
        src.ok = step not in (5, 6)                # then GPU telemetry down for two
        t += 2
        ctl.tick(t)
    assert liveness_events(log, "liveness") == [("transition", "up", "down"), ("transition", "down", "up")]
    assert liveness_events(log, "telemetry") == [("transition", "up", "down"), ("transition", "down", "up")]
    up = [e for e in log.query(limit=200) if e["source"] == "liveness" and e["kind"] == "transition"
          and e["outcome"]["to"] == "up"][0]
    assert up["inputs"]["downtime_seconds"] == 6.0 and up["target"] == "main"
    # a restart faster than a poll (its steps counter starts again): one observation, then quiet
    client.steps = 0
    for _ in range(3):
        t += 2
        ctl.tick(t)
    restarts = [e for e in log.query(kind="observation", limit=200) if e["source"] == "liveness"]
    assert len(restarts) == 1 and restarts[0]["inputs"]["evidence"][0]["signal"] == "steps_total"


def test_a_hang_through_the_loop_is_one_critical_transition_and_a_restart_engine_action(tmp_path):
    client = SteppingClient()
    ctl, _, log = make_controller(tmp_path, {"main": client}, policies={
        "main": {"liveness": EngineLiveness({"hang_seconds": 6}, engine="main", can_restart=True)}})
    client.waiting = 3
    t = T0
    for step in range(10):
        client.hung = step >= 2
        t += 2
        ctl.tick(t)
        ctl.wait_for_actions(10)
    hangs = [e for e in log.query(limit=200) if e["source"] == "liveness" and e["kind"] == "transition"
             and e["outcome"]["to"] == "hung"]
    assert len(hangs) == 1 and hangs[0]["severity"] == "critical"
    assert hangs[0]["outcome"]["action"] == "restart_engine" and hangs[0]["inputs"]["steps_total"] == 2
    # the restart went down the action path: here no supervisor, so the action says it cannot restart
    acts = [e for e in log.query(kind="action", limit=50) if e["source"] == "liveness"]
    assert len(acts) == 1 and "not launched by the controller" in acts[0]["reason"]
    assert ctl.policies["main"]["liveness"].state()["hang"]["result"].startswith("failed")
    # still stalled hang_seconds later: one critical note, no second restart
    notes = [e for e in log.query(kind="observation", limit=50) if e["source"] == "liveness"]
    assert len(notes) == 1 and "still hung" in notes[0]["reason"] and notes[0]["severity"] == "critical"


def test_an_outage_while_an_action_holds_the_engine_is_planned_info_not_a_warning(tmp_path):
    """A restart the controller asked for takes the engine down on purpose: its liveness ``down``
    is recorded as info with ``planned: true``; the same outage unheld stays a warning."""
    client = SteppingClient()
    ctl, _, log = make_controller(tmp_path, {"main": client},
                                  policies={"main": {"liveness": EngineLiveness(engine="main")}})
    try:
        t = T0
        for step, (ok, held) in enumerate([(True, False), (False, True), (True, True), (True, False),
                                           (False, False), (True, False)]):
            if held:
                ctl.actions.rail.set("main", "restarting")
            else:
                ctl.actions.rail.release("main")
            client.ok = ok
            t += 2
            ctl.tick(t)
        downs = [e for e in log.query(limit=200) if e["source"] == "liveness" and e["kind"] == "transition"
                 and e["outcome"]["to"] == "down"]
        assert [e["severity"] for e in downs] == ["info", "warning"]
        assert downs[0]["inputs"]["planned"] is True and downs[0]["inputs"]["lifecycle"] == "restarting"
        assert "planned: an action holds it out of rotation (restarting)" in downs[0]["reason"]
        assert "planned" not in downs[1]["inputs"]
    finally:
        ctl.stop()


def test_the_simulated_gpus_telemetry_outage_during_a_held_restart_is_planned(tmp_path):
    """With a simulated GPU (its numbers are the bundled engine's /stats), the engine's planned
    restart also takes GPU telemetry down: that event is info and planned too."""
    from inferctl.controller.config import parse_config
    from inferctl.controller.gpu.sim import SimGpuSource
    from inferctl.controller.loop import sim_engine_of

    config = parse_config({"engines": [{"name": "main", "kind": "bundled", "url": "http://127.0.0.1:8000"}]})
    assert sim_engine_of(SimGpuSource("http://127.0.0.1:8000/stats"), config) == "main"
    assert sim_engine_of(SimGpuSource("http://127.0.0.1:9999/stats"), config) is None
    assert sim_engine_of(StaticGpuSource(), config) is None

    client = SteppingClient()
    src = StaticGpuSource()
    ctl, _, log = make_controller(tmp_path, {"main": client}, gpu_source=src,
                                  policies={"main": {"liveness": EngineLiveness(engine="main")}})
    ctl.gpu_policies["telemetry"] = GpuTelemetryLiveness()
    ctl.dispatcher.sim_engine = "main"
    try:
        t = T0
        for ok, held in [(True, False), (False, True), (True, True), (True, False), (False, False), (True, False)]:
            (ctl.actions.rail.set("main", "restarting") if held else ctl.actions.rail.release("main"))
            client.ok = src.ok = ok
            t += 2
            ctl.tick(t)
        downs = [e for e in log.query(limit=200) if e["source"] == "telemetry" and e["kind"] == "transition"
                 and e["outcome"]["to"] == "down"]
        assert [e["severity"] for e in downs] == ["info", "warning"]
        assert downs[0]["inputs"]["planned"] is True and "whose stats the simulated GPU reads" in downs[0]["reason"]
    finally:
        ctl.stop()
