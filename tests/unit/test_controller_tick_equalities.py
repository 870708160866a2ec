"""The tick's cheaper paths answer as the general ones (issue 9, wave 8): the exporter's per-engine
gauges computed without Signals for plain values (and through the signal functions, counted as
before, for anything else); ``batch_window_values`` equal to ``batch_window``'s values;
``snapshot_from_stats`` reading each section once gives the values and invalid entries of the
by-path reads; a 400-digit integer in a ``/stats`` histogram is an invalid histogram, not a failed
poll; the liveness policy reads ``engine`` from any Mapping; ``PromSample`` stays a frozen value.
Speed itself is a benchmark: ``python -m bench.controller_tick``."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
from types import MappingProxyType

import pytest

from inferctl.controller import exporter as exporter_mod
from inferctl.controller import signals as sig
from inferctl.controller.engines.bundled import BundledEngineClient, snapshot_from_stats
from inferctl.controller.exporter import Exporter
from inferctl.controller.metrics import build_registry
from inferctl.controller.policies.liveness import instance_id_of, step_thread_alive, uptime_of
from inferctl.controller.scrape.promtext import PromSample
from inferctl.controller.signals import InvalidSampleCounter
from inferctl.controller.signals.batching import batch_window, batch_window_values
from inferctl.controller.types import EngineSnapshot

#: Values a snapshot field may hold after a hostile engine: plain ones and every kind of bad one.
VALUES = [None, 0, 0.0, -0.0, 1, 0.25, 1.0, 1.5, 7, 3.5e9, 2 ** 53 + 1, 2 ** 63, 10 ** 400, -1, -0.5,
          float("nan"), float("inf"), -float("inf"), True, False, "0.5", [0.5]]


def gauge_value(metrics: dict, name: str, **labels: str) -> float | None:
    """The value of one series of the metric ``name`` (None: no such series)."""
    for fam in metrics[name].collect():
        for sample in fam.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def test_the_exporters_ratio_and_fragmentation_gauges_equal_the_signal_functions():
    """Every value pair: the gauge is the signal function's value (None: no series) and the
    invalid samples counted are the ones the signal functions count."""
    _, metrics = build_registry()
    counter, ref = InvalidSampleCounter(), InvalidSampleCounter()
    ex = Exporter(metrics, counter, clock=lambda: 1.0)
    for i, (a, b) in enumerate(itertools.product(VALUES, VALUES)):
        snap = EngineSnapshot(name="e0", kind="bundled", ok=True, time=float(i), kv_usage_ratio=a, kv_waste_ratio=b,
                              memory_reserved_bytes=a, memory_allocated_bytes=b)
        ex.export_engine("e0", snap, None)
        assert gauge_value(metrics, "inferctl_kv_cache_usage_ratio", engine="e0") == \
            sig.validate_ratio(a, "kv_cache_usage_ratio", ref).value, (a, b)
        assert gauge_value(metrics, "inferctl_kv_cache_waste_ratio", engine="e0") == \
            sig.validate_ratio(b, "kv_cache_waste_ratio", ref).value, (a, b)
        assert gauge_value(metrics, "inferctl_fragmentation_ratio", engine="e0") == \
            sig.fragmentation_ratio(a, b, ref).value, (a, b)
        sig.batch_window(None, snap, ref)
    assert counter.snapshot() == ref.snapshot()


def test_plain_values_are_exported_without_a_signal(monkeypatch):
    """A healthy bundled engine's poll builds no Signal for its ratios, fragmentation and batch window."""
    _, metrics = build_registry()
    ex = Exporter(metrics, InvalidSampleCounter())

    def refuse(*args, **kw):
        raise AssertionError("signal function called for a plain value")
    for name in ("validate_ratio", "fragmentation_ratio", "batch_window"):
        monkeypatch.setattr(exporter_mod.sig, name, refuse)
    monkeypatch.setattr("inferctl.controller.signals.batching.batch_window", refuse)
    counters = dict(real_tokens_total=1000, padded_tokens_total=10.0, step_sequences_total=500, steps_total=100)
    prev = EngineSnapshot(name="e0", kind="bundled", ok=True, **counters)
    curr = EngineSnapshot(name="e0", kind="bundled", ok=True, kv_usage_ratio=0.5, kv_waste_ratio=0.125,
                          memory_reserved_bytes=4000, memory_allocated_bytes=3000, real_tokens_total=1090,
                          padded_tokens_total=20.0, step_sequences_total=530, steps_total=110)
    ex.export_engine("e0", curr, prev)
    assert gauge_value(metrics, "inferctl_fragmentation_ratio", engine="e0") == 0.25
    assert gauge_value(metrics, "inferctl_padding_ratio", engine="e0") == 0.1
    assert gauge_value(metrics, "inferctl_effective_batch_size", engine="e0") == 3.0
    assert gauge_value(metrics, "inferctl_kv_cache_waste_ratio", engine="e0") == 0.125
    vllm = EngineSnapshot(name="v0", kind="vllm", ok=True, kv_usage_ratio=0.25)    # no counters, no memory
    ex.export_engine("v0", vllm, EngineSnapshot(name="v0", kind="vllm", ok=True))
    assert gauge_value(metrics, "inferctl_kv_cache_usage_ratio", engine="v0") == 0.25
    assert gauge_value(metrics, "inferctl_padding_ratio", engine="v0") is None


