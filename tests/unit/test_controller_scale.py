"""The controller's cost at fleet size, as behaviour: labelled children cached and unchanged
gauges not rewritten (controller/exporter.py), one fleet-wide poll-duration histogram, no
``*_created`` series, and the engines' polls run as one bounded round on the poller's loop
(controller/sources.py). Speed itself is a benchmark: ``python -m bench.controller_tick``."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from inferctl.controller.exporter import Exporter
from inferctl.controller.metrics import build_registry
from tests.controller_helpers import FakeClock, FakeEngineClient, engine_snapshot, make_controller


class CountingGauge:
    """Wraps a prometheus Gauge, counting labels() and set() calls."""

    def __init__(self, inner):
        self.inner, self.labels_calls, self.sets = inner, 0, 0

    def labels(self, *a, **kw):
        self.labels_calls += 1
        child = self.inner.labels(*a, **kw)
        outer = self

        class Child:
            def set(self, v):
                outer.sets += 1
                child.set(v)
        return Child()

    def remove(self, *values):
        self.inner.remove(*values)


def test_an_unchanged_gauge_is_not_relabelled_or_rewritten_and_none_still_removes_it():
    registry, metrics = build_registry()
    g = metrics["inferctl_kv_cache_usage_ratio"] = CountingGauge(metrics["inferctl_kv_cache_usage_ratio"])
    ex = Exporter(metrics)
    for _ in range(5):
        ex.gauge("inferctl_kv_cache_usage_ratio", 0.5, engine="a")
    assert g.labels_calls == 1 and g.sets == 1
    ex.gauge("inferctl_kv_cache_usage_ratio", 0.7, engine="a")
    assert g.labels_calls == 1 and g.sets == 2
    assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "a"}) == 0.7
    ex.gauge("inferctl_kv_cache_usage_ratio", None, engine="a")          # no data: the series goes
    assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "a"}) is None
    ex.gauge("inferctl_kv_cache_usage_ratio", None, engine="a")          # already gone: no error
    ex.gauge("inferctl_kv_cache_usage_ratio", 0.7, engine="a")           # back with the same value
    assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "a"}) == 0.7


def test_export_of_a_repeated_snapshot_sets_nothing_new():
    registry, metrics = build_registry()
    ex = Exporter(metrics)
    snap = engine_snapshot("a", kv_usage_ratio=0.25)
    ex.export_engine("a", snap, None)
    counted = {n: CountingGauge(metrics[n]) for n in ("inferctl_engine_up", "inferctl_kv_cache_usage_ratio")}
    metrics.update(counted)
    ex.export_engine("a", snap, snap)
    assert all(c.labels_calls == 0 and c.sets == 0 for c in counted.values())
    assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "a"}) == 0.25


def test_no_created_series_and_one_poll_duration_histogram_for_every_engine(tmp_path):
    clients = {n: FakeEngineClient(n) for n in ("a", "b", "c")}
    ctl, registry, log = make_controller(tmp_path, clients, clock=FakeClock())
    try:
        ctl.tick()
        ctl.tick()
        text = generate_latest(registry).decode()
    finally:
        ctl.stop()
        log.close()
    assert "_created" not in text
    assert registry.get_sample_value("inferctl_poll_duration_seconds_count", {"poller": "engines"}) == 6
    assert registry.get_sample_value("inferctl_poll_duration_seconds_count", {"poller": "gpu"}) == 2
    assert 'poller="engine:' not in text.split("inferctl_poll_duration_seconds")[1].split("# HELP")[0]
    # errors stay per engine (the alerting and the runbooks name the engine)
    assert registry.get_sample_value("inferctl_poll_errors_total", {"poller": "engine:a"}) == 0


class AsyncFake(FakeEngineClient):
    """An HTTP-speaking client double: its poll is a coroutine on the poller's loop."""

    supports_async = True
    live = 0
    peak = 0

    async def poll_async(self, poller, now):
        cls = type(self)
        cls.live += 1
        cls.peak = max(cls.peak, cls.live)
        try:
            await asyncio.sleep(0.02)
            return self.poll(now)
        finally:
            cls.live -= 1


def test_engine_polls_run_as_one_round_at_most_concurrency_at_once(tmp_path):
    AsyncFake.live = AsyncFake.peak = 0
    clients = {f"e{i}": AsyncFake(f"e{i}") for i in range(12)}
    ctl, registry, log = make_controller(tmp_path, clients, clock=FakeClock())
    try:
        ctl.sources.concurrency = 3
        stored = ctl.sources.poll_engines(force=True)
        assert stored == 12 and all(ctl.state.latest[n].ok for n in clients)
        assert AsyncFake.peak == 3                       # bounded: each deadline starts with its slot
        seen = []
        stored = ctl.sources.poll_engines(force=True, settle_s=0.0,
                                          on_settle=lambda: seen.append(len(ctl.state.latest)))
        assert stored == 12 and len(seen) == 1          # the stragglers were stored after the settle
    finally:
        ctl.stop()
        log.close()


class HangingFake(AsyncFake):
    """An engine whose poll never answers (a hung HTTP server)."""

    async def poll_async(self, poller, now):
        await asyncio.sleep(60)
        return self.poll(now)


def test_a_hung_engine_holds_one_worker_only_and_times_out_alone(tmp_path):
    """Seven engines polled by two workers beside one that hangs: the hung one holds one worker
    until its own deadline while the other worker serves the rest of the queue, so every other
    engine is stored before the settle (shorter than the deadline) and the hung one fails alone."""
    clients = {"hung": HangingFake("hung"), **{f"e{i}": AsyncFake(f"e{i}") for i in range(7)}}
    ctl, registry, log = make_controller(tmp_path, clients, clock=FakeClock(),
                                         intervals={"engine_poll_seconds": 5.0, "gpu_poll_seconds": 5.0,
                                                    "call_timeout_seconds": 2.0})
    try:
        ctl.sources.concurrency = 2
        at_settle = []
        stored = ctl.sources.poll_engines(force=True, settle_s=1.0,
                                          on_settle=lambda: at_settle.append(sorted(ctl.state.latest)))
        assert at_settle == [[f"e{i}" for i in range(7)]]       # the hung engine still out, the rest in
        assert stored == 8
        hung = ctl.state.latest["hung"]
        assert not hung.ok and "timed out after 2 s" in hung.error
        assert all(ctl.state.latest[f"e{i}"].ok for i in range(7))
        assert registry.get_sample_value("inferctl_poll_errors_total", {"poller": "engine:hung"}) == 1
    finally:
        ctl.stop()
        log.close()
