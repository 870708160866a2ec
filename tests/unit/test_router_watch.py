"""``inferctl up --replicas N`` restarts a router that exited on its own (controller/router_watch.py)."""

from __future__ import annotations

from inferctl.controller.router_watch import CRASH_RESTARTS, RouterWatch


class FakeRouter:
    base_url = "http://127.0.0.1:8080"

    def __init__(self, code=None, fail=False):
        self.code, self.fail, self.restarts = code, fail, 0

    def exited_unexpectedly(self):
        return self.code

    def restart(self):
        self.restarts += 1
        if self.fail:
            raise RuntimeError("engine 'router' exited with code 1 before it was healthy")
        self.code = None


class Log:
    def __init__(self):
        self.rows = []

    def append(self, kind, source, message, **kw):
        self.rows.append((kind, source, kw.get("target"), message))


def test_a_router_that_died_is_restarted_with_an_event_and_a_line():
    sup, log, lines = FakeRouter(code=-9), Log(), []
    watch = RouterWatch(sup, log, lines.append)
    assert watch.check(now=0.0) == "restarted"
    assert sup.restarts == 1
    assert log.rows == [("error", "supervisor", "router", "router exited with code -9; restarting it")]
    assert lines == ["router:     restarted at http://127.0.0.1:8080 (it exited with code -9)"]
    assert watch.check(now=1.0) is None and sup.restarts == 1      # running again: nothing to do


def test_a_running_or_stopped_router_is_left_alone():
    sup = FakeRouter(code=None)
    assert RouterWatch(sup, None, print).check(now=0.0) is None and sup.restarts == 0


def test_the_crash_loop_guard_gives_up_after_three_restarts_in_ten_minutes():
    sup, log, lines = FakeRouter(), Log(), []
    watch = RouterWatch(sup, log, lines.append)
    for i in range(CRASH_RESTARTS):
        sup.code = 1
        assert watch.check(now=float(i)) == "restarted"
    sup.code = 1
    assert watch.check(now=10.0) == "gave_up"
    assert watch.check(now=11.0) is None and sup.restarts == CRASH_RESTARTS
    assert log.rows[-1][0] == "escalation" and "giving up" in log.rows[-1][3]
    watch2 = RouterWatch(FakeRouter(), None, print)
    for t in (0.0, 700.0, 1400.0, 2100.0):        # spaced out: never a loop
        watch2.sup.code = 1
        assert watch2.check(now=t) == "restarted"


def test_a_restart_that_fails_is_said_and_tried_again_at_the_next_look():
    sup, log, lines = FakeRouter(code=1, fail=True), Log(), []
    watch = RouterWatch(sup, log, lines.append)
    assert watch.check(now=0.0) == "failed"
    assert "router restart failed" in log.rows[-1][3] and "router restart failed" in lines[-1]
    sup.fail = False
    assert watch.check(now=1.0) == "restarted" and sup.restarts == 2
