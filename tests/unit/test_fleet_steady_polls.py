"""While an action holds a replica out of rotation (a rolling restart), the controller polls it at
the normal interval, never on the exponential backoff (issue 9, hole 2): the next rolling step
sees the restarted replica ready one interval after it is, not up to ``max_backoff_seconds`` later."""

from __future__ import annotations

from inferctl.controller.metrics import build_registry
from inferctl.controller.sources import SourceJob
from inferctl.controller.types import EngineSnapshot
from tests.controller_helpers import FakeClock, FakeEngineClient, make_controller


def failing_job(clock, held):
    _, metrics = build_registry()

    def down(now):
        raise ConnectionError("refused: the engine is restarting")

    job = SourceJob("engine:a", down, lambda now, err: EngineSnapshot("a", "bundled", ok=False, time=now, error=err),
                    interval=1.0, timeout=0.5, max_backoff=60.0, metrics=metrics, clock=clock)
    job.steady = lambda: held["a"]
    return job


def test_a_held_engine_that_fails_is_polled_at_the_normal_interval():
    clock, held = FakeClock(1000.0), {"a": True}
    job = failing_job(clock, held)
    delays = []
    for _ in range(5):
        assert job.run() is not None and job.failures >= 1
        delays.append(job.next_attempt - clock.t)
        clock.advance(1.0)
    assert delays == [1.0] * 5                 # unheld: 2, 4, 8, 16, 32


def test_a_backoff_begun_before_the_hold_does_not_delay_the_held_engine():
    clock, held = FakeClock(1000.0), {"a": False}
    job = failing_job(clock, held)
    for _ in range(5):                          # a busy engine's polls timed out: 32 s backoff
        clock.t = job.next_attempt
        job.run()
    clock.advance(1.0)
    assert not job.due(clock.t) and job.run() is None
    held["a"] = True                            # the action takes it out of rotation
    assert job.due(clock.t) and job.run() is not None


def test_the_controller_polls_steadily_exactly_the_engines_its_actions_hold(tmp_path):
    ctl, _, _ = make_controller(tmp_path, {"a": FakeEngineClient("a"), "b": FakeEngineClient("b")})
    try:
        job_a, job_b = ctl.sources.jobs["engine:a"], ctl.sources.jobs["engine:b"]
        assert not job_a.steady() and not job_b.steady()
        ctl.actions.rail.set("a", "restarting")
        assert job_a.steady() and not job_b.steady()
        ctl.actions.rail.release("a")
        assert not job_a.steady()
    finally:
        ctl.stop()


def test_an_engine_its_supervisor_is_relaunching_is_polled_steadily(tmp_path):
    """A crashed engine relaunched by the supervisor (no action holds it): while the process
    starts, polls keep the normal interval, so a backoff grown during the outage (up to
    max_backoff_seconds) does not hide the engine once it is up (the breaker saw 30 s)."""

    class Sup:
        process_state = "running"
        hold_state = None

    ctl, _, _ = make_controller(tmp_path, {"a": FakeEngineClient("a")})
    try:
        sup = Sup()
        ctl.supervisors["a"] = sup
        job = ctl.sources.jobs["engine:a"]
        assert not job.steady()
        sup.process_state = "starting"
        assert job.steady()
        job.next_attempt = ctl.clock() + 30.0      # a backoff grown while it was down
        assert job.due(ctl.clock())
        sup.process_state = "running"
        assert not job.steady() and not job.due(ctl.clock())
    finally:
        ctl.stop()
