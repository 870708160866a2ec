"""The policies' declared transition tables: docs/policies.md prints exactly them, every state
is reachable, and a state change that is not declared raises ``TransitionError``."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferctl.controller.policies.base import TransitionError
from inferctl.controller.policies.doc import POLICIES, documented, render, transitions_markdown
from inferctl.controller.policies.precision import PrecisionPolicy, PrecisionState

DOC = Path(__file__).resolve().parents[2] / "docs" / "policies.md"


def test_the_doc_prints_every_declared_table():
    text = DOC.read_text(encoding="utf-8")
    assert sorted(documented(text)) == sorted(POLICIES)
    for name, cls in POLICIES.items():
        assert documented(text)[name] == transitions_markdown(cls), (
            f"docs/policies.md's {name} table is stale: run "
            "python -m inferctl.controller.policies.doc docs/policies.md")
    assert render(text) == text


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_state_is_reachable_and_left(name):
    table = POLICIES[name].TRANSITIONS
    states = {frm for frm, _ in table} | set(table.values())
    enum = type(next(iter(table.values())))
    assert states == set(enum)


def test_an_undeclared_transition_raises():
    pol = PrecisionPolicy(engine="main")
    with pytest.raises(TransitionError, match="full --memory_recovered--> rolling_back"):
        pol._transition(1.0, PrecisionState.ROLLING_BACK, "rollback", "test", {},
                        event="memory_recovered")
    assert pol.current is PrecisionState.FULL
