"""What the per-engine policies share (controller/policies/common.py PerEnginePolicy): the first
snapshot binds the policy to its engine, another engine's snapshot is refused naming both, and
``since`` starts at the first poll while the state holds."""

from __future__ import annotations

import pytest

from inferctl.controller.policies import (BreakerConfig, FragmentationPolicy, LatencyBreaker,
                                 PrecisionPolicy)
from tests.policy_helpers import engine

POLICIES = {
    "breaker": lambda **kw: LatencyBreaker(BreakerConfig(light_model="light-1b"), **kw),
    "fragmentation": lambda **kw: FragmentationPolicy(**kw),
    "precision": lambda **kw: PrecisionPolicy(**kw),
}


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_first_snapshot_binds_the_engine_and_another_is_refused(kind):
    p = POLICIES[kind]()
    assert p.engine is None
    p.observe(5.0, engine(5.0, name="e0"))
    p.observe(7.0, engine(7.0, name="e0"))
    st = p.state()
    assert (st["engine"], st["state"], st["since"]) == ("e0", p.current.value, 5.0)
    with pytest.raises(ValueError, match=r"^engine: this policy is for 'e0', got 'e1'$"):
        p.observe(9.0, engine(9.0, name="e1"))
    assert p.state()["engine"] == "e0"


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_engine_given_at_construction_refuses_the_first_other_snapshot(kind):
    p = POLICIES[kind](engine="main")
    with pytest.raises(ValueError, match="this policy is for 'main', got 'e0'"):
        p.observe(1.0, engine(1.0, name="e0"))
    assert p.state()["since"] is None
