"""The tick's parse-side savings at fleet size, as behaviour: a Prometheus scrape is parsed only
for the families a mapper reads (controller/scrape/promtext.py ``keep``, engines/promtext.py
``names_read``), a bundled ``/stats`` is read by orjson with ``json``'s results
(engines/bundled.py ``loads_stats``), and an engine's GPU is found without a scan of every GPU
(controller/state.py ``gpu_of``). Speed itself is a benchmark: ``python -m bench.controller_tick``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from inferctl.controller.engines import bundled
from inferctl.controller.engines.bundled import METRIC_HISTOGRAMS, loads_stats
from inferctl.controller.engines.promtext import (_KEEP, _MAPPERS, _Index, map_tgi, map_vllm, names_read,
                                                  snapshot_from_metrics_text)
from inferctl.controller.scrape.promtext import family_filter, parse_prometheus_text
from inferctl.controller.state import ControllerState
from inferctl.controller.types import GpuReading, GpuSnapshot

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"


def vllm_captures() -> list[str]:
    path = FIXTURES / "vllm" / "metrics_samples.txt"
    if not path.exists():
        pytest.skip("no vLLM captures")
    return ["# SOURCE" + b for b in path.read_text().split("# SOURCE")[1:]]


def test_keep_skips_unread_families_but_still_reports_garbage():
    text = ('# TYPE a counter\na 1\nb{x="y"} 2\nb_bucket{le="1"} 3\nc_total 4\n...\n!!garbage\n'
            'unread{broken 5\n')
    samples, bad = parse_prometheus_text(text, keep=family_filter(["a_total", "b"]))
    assert [(s.name, s.value) for s in samples] == [("a_total", 1.0), ("b", 2.0), ("b_bucket", 3.0)]
    assert bad == ["...", "!!garbage"]          # lines without a metric name are still parsed (and fail)
    full, full_bad = parse_prometheus_text(text)
    assert {s.name for s in full} == {"a_total", "b", "b_bucket", "c_total"}
    assert full_bad == ["...", "!!garbage", "unread{broken 5"]


def test_names_read_follow_the_mappers():
    vllm = names_read(map_vllm)
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:request_success_total",
                 "vllm:num_preemptions"):
        assert name in vllm
    assert "vllm:iteration_tokens_total_bucket" not in vllm
    assert "tgi_request_input_length_sum" in names_read(map_tgi)


def test_filtered_snapshots_equal_the_unfiltered_mapping_on_the_real_captures():
    for text in vllm_captures():
        samples, bad = parse_prometheus_text(text)
        ref = _MAPPERS["vllm"](_Index(samples))
        snap = snapshot_from_metrics_text(text, name="e", flavor="vllm")
        for field, value in ref.fields.items():
            assert getattr(snap, field) == value, field
        assert snap.invalid == ref.invalid + [f"unparsed: {line}" for line in bad]
        kept, _ = parse_prometheus_text(text, keep=_KEEP["vllm"])
        assert len(kept) <= len(samples)


def test_bundled_metrics_keep_reads_only_the_latency_histograms():
    keep = bundled._KEEP
    for base in METRIC_HISTOGRAMS.values():
        assert {base + "_bucket", base + "_sum", base + "_count"} <= keep
    assert "inferctl_engine_kv_cache_usage_ratio" not in keep


@pytest.mark.parametrize("body", [b'{"a": 1, "b": [1.5, "x", null, true]}', b'{"a": NaN, "b": Infinity}',
                                  b'\xef\xbb\xbf{"a": 2}', b'  {"n": -0.0}  '])
def test_loads_stats_equals_json_loads(body):
    got, want = loads_stats(body), json.loads(body)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    if "a" in want and isinstance(want["a"], float) and math.isnan(want["a"]):
        assert math.isnan(got["a"])


def test_loads_stats_reads_without_the_standard_library_on_plain_json(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("json.loads used")
    monkeypatch.setattr(bundled.json, "loads", refuse)
    assert loads_stats(b'{"engine": {"precision": "full"}}') == {"engine": {"precision": "full"}}
    with pytest.raises(ValueError):
        monkeypatch.undo()
        loads_stats(b"{not json")


class CountingGpus(dict):
    def __init__(self, *a):
        super().__init__(*a)
        self.scans = 0

    def values(self):
        self.scans += 1
        return super().values()


def test_gpu_of_indexes_a_reading_once_and_follows_a_new_one():
    gpus = CountingGpus({f"GPU-{i}": GpuSnapshot(index=i, uuid=f"GPU-{i}") for i in range(64)})
    state = ControllerState([f"e{i}" for i in range(256)], {f"e{i}": i % 64 for i in range(256)})
    state.reading = GpuReading(source="t", ok=True, gpus=gpus, time=0.0)
    for i in range(256):
        assert state.gpu_of(f"e{i}").index == i % 64
    assert gpus.scans == 1                                    # one scan for 256 engines, not 256
    gpus["GPU-x"] = GpuSnapshot(index=99, uuid="GPU-x")      # the same dict grown: indexed again
    state.engine_gpu["late"] = 99
    assert state.gpu_of("late").uuid == "GPU-x"
    other = {"GPU-7b": GpuSnapshot(index=7, uuid="GPU-7b"), "GPU-7c": GpuSnapshot(index=7, uuid="GPU-7c")}
    state.reading = GpuReading(source="t", ok=True, gpus=other, time=1.0)
    assert state.gpu_of("e7").uuid == "GPU-7b"               # the first with that index, as a scan
    assert state.gpu_of("e8") is None
    state.reading = GpuReading(source="t", ok=False, gpus=other, time=2.0)
    assert state.gpu_of("e7") is None


@pytest.mark.parametrize("value", [0, 5, -1, 2 ** 63 - 1, 2 ** 63, 10 ** 400, 0.0, -0.0, 0.5, 1.0, 1.0000001, -1e-9,
                                   math.nan, math.inf, -math.inf, True, "5", None])
def test_gpu_cleaning_keeps_or_drops_exactly_what_check_number_rejects(value):
    from inferctl.controller.signals import clean_gpu_snapshot
    from inferctl.controller.signals.validation import validate_nonneg, validate_ratio

    snap = GpuSnapshot(uuid="g", index=0, power_watts=value, utilization_ratio=value)
    dropped = clean_gpu_snapshot(snap)
    want = [f for f, check in (("power_watts", validate_nonneg), ("utilization_ratio", validate_ratio))
            if value is not None and check(value).value is None]
    assert dropped == want
    assert (snap.power_watts is None) == (value is None or "power_watts" in want)


def test_invalid_samples_warn_once_per_change_and_are_counted_every_poll(caplog):
    import logging

    import httpx

    from inferctl.controller.engines.promtext import PromTextEngineClient

    bodies = ['vllm:num_requests_running{model_name="m"} 1\nvllm:kv_cache_usage_perc{model_name="m"} -0.5\n...\n']
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=bodies[0]))
    client = PromTextEngineClient("e", "http://engine", "vllm", transport=transport)
    with caplog.at_level(logging.DEBUG, logger="inferctl.controller.engines.promtext"):
        for i in range(3):
            snap = client.poll(float(i))
            assert snap.ok and snap.running == 1 and snap.kv_usage_ratio is None   # invalid: no data
        bodies[0] = bodies[0].replace("-0.5", "1.5")                             # a different bad value
        client.poll(3.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "1.5" in warnings[1].getMessage()
    assert client.invalid_samples_total == 8                                      # 2 per poll, 4 polls
    client.close()
