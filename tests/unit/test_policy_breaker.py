"""Latency breaker: open on TTFT p99 over the threshold, half-open probes, close when healthy;
no data (F04) and inconsistent data (F03) never move it."""

from __future__ import annotations

import pytest

from inferctl.controller.policies import BreakerConfig, BreakerState, LatencyBreaker
from tests.policy_helpers import acts, engine, ttft_hist


def eng(t, hist, **kw):
    kw.setdefault("finished_total", None)
    return engine(t, ttft_histogram=hist, model="main-7b", **kw)


def breaker(**kw):
    cfg = dict(light_model="light-1b", window_seconds=30.0, min_requests=20, open_seconds=30.0,
               probe_min_requests=5)
    cfg.update(kw)
    return LatencyBreaker(BreakerConfig(**cfg))


def test_opens_when_p99_over_threshold_with_enough_requests():
    b = breaker()
    h0 = ttft_hist([0.1] * 50)
    assert b.observe(0.0, eng(0.0, h0)) == []             # one sample: no window yet
    h1 = ttft_hist([0.1] * 20 + [2.0] * 5, base=h0)        # 25 new, 5 of them at 2 s
    ds = b.observe(30.0, eng(30.0, h1))
    assert acts(ds) == ["route_light"]
    d = ds[0]
    assert (d.from_state, d.to_state) == ("closed", "open") and d.severity == "warning"
    assert d.inputs["light_model"] == "light-1b" and d.inputs["main_model"] == "main-7b"
    assert d.inputs["observations"] == 25 and d.inputs["window_seconds"] == 30.0
    assert d.inputs["p"] == pytest.approx(1.0 + 1.5 * (0.99 * 25 - 20) / 5)
    assert d.inputs["histogram_scope"] == "engine"
    st = b.state()
    assert st["state"] == "open" and st["trips"] == 1
    assert st["ttft_p99_seconds"] == pytest.approx(d.inputs["p"])
    assert st["ttft_p99_at_least"] is False


def test_stays_closed_when_fast_or_too_few_requests():
    b = breaker()
    h0 = ttft_hist([0.1] * 50)
    b.observe(0.0, eng(0.0, h0))
    fast = ttft_hist([0.1] * 100, base=h0)
    assert b.observe(30.0, eng(30.0, fast)) == []
    few = ttft_hist([3.0] * 10, base=fast)                 # slow, but only 10 < 20
    assert b.observe(60.0, eng(60.0, few)) == []
    assert b.current is BreakerState.CLOSED
    assert "10 observations < 20" in b.state()["last"]["reason"]
    assert b.state()["ttft_p99_seconds"] is None


def test_window_excludes_requests_older_than_the_window():
    b = breaker(window_seconds=30.0)
    h0 = ttft_hist([0.1] * 5)
    b.observe(0.0, eng(0.0, h0))
    h1 = ttft_hist([5.0] * 10, base=h0)                    # 10 slow: too few to judge
    assert b.observe(10.0, eng(10.0, h1)) == []
    h2 = ttft_hist([0.1] * 30, base=h1)
    # the window at t=40 starts at the t=10 sample: 30 fast requests only. Counting from
    # t=0 would give 40 requests with p99 among the slow ones, and the breaker would open.
    assert b.observe(40.0, eng(40.0, h2)) == []
    assert b.current is BreakerState.CLOSED
    assert b.state()["last"]["observations"] == 30


def test_saturated_p99_counts_as_over():
    b = breaker()
    les = (0.05, 0.1, 0.25)                                # top finite bucket 0.25 s
    h0 = ttft_hist([0.01] * 10, les)
    b.observe(0.0, eng(0.0, h0))
    h1 = ttft_hist([0.01] * 20 + [0.3] * 5, les, base=h0)  # p99 in +Inf: "≥ 0.25"
    ds = b.observe(30.0, eng(30.0, h1))
    assert acts(ds) == ["route_light"]
    assert ds[0].inputs["p_at_least"] is True and ds[0].inputs["p_text"] == "≥ 0.25"


def test_f04_identical_scrapes_never_open_or_flap():
    b = breaker()
    h = ttft_hist([3.0] * 100)                              # slow history, no new traffic
    for t in range(0, 600, 60):
        assert b.observe(float(t), eng(float(t), dict(h))) == []
    assert b.current is BreakerState.CLOSED