def test_batch_window_values_are_batch_windows_values_and_counts():
    fields = ("real_tokens_total", "padded_tokens_total", "step_sequences_total", "steps_total")
    base = (1000, 10.0, 500, 100)
    cases = [(None, base), (base, base), (base, (1090, 20.0, 530, 110)), (base, (30, 10, 6, 2)),
             ((None,) * 4, (None,) * 4), ((0, 0, 0, 0), (0, 0, 0, 0))]
    for i, bad in itertools.product(range(4), VALUES):
        a, b = list(base), [1200, 30.0, 600, 120]
        b[i] = bad
        cases += [(tuple(a), tuple(b)), (tuple(b), tuple(a))]
    for a, b in cases:
        prev = None if a is None else EngineSnapshot(name="e", kind="bundled", ok=True, **dict(zip(fields, a)))
        curr = EngineSnapshot(name="e", kind="bundled", ok=True, **dict(zip(fields, b)))
        c1, c2 = InvalidSampleCounter(), InvalidSampleCounter()
        w = batch_window(prev, curr, c1)
        assert batch_window_values(prev, curr, c2) == (w["padding_ratio"].value, w["effective_batch_size"].value)
        assert c1.snapshot() == c2.snapshot(), (a, b)


def stats_doc() -> dict:
    le = [0.01, 0.1, 1.0]
    hist = {"buckets": [1, 3, 4], "sum": 0.9, "count": 5}
    return {"engine": {"model": "m", "precision": "full", "draining": False, "uptime_seconds": 12.0},
            "memory": {"budget_bytes": 100, "allocated_bytes": 60, "reserved_bytes": 80, "free_bytes": 20,
                       "weights_bytes": 40, "full_weights_bytes": 40},
            "kv_cache": {"usage_ratio": 0.5, "waste_ratio": 0.1},
            "scheduler": {"running": 1, "waiting": 2, "preemptions_total": 0, "steps_total": 10,
                          "step_sequences_total": 12, "real_tokens_total": 30, "padded_tokens_total": 2},
            "requests": {"finished_total": 5, "by_finish_reason": {"stop": 5}, "prompt_tokens_total": 50,
                         "completion_tokens_total": 70, "recent": [{"request_id": "r0"}, 3],
                         "latency_histograms": {"le": le, **{k: copy.deepcopy(hist) for k in
                                                             ("ttft_seconds", "itl_seconds", "e2e_seconds")}}},
            "faults": {"oom_total": 0, "recent": []}}


def by_path(doc: dict, *path: str):
    node = doc
    for p in path:
        node = node.get(p) if isinstance(node, dict) else None
    return node


