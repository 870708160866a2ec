"""Issue 10 item 2: no ping-pong. A large prompt that OOMs again right after every rollback used
to give seven precision switches in ten minutes; now the switches per window are capped, the hold
grows per prompt-size class and the class pins int8 after K relapses."""

from __future__ import annotations

from inferctl.contract.thresholds import THRESHOLDS
from inferctl.controller.policies import PrecisionPolicy
from inferctl.controller.policies.precision_flap import size_class
from tests.policy_helpers import BUDGET, MiB, engine, oom

FREE = 900_000          # memory has recovered: free far above the rollback threshold


def replay(p: PrecisionPolicy, seconds: int, *, bucket: str | None = "2k-8k", requested: int = 96 * MiB,
           t0: int = 0, state: dict | None = None) -> list[tuple[float, str]]:
    """Poll every second; the engine applies a switch at the next poll; whenever it serves full
    precision, the same large prompt comes back one second later and OOMs. Returns the
    automatic switches (time, action)."""
    st = state if state is not None else {"prec": "full", "pending": None, "faults": [], "n": 0, "full_since": t0}
    out = []
    for t in range(t0, t0 + seconds):
        if st["pending"]:
            st["prec"], st["pending"] = st["pending"], None
            st["full_since"] = t
        if st["prec"] == "full" and t - st["full_since"] == 1:
            st["n"] += 1
            extra = {"prompt_len_bucket": bucket} if bucket else {}
            st["faults"] = st["faults"][-5:] + [oom(st["n"], float(t), requested=requested, **extra)]
        snap = engine(float(t), precision=st["prec"], faults=st["faults"], reserved=BUDGET - FREE)
        for d in p.observe(float(t), snap):
            if d.action in ("degrade", "rollback"):
                out.append((float(t), d.action))
                st["pending"] = "int8" if d.action == "degrade" else "full"
    return out


def test_repeated_large_prompt_switches_are_capped_in_ten_minutes():
    p = PrecisionPolicy({"hold_seconds": 60.0})
    switches = replay(p, 600)
    assert len(switches) <= THRESHOLDS.precision_max_switches
    # any 600 s window holds at most the cap
    times = [t for t, _ in switches]
    assert all(sum(1 for u in times if t <= u < t + 600) <= THRESHOLDS.precision_max_switches for t in times)
    st = p.state(599.0)
    assert st["switches_in_window"] == len(switches) and st["max_switches_per_window"] == 4


def test_same_size_class_pins_after_k_relapses_and_stays_pinned():
    p = PrecisionPolicy({"hold_seconds": 60.0})
    state = {"prec": "full", "pending": None, "faults": [], "n": 0, "full_since": 0}
    switches = replay(p, 3600, state=state)
    assert p.current.value == "pinned_int8"
    assert [a for _, a in switches] == ["degrade", "rollback", "degrade", "rollback", "degrade"]
    st = p.state(3599.0)
    assert st["class_relapses"]["prompt:2k-8k"] == THRESHOLDS.precision_pin_after_class_relapses
    assert "prompt:2k-8k" in st["pinned_by"]
    gauges = {g.name: g.value for g in p.gauges(3599.0)}
    assert gauges["inferctl_precision_pinned"] == 1.0
    assert gauges["inferctl_precision_max_switches_per_window"] == 4.0


def test_hold_grows_per_size_class():
    p = PrecisionPolicy({"hold_seconds": 60.0})
    switches = replay(p, 300)
    holds = p.state(299.0)["class_holds"]
    assert holds["prompt:2k-8k"] == 120.0          # one relapse of the class: 60 s x 2
    assert switches[:2] == [(0 + 1.0, "degrade"), (switches[1][0], "rollback")] and switches[1][0] >= 61.0


def test_size_class_from_bucket_else_order_of_magnitude():
    assert size_class({"prompt_len_bucket": "2k-8k", "requested_bytes": 5}) == "prompt:2k-8k"
    assert size_class({"requested_bytes": 96 * MiB}) == "bytes:1e8"
    assert size_class({"requested_bytes": 950 * 1024}) == "bytes:1e5"
    assert size_class({"requested_bytes": None}) == "unknown"
