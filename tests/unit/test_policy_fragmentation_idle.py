"""Fragmentation policy vs a healthy busy engine: the activation working set a caching allocator
keeps between steps reads as reserved-but-unallocated; a restart needs the high ratio to persist
across an idle moment (confirm_idle).

Numbers measured on the bundled engine (stories260K, int8, 8,760,000 B budget, 16 concurrent long
Gutenberg prompts): busy reserved 8,560,128 B / allocated 4,380,672 B (48.8 %); idle (cache
released) reserved = allocated = 4,380,672 B (0 %).
"""

from __future__ import annotations

import pytest

from inferctl.controller.policies import FragmentationConfig, FragmentationPolicy
from tests.policy_helpers import acts, engine

ALLOC = 4_380_672
BUSY_RESERVED = 8_560_128


def busy(t, running=8, waiting=2):
    return engine(float(t), reserved=BUSY_RESERVED, allocated=ALLOC, running=running, waiting=waiting)


def idle(t, reserved=ALLOC):
    return engine(float(t), reserved=reserved, allocated=ALLOC, running=0, waiting=0)


def policy(**kw):
    return FragmentationPolicy(FragmentationConfig(**{"hold_seconds": 60.0, **kw}))


def test_busy_engine_is_never_restarted_by_its_cached_working_set():
    p = policy()
    for t in range(0, 3600, 5):                    # an hour of continuous load at 48.8 %
        assert p.observe(float(t), busy(t)) == [], t
    st = p.state()
    assert st["fragmentation_ratio"] == pytest.approx(1 - ALLOC / BUSY_RESERVED)
    assert st["held_seconds"] == 3595.0 and st["idle_confirmed_at"] is None


def test_idle_moment_that_releases_the_cache_resets_the_hold():
    p = policy()
    for t in range(0, 120, 5):
        p.observe(float(t), busy(t))
    assert p.observe(120.0, idle(120)) == []        # idle: cache released, 0 %
    assert p.state()["hold_started"] is None
    assert p.observe(125.0, busy(125)) == []


def test_fragmentation_that_survives_an_idle_moment_restarts():
    p = policy()
    for t in range(0, 60, 5):
        assert p.observe(float(t), busy(t)) == []
    # idle, but 40 % of what is reserved stays unallocated: segments pinned by live blocks
    stuck = round(ALLOC / 0.6)
    ds = p.observe(60.0, idle(60, reserved=stuck))
    assert acts(ds) == ["drain_restart"]
    assert ds[0].inputs["idle_confirmed_at"] == 60.0 and ds[0].inputs["held_seconds"] == 60.0
    assert "also while idle" in ds[0].reason


def test_idle_confirmation_early_in_the_hold_lets_busy_samples_finish_it():
    p = policy()
    stuck = round(ALLOC / 0.6)
    assert p.observe(0.0, idle(0, reserved=stuck)) == []     # seen idle at 40 %
    for t in range(5, 60, 5):
        assert p.observe(float(t), busy(t)) == []
    assert acts(p.observe(60.0, busy(60))) == ["drain_restart"]


def test_unknown_running_is_not_an_idle_moment():
    p = policy(hold_seconds=0.0)
    stuck = round(ALLOC / 0.6)
    assert p.observe(0.0, engine(0.0, reserved=stuck, allocated=ALLOC, running=None, waiting=None)) == []


def test_confirm_idle_off_restarts_on_busy_samples_alone():
    p = policy(confirm_idle=False)
    for t in range(0, 60, 5):
        assert p.observe(float(t), busy(t)) == []
    assert acts(p.observe(60.0, busy(60))) == ["drain_restart"]
    with pytest.raises(ValueError, match="confirm_idle"):
        FragmentationConfig(confirm_idle="yes")
