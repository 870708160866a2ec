"""The fleet rails and a replica whose poll failed (issue 9: a fragmentation restart under 64
clients took a second replica out while one was already out, because the busy target's poll had
timed out and the rails read it as "already out"). A failed poll is not out of rotation: the
router still sends it traffic, so taking it out counts against ``max_unavailable``."""

from __future__ import annotations

from inferctl.controller.fleet import FleetRail, ReplicaView, rail_verdict
from inferctl.controller.state import ControllerState
from tests.controller_helpers import engine_snapshot


def test_a_target_whose_poll_failed_counts_against_max_unavailable():
    views = {"a": ReplicaView("a", "m", False, None), "b": ReplicaView("b", "m", False, None, True),
             "c": ReplicaView("c", "m", True, True)}
    v = rail_verdict("a", views, max_unavailable=1)
    assert not v.ok and v.rail == "max_unavailable" and "(b)" in v.reason
    assert rail_verdict("a", views, max_unavailable=2).ok


def test_a_held_or_draining_target_is_already_out():
    views = {"a": ReplicaView("a", "m", False, False, True), "b": ReplicaView("b", "m", False, None, True),
             "c": ReplicaView("c", "m", True, True)}
    assert rail_verdict("a", views, max_unavailable=1).ok


def test_the_controller_view_marks_held_and_draining_replicas_only():
    st = ControllerState(["a", "b", "c"])
    st.record_engine("a", engine_snapshot("a", model="s", ok=False))
    st.record_engine("b", engine_snapshot("b", model="s"))
    st.record_engine("c", engine_snapshot("c", model="s", draining=True))
    rail = FleetRail(st.latest, max_unavailable=1, lock=st.lock)
    assert rail.try_hold("b", "draining").ok is False          # c is draining: one out already
    views = rail.views()
    assert [views[n].held_out for n in "abc"] == [False, False, True]
    # a (poll failed) may not go out while c is out
    verdict = rail.try_hold("a", "draining")
    assert not verdict.ok and verdict.rail == "max_unavailable"
