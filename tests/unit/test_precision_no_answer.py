"""A precision switch whose admin call gets no answer (a busy engine under load): the engine's
polls decide, so one OOM episode makes exactly one degrade.

The flake this pins down (test_up_e2e "degrades once", full-suite load): the POST
/admin/precision timed out at ``call_timeout_seconds`` although the engine had taken it; the
action read as failed, the precision policy went back to FULL ("degrade failed"), and the same
episode's next OOM fault (the switch applies between steps) made a second degrade transition.
"""

from __future__ import annotations

import time

import httpx
import pytest

from inferctl.controller.actions import Actions
from inferctl.controller.engines.base import EngineAdminError, outcome_unknown
from inferctl.controller.events import EventLog
from inferctl.controller.metrics import build_registry
from inferctl.controller.types import Decision
from tests.controller_helpers import FakeEngineClient, make_controller

MIB = 1 << 20


def no_answer(path: str = "/admin/precision") -> EngineAdminError:
    """What BundledEngineClient raises when the POST's deadline passes (httpx's error as cause)."""
    try:
        raise httpx.ReadTimeout("timed out")
    except httpx.ReadTimeout as exc:
        err = EngineAdminError(0, f"ReadTimeout: {exc}", path=path)
        err.__cause__ = exc
        return err


class SlowAdminEngine(FakeEngineClient):
    """The engine takes the switch (applied at its next poll) but the call's answer never comes."""

    def __init__(self, error: Exception, deliver: bool = True) -> None:
        super().__init__()
        self.error = error
        self.deliver = deliver

    def set_precision(self, mode: str) -> dict:
        self.calls.append(("precision", mode))
        if self.deliver:
            self.pending = mode
        raise self.error


def degrade(policy: str = "precision") -> Decision:
    return Decision(policy=policy, target="main", action="degrade", from_state="full", to_state="degrading",
                    reason="test degrade", inputs={})


@pytest.fixture
def acts_env(tmp_path):
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics)
    return registry, metrics, log


def make(acts_env, client, confirm=0.3):
    _, metrics, log = acts_env
    return Actions({"main": client}, event_log=log, metrics=metrics, confirm_timeout_seconds=confirm,
                   poll_interval_seconds=0.01)


def test_outcome_unknown_only_without_an_answer():
    assert outcome_unknown(no_answer())
    assert outcome_unknown(httpx.ReadTimeout("t"))
    refused = EngineAdminError(0, "ConnectError: refused")
    refused.__cause__ = httpx.ConnectError("refused")
    assert not outcome_unknown(refused)                           # nothing was sent
    assert not outcome_unknown(EngineAdminError(409, "switch refused"))   # the engine answered no
    assert not outcome_unknown(ConnectionError("refused"))        # not an HTTP error at all


def test_switch_without_an_answer_is_confirmed_by_the_polls(acts_env):
    registry, _, log = acts_env
    client = SlowAdminEngine(no_answer())
    res = make(acts_env, client).execute(degrade())
    assert res.ok and res.details["confirmed"] is True, res.message
    assert client.precision == "int8" and "confirmed by poll" in res.message
    assert registry.get_sample_value("inferctl_precision_switches_total", {"engine": "main", "to": "int8"}) == 1
    [ev] = log.query(kind="action")
    assert ev["outcome"]["ok"] is True and "ReadTimeout" in ev["outcome"]["reply"]["no_answer"]


def test_switch_without_an_answer_that_never_shows_fails(acts_env):
    client = SlowAdminEngine(no_answer(), deliver=False)
    t0 = time.monotonic()
    res = make(acts_env, client, confirm=0.2).execute(degrade())
    assert not res.ok and "got no answer" in res.message and "still reports full" in res.message
    assert client.polls >= 2 and time.monotonic() - t0 >= 0.2      # it waited for the polls


@pytest.mark.parametrize("error", [EngineAdminError(409, "switch refused", path="/admin/precision"),
                                   ConnectionError("refused")])
def test_refused_switch_fails_at_once_without_polling(acts_env, error):
    client = SlowAdminEngine(error, deliver=False)
    res = make(acts_env, client).execute(degrade())
    assert not res.ok and "call failed" in res.message
    assert client.polls == 0


def test_one_oom_episode_one_degrade_when_the_switch_call_times_out(tmp_path):
    client = SlowAdminEngine(no_answer())
    client.memory = {"memory_budget_bytes": 1024 * MIB, "memory_reserved_bytes": 1000 * MIB,
                     "memory_allocated_bytes": 990 * MIB, "full_weights_bytes": 4 * MIB, "weights_bytes": 4 * MIB}
    ctl, registry, log = make_controller(tmp_path, {"main": client})
    fault = {"kind": "exhaustion", "requested_bytes": 96 * MIB, "free_bytes": 41 * MIB, "total_bytes": 1024 * MIB,
             "message": "out of memory", "source": "budget", "precision": "full"}
    now = time.time()
    ctl.tick(now)
    client.faults.append({**fault, "id": 1, "time": now + 0.5})
    ctl.tick(now + 1)
    assert ctl.wait_for_actions(5)
    # the same episode: another request OOMs before the switch took effect
    client.faults.append({**fault, "id": 2, "time": now + 1.2})
    ctl.tick(now + 1.4)
    ctl.wait_for_actions(5)
    ctl.tick(now + 2)
    ctl.wait_for_actions(5)
    trans = [e for e in log.query(kind="transition", limit=100) if e["source"] == "precision"]
    degrades = [e for e in trans if e["outcome"]["action"] == "degrade"]
    assert len(degrades) == 1, [(e["outcome"], e["reason"]) for e in trans]
    assert not [e for e in trans if "degrade failed" in e["reason"]]
    assert ctl.policies["main"]["precision"].current.value == "int8"
    assert client.calls == [("precision", "int8")]
    assert registry.get_sample_value("inferctl_precision_switches_total", {"engine": "main", "to": "int8"}) == 1