def test_f03_inconsistent_histogram_is_kept_out():
    b = breaker()
    h0 = ttft_hist([0.1] * 50)
    b.observe(0.0, eng(0.0, h0, finished_total=40, running=0))
    h1 = ttft_hist([2.0] * 50, base=h0)                     # 100 observations vs 45 requests
    assert b.observe(30.0, eng(30.0, h1, finished_total=45, running=0)) == []
    assert "count_exceeds_requests" in b.state()["last"]["flags"]
    zero_sum = dict(ttft_hist([2.0] * 200, base=h1), sum=0.0)
    assert b.observe(60.0, eng(60.0, zero_sum)) == []       # F03a: implausible
    assert b.current is BreakerState.CLOSED


def _open(b):
    h0 = ttft_hist([0.1] * 50)
    b.observe(0.0, eng(0.0, h0))
    h1 = ttft_hist([2.0] * 30, base=h0)
    assert acts(b.observe(10.0, eng(10.0, h1))) == ["route_light"]
    return h1


def test_half_open_probe_then_close_when_healthy():
    b = breaker(open_seconds=30.0)
    h1 = _open(b)
    assert b.observe(39.0, eng(39.0, h1)) == []
    ds = b.observe(40.0, eng(40.0, h1))
    assert acts(ds) == ["probe"] and ds[0].to_state == "half_open"
    assert ds[0].inputs["probe_fraction"] == 0.1 and ds[0].inputs["probe_max_requests"] == 20
    # F04 while half-open: no new observations → stays half-open
    assert b.observe(50.0, eng(50.0, dict(h1))) == []
    assert b.current is BreakerState.HALF_OPEN
    h2 = ttft_hist([0.2] * 3, base=h1)                      # 3 < probe_min_requests
    assert b.observe(55.0, eng(55.0, h2)) == []
    h3 = ttft_hist([0.2] * 5, base=h2)
    ds = b.observe(60.0, eng(60.0, h3))
    assert acts(ds) == ["route_main"] and ds[0].to_state == "closed"


def test_half_open_probe_slow_reopens():
    b = breaker(open_seconds=30.0)
    h1 = _open(b)
    b.observe(40.0, eng(40.0, h1))
    h2 = ttft_hist([0.2] * 4 + [3.0] * 4, base=h1)
    ds = b.observe(45.0, eng(45.0, h2))
    assert acts(ds) == ["route_light"] and (ds[0].from_state, ds[0].to_state) == ("half_open",
                                                                                  "open")
    assert b.state()["trips"] == 2
    assert b.observe(74.0, eng(74.0, h2)) == []             # open again for open_seconds
    assert acts(b.observe(75.0, eng(75.0, h2))) == ["probe"]


def test_main_model_histogram_is_preferred():
    b = breaker()
    slow = ttft_hist([2.0] * 40)
    fast = ttft_hist([0.05] * 40)
    base = {"buckets": [(le, 0) for le, _ in slow["buckets"]], "sum": 0.0, "count": 0}
    b.observe(0.0, engine(0.0, model="main-7b", ttft_histogram=base,
                          ttft_histogram_by_model={"main-7b": base, "light-1b": base}))
    ds = b.observe(30.0, engine(30.0, model="main-7b", ttft_histogram=fast,
                                ttft_histogram_by_model={"main-7b": slow, "light-1b": fast}))
    assert acts(ds) == ["route_light"] and ds[0].inputs["histogram_scope"] == "model"


def test_counter_reset_in_window_uses_the_new_histogram():
    b = breaker()
    b.observe(0.0, eng(0.0, ttft_hist([0.1] * 500)))
    after_restart = ttft_hist([2.0] * 25)                   # engine restarted: counts went down
    ds = b.observe(30.0, eng(30.0, after_restart))
    assert acts(ds) == ["route_light"] and ds[0].inputs["observations"] == 25


def test_config_requires_a_light_model():
    with pytest.raises(ValueError, match="light_model"):
        BreakerConfig()
    with pytest.raises(ValueError, match="main_model"):
        BreakerConfig(light_model="x", main_model="x")
    with pytest.raises(ValueError, match="ttft_threshold_seconds"):
        BreakerConfig(light_model="x", ttft_threshold_seconds=0)
    b = LatencyBreaker({"light_model": "l", "enabled": True, "ttft_threshold_seconds": 1.0})
    assert b.config.ttft_threshold_seconds == 1.0


def test_engine_down_or_no_histogram_changes_nothing():
    b = breaker()
    _open(b)
    assert b.observe(100.0, engine(100.0, ok=False)) == []
    assert b.observe(101.0, engine(101.0)) == []            # no histogram at all
    assert b.current is BreakerState.OPEN
