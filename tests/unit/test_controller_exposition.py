"""controller/exposition.py: the controller's ``/metrics`` body is ``generate_latest``'s exact
bytes (labelled gauges and counters rendered from their own cache, everything else by
prometheus-client), read live at every render, and accepted by prometheus-client's parser and
``promtool check metrics``. Speed is a benchmark (``python -m bench.controller_tick``)."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from inferctl.controller.exporter import Exporter
from inferctl.controller.exposition import FleetExposition
from inferctl.controller.metrics import build_registry
from tests.controller_helpers import FakeClock, FakeEngineClient, make_controller


class _Custom:
    def collect(self):
        g = GaugeMetricFamily("inferctl_test_custom", "a custom collector", labels=["x"])
        g.add_metric(["1"], 2.5)
        yield g


def _filled():
    """The controller registry with per-engine gauges and counters, awkward label values and
    values (escapes, -0.0, NaN, ±Inf, large and tiny floats), a histogram, an unlabelled gauge,
    a set_function child and a custom collector."""
    registry, metrics = build_registry()
    ex = Exporter(metrics)
    values = [0.0, -0.0, 1.0, 0.25, 1e22, 1.5e-9, 123456789.0, math.inf, -math.inf, math.nan]
    for i in range(40):
        name = f"e{i:03d}" if i % 7 else f'odd\\"name\n{i}'
        ex.gauge("inferctl_kv_cache_usage_ratio", values[i % len(values)], engine=name)
        ex.gauge("inferctl_engine_up", 1.0, engine=name)
        ex.inc("inferctl_engine_oom_events_total", float(i % 3), engine=name, kind="fragmentation")
        ex.zero("inferctl_poll_errors_total", poller=f"engine:{name}")
    metrics["inferctl_poll_duration_seconds"].labels(poller="engines").observe(0.004)
    Gauge("inferctl_test_plain", "unlabelled\\ gauge\nwith a newline", registry=registry).set(3)
    fn = Gauge("inferctl_test_fn", "set_function child", ["k"], registry=registry)
    fn.labels(k="a").set_function(lambda: 7.0)
    registry.register(_Custom())
    return registry, metrics, ex


def test_render_is_generate_latests_bytes_for_a_filled_controller_registry():
    registry, _, _ = _filled()
    body = FleetExposition(registry).render()
    assert body == generate_latest(registry)
    assert b'engine="odd\\\\\\"name\\n0"' in body          # backslash, quote and newline escaped
    assert b"inferctl_kv_cache_usage_ratio{engine=\"e001\"} -0.0\n" in body
    assert b'inferctl_test_fn{k="a"} 7.0' in body


def test_values_are_read_live_and_removed_series_disappear():
    registry, metrics, ex = _filled()
    fx = FleetExposition(registry)
    fx.render()
    ex.gauge("inferctl_kv_cache_usage_ratio", 0.75, engine="e002")
    ex.gauge("inferctl_kv_cache_usage_ratio", None, engine="e003")              # no data: removed
    ex.gauge("inferctl_kv_cache_usage_ratio", -0.0, engine="e005")              # 0.0 -> -0.0 prints apart
    ex.inc("inferctl_engine_oom_events_total", 2.0, engine="e004", kind="fragmentation")
    ex.gauge("inferctl_engine_up", 1.0, engine="new")
    body = fx.render()
    assert body == generate_latest(registry)
    text = body.decode()
    assert 'inferctl_kv_cache_usage_ratio{engine="e002"} 0.75\n' in text
    assert 'inferctl_kv_cache_usage_ratio{engine="e003"}' not in text
    assert 'inferctl_engine_oom_events_total{engine="e004",kind="fragmentation"} 3.0\n' in text
    assert 'inferctl_engine_up{engine="new"} 1.0\n' in text


def test_a_controllers_body_after_ticks_parses_and_passes_promtool(tmp_path):
    clients = {n: FakeEngineClient(n) for n in ("a", "b", "c")}
    ctl, registry, log = make_controller(tmp_path, clients, clock=FakeClock())
    try:
        fx = FleetExposition(registry)
        for _ in range(3):
            ctl.tick()
            body = fx.render()
            assert body == generate_latest(registry)
    finally:
        ctl.stop()
        log.close()
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    up = {s.labels["engine"]: s.value for s in families["inferctl_engine_up"].samples}
    assert up == {"a": 1.0, "b": 1.0, "c": 1.0}
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    res = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60)
    # promtool's lint may complain about naming; the format itself must parse (no "error while")
    assert b"error while" not in res.stdout + res.stderr, (res.stdout + res.stderr).decode()[:2000]


def test_a_registry_that_is_not_a_collector_registry_falls_back_to_generate_latest():
    class Plain:
        def collect(self):
            return _Custom().collect()

    assert FleetExposition(Plain()).render() == generate_latest(Plain())


def test_a_counter_without_labels_and_an_empty_labelled_metric_match():
    reg = CollectorRegistry()
    Counter("inferctl_test_plain_events", "plain", registry=reg).inc(2)
    Gauge("inferctl_test_empty", "no series yet", ["engine"], registry=reg)
    assert FleetExposition(reg).render() == generate_latest(reg)