@pytest.mark.parametrize("section", ["engine", "memory", "kv_cache", "scheduler", "requests", "faults"])
@pytest.mark.parametrize("bad", [None, [], "x", 3, {"unrelated": 1}])
def test_a_section_of_another_type_reads_as_absent_with_the_paths_invalid_entries(section, bad):
    doc = stats_doc()
    doc[section] = bad
    doc["memory"] = {**doc["memory"], "free_bytes": -5} if section != "memory" else doc["memory"]
    s = snapshot_from_stats(doc, name="e", now=1.0)
    assert s.ok and s.raw is doc
    for field, path in {"memory_budget_bytes": ("memory", "budget_bytes"), "running": ("scheduler", "running"),
                        "kv_usage_ratio": ("kv_cache", "usage_ratio"), "finished_total": ("requests", "finished_total"),
                        "oom_total": ("faults", "oom_total"), "precision": ("engine", "precision")}.items():
        want = by_path(doc, *path)
        assert getattr(s, field) == (None if want is None else want), field
    if section != "memory":
        assert "memory.free_bytes=-5 (out of range)" in s.invalid
    if section == "requests":
        assert s.ttft_histogram is None and s.recent_requests == []
    else:
        assert s.ttft_histogram["buckets"][-1] == (float("inf"), 5.0)
        assert s.recent_requests == [{"request_id": "r0"}]


@pytest.mark.parametrize("where", [("le", 1), ("ttft_seconds", "buckets", 1), ("ttft_seconds", "count"),
                                   ("ttft_seconds", "sum")])
def test_a_400_digit_integer_in_a_stats_histogram_is_an_invalid_histogram_not_a_failed_poll(where):
    """orjson refuses the number and ``json`` reads it as an int beyond float range: the poll
    failed with an OverflowError before; now that histogram (or every one, for ``le``) is no data."""
    doc = stats_doc()
    node = doc["requests"]["latency_histograms"]
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = 10 ** 400
    body = json.dumps(doc).encode()
    snap = BundledEngineClient("e", "http://127.0.0.1:1")._stats_snapshot(200, body, 1.0)
    assert snap.ok, snap.error
    assert snap.ttft_histogram is None
    assert any("latency_histograms" in x for x in snap.invalid)
    assert snap.running == 1 and snap.kv_usage_ratio == 0.5
    if where[0] != "le":
        assert snap.e2e_histogram is not None


def test_a_400_digit_integer_in_a_legacy_histogram_is_invalid():
    doc = stats_doc()
    del doc["requests"]["latency_histograms"]
    doc["requests"]["ttft_histogram"] = {"buckets": [[0.1, 10 ** 400]], "sum": 1, "count": 1}
    s = snapshot_from_stats(copy.deepcopy(doc), name="e")
    assert "requests.ttft_histogram.buckets (not [le, count] pairs)" in s.invalid
    assert s.ttft_histogram is None


def test_liveness_reads_the_engine_section_of_any_mapping():
    doc = {"engine": {"uptime_seconds": 5.0, "step_thread_alive": False, "instance_id": "abc"}}
    for raw in (doc, MappingProxyType(doc), {"engine": MappingProxyType(doc["engine"])}):
        s = EngineSnapshot(name="e", kind="bundled", ok=True, raw=raw)
        assert (uptime_of(s), step_thread_alive(s), instance_id_of(s)) == (5.0, False, "abc")
    for raw in (None, [], {"engine": None}, {"engine": [1]}, {}):
        s = EngineSnapshot(name="e", kind="bundled", ok=True, raw=raw)
        assert (uptime_of(s), step_thread_alive(s), instance_id_of(s)) == (None, None, None)


def test_prom_sample_is_still_a_frozen_value():
    a = PromSample("x_total", {"engine": "0"}, 1.5)
    assert a == PromSample(name="x_total", labels={"engine": "0"}, value=1.5)
    assert a != PromSample("x_total", {"engine": "1"}, 1.5)
    assert dataclasses.astuple(a) == ("x_total", {"engine": "0"}, 1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.value = 2.0
