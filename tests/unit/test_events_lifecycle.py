"""Items: an unclean-shutdown marker; a restarted controller adopts its healthy engine or stops
what it cannot adopt; an operator restart works after the crash-loop guard gave up."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from inferctl.controller.events import EventLog
from inferctl.controller.lifecycle import STARTED, STOPPED, UNCLEAN, adopt_engine, mark_unclean_shutdown
from inferctl.controller.supervisor import EngineSupervisor, find_owned, owner_key
from tests.controller_helpers import FAKE_ENGINE_SRC, FakeEngineClient, free_port, make_controller


def test_a_start_without_a_stop_is_marked_unclean_once(tmp_path):
    log = EventLog(tmp_path / "ev.db")
    assert mark_unclean_shutdown(log) is None                      # a new log
    log.append("lifecycle", "controller", STARTED, time=10.0)
    log.append("lifecycle", "controller", STOPPED, time=20.0)
    assert mark_unclean_shutdown(log) is None                      # stopped cleanly
    start = log.append("lifecycle", "controller", STARTED, time=30.0)
    log.append("action", "precision", "engine main switched to int8", target="main", time=31.0)
    marker = mark_unclean_shutdown(log)                             # killed: no stop after the start
    assert isinstance(marker, int)
    [ev] = [e for e in log.query(kind="lifecycle", limit=10) if e["reason"] == UNCLEAN]
    assert ev["severity"] == "warning" and ev["inputs"]["previous_start_id"] == start
    assert ev["inputs"]["last_event_time"] == 31.0
    assert mark_unclean_shutdown(log) is None                      # a failed start does not mark twice


def _sup(tmp_path, port, owner, *extra, token="tok-a"):
    argv = [sys.executable, "-c", FAKE_ENGINE_SRC, str(port), *extra]
    return EngineSupervisor("main", argv, f"http://127.0.0.1:{port}", env={"INFERCTL_ADMIN_TOKEN": token},
                            health_timeout_seconds=15, stop_timeout_seconds=3, owner=owner)


def test_a_restarted_controller_adopts_its_healthy_engine_and_stops_it_on_a_clean_exit(tmp_path):
    port = free_port()
    owner = owner_key(tmp_path / "ev.db", "main")
    old = _sup(tmp_path, port, owner)
    old.start()                                  # launched by the controller that then "dies"
    try:
        log = EventLog(tmp_path / "ev.db")
        new = _sup(tmp_path, port, owner)
        out = adopt_engine(log, new)
        assert out["adopted"] == old.pid and out["stopped"] == []
        assert new.adopted and new.running and new.pid == old.pid
        new.start()                              # returns at once: no second launch
        assert new.pid == old.pid
        [ev] = [e for e in log.query(kind="lifecycle") if "adopted" in e["reason"]]
        assert ev["outcome"]["pid"] == old.pid and ev["outcome"]["port"] == port
        assert ev["outcome"]["launch_token"] == old.launch_token
        assert new.stop() == -1                  # exit code unknown: not our child
        assert old._proc.wait(timeout=5) is not None
        assert find_owned(owner) == []           # nothing left behind
    finally:
        old.stop()


def test_an_engine_that_cannot_be_adopted_is_stopped_so_the_port_is_free(tmp_path):
    port = free_port()
    owner = owner_key(tmp_path / "ev.db", "main")
    old = _sup(tmp_path, port, owner, "ignore-term")    # another command line; ignores SIGTERM
    old.start()
    try:
        log = EventLog(tmp_path / "ev.db")
        new = _sup(tmp_path, port, owner)
        new.stop_timeout_seconds = 0.5
        out = adopt_engine(log, new)
        assert out["adopted"] is None
        [gone] = out["stopped"]
        assert gone["pid"] == old.pid and "command line differs" in gone["why"]
        assert old._proc.wait(timeout=5) == -signal.SIGKILL        # SIGTERM ignored → SIGKILL
        new.start()                                                  # the port is free again
        assert new.running and new.pid != old.pid and not new.adopted
        new.stop()
        [ev] = [e for e in log.query(kind="lifecycle") if "was stopped" in e["reason"]]
        assert ev["inputs"]["pid"] == old.pid
    finally:
        old.stop()


def test_another_admin_token_is_not_adopted(tmp_path):
    port = free_port()
    owner = owner_key(tmp_path / "ev.db", "main")
    old = _sup(tmp_path, port, owner, token="tok-old")
    old.start()
    try:
        out = _sup(tmp_path, port, owner, token="tok-new").adopt_or_clear()
        assert out["adopted"] is None and "another admin token" in out["stopped"][0]["why"]
    finally:
        old.stop()


def test_operator_restart_after_the_crash_loop_guard_gave_up(tmp_path):
    port = free_port()
    sup = _sup(tmp_path, port, None)
    sup.start()
    client = FakeEngineClient(fail=ConnectionError("connection refused"))   # the engine is dead
    ctl, registry, log = make_controller(tmp_path, {"main": client})
    ctl.supervisors["main"] = sup
    ctl.actions.supervisors["main"] = sup
    try:
        now = time.time()
        sup.crash_restarts = [now - 3, now - 2, now - 1]          # three crash restarts already
        os.kill(sup.pid, signal.SIGKILL)
        deadline = time.time() + 5
        while sup.exited_unexpectedly() is None and time.time() < deadline:
            time.sleep(0.05)
        ctl.supervise()
        [esc] = log.query(kind="escalation")
        assert "giving up" in esc["reason"]
        ctl.supervise()
        assert not sup.running                                      # the guard holds
        res = ctl.manual("restart", "main")
        assert res.ok, res.message
        assert sup.running and "without a drain" in res.message
        assert res.details["crash_guard_reset"] is True and res.details["crash_restarts_cleared"] == 4
        assert sup.crash_restarts == []
        assert ("drain", True) not in client.calls
        ev = log.query(kind="action", limit=1)[0]
        assert ev["source"] == "operator" and ev["outcome"]["crash_guard_reset"] is True
        assert registry.get_sample_value("inferctl_engine_restarts_total",
                                         {"engine": "main", "reason": "operator"}) == 1
    finally:
        sup.stop()


def test_an_engine_too_slow_to_become_healthy_is_stopped_and_the_error_names_the_setting(tmp_path):
    """A model that loads longer than the health timeout: the start fails, the process is
    stopped, and the message says which setting gives it longer (not just "not healthy")."""
    port = free_port()
    sup = EngineSupervisor("main", [sys.executable, "-c", "import time; time.sleep(60)"],
                           f"http://127.0.0.1:{port}", health_timeout_seconds=0.5, stop_timeout_seconds=3)
    with pytest.raises(RuntimeError, match=r"within 0\.5 s .*launch\.health_timeout_seconds"):
        sup.start()
    assert sup.process_state == "stopped" and (sup._proc is None or sup._proc.poll() is not None)
