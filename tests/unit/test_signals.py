"""Signals: pure functions, checked against field cases F01, F03, F04, F05, F11, F12, F13, F20
and against PromQL's histogram_quantile."""

from __future__ import annotations

import math
import re

import pytest

from inferctl.controller import signals as S
from inferctl.controller.types import EngineSnapshot

MiB = 1 << 20
GiB = 1 << 30


# --------------------------------------------------------------------------- validation, F01
def test_validate_ratio_rejects_and_counts_each_reason():
    c = S.InvalidSampleCounter()
    assert S.validate_ratio(0.41, "kv", c).value == 0.41
    bad = {-0.3875395987328405: "negative", float("nan"): "nan", float("inf"): "inf",
           1.2: "above_one"}
    for x, code in bad.items():
        s = S.validate_ratio(x, "kv", c)
        assert s.value is None and s.invalid
        assert c.count("kv", code) == 1
    s = S.validate_ratio(True, "kv", c)
    assert s.value is None and c.count("kv", "not_a_number") == 1
    missing = S.validate_ratio(None, "kv", c)
    assert missing.value is None and not missing.invalid
    assert c.count("kv") == 5          # None is no data, not an invalid sample
    assert c.by_signal() == {"kv": 5}


def test_validate_nonneg_allows_above_one_but_not_negative():
    c = S.InvalidSampleCounter()
    assert S.validate_nonneg(12345.0, "bytes", c).value == 12345.0
    assert S.validate_nonneg(-1, "bytes", c).value is None
    assert c.snapshot() == {"bytes": {"negative": 1}}


def test_f01_fleet_mean_uses_valid_samples_only():
    c = S.InvalidSampleCounter()
    fleet = S.fleet_mean({"0": 0.41, "3": -0.3875395987328405}, "kv_cache_usage_ratio", c)
    assert fleet.fleet.value == pytest.approx(0.41)
    assert fleet.members["0"].value == 0.41
    assert fleet.members["3"].value is None and fleet.members["3"].invalid
    assert "-0.3875" in fleet.members["3"].reason
    assert c.count("kv_cache_usage_ratio", "negative") == 1
    assert fleet.fleet.inputs["excluded"] == ["3"]


def test_fleet_mean_without_valid_samples_is_no_data():
    fleet = S.fleet_mean({"a": None, "b": float("nan")}, "kv")
    assert fleet.fleet.value is None


# --------------------------------------------------------------------------- F05 ratios
def test_f05_aggregate_then_divide():
    fleet = S.fleet_ratio({"A": (50, 100), "B": (0, 0)}, "prefix_cache_hit_ratio")
    assert fleet.fleet.value == pytest.approx(0.50)     # not mean(0.5, 0) = 0.25
    assert fleet.members["A"].value == pytest.approx(0.5)
    assert fleet.members["B"].value is None and not fleet.members["B"].invalid
    assert "0 of 0" in fleet.members["B"].reason


def test_ratio_numerator_above_denominator_is_invalid():
    c = S.InvalidSampleCounter()
    s = S.ratio(120, 100, "hit", c)
    assert s.value is None and s.invalid and c.count("hit", "above_one") == 1


# --------------------------------------------------------------------------- memory, F11, F13
@pytest.mark.parametrize("alloc,unalloc,expected_pct", [
    (13.73 * GiB, 736.86 * MiB, 4.98),   # F13 (a)
    (93.46 * GiB, 100.28 * MiB, 0.10),   # F13 (b)
    (25.50 * GiB, 3.14 * GiB, 10.96),    # F13 (c)
])
def test_f13_fragmentation_from_oom_record(alloc, unalloc, expected_pct):
    s = S.fragmentation_from_oom(alloc, unalloc)
    assert round(s.value * 100, 2) == expected_pct


def test_fragmentation_ratio_values_and_no_data():
    c = S.InvalidSampleCounter()
    s = S.fragmentation_ratio(100 * MiB, 70 * MiB, c)
    assert s.value == pytest.approx(0.30)
    assert s.inputs["unallocated_bytes"] == 30 * MiB
    assert S.fragmentation_ratio(0, 0, c).value is None          # nothing reserved
    assert S.fragmentation_ratio(None, 5, c).value is None
    bad = S.fragmentation_ratio(10 * MiB, 20 * MiB, c)           # allocated > reserved
    assert bad.value is None and bad.invalid
    assert c.count("fragmentation_ratio", "inconsistent") == 1
    assert c.count() == 1


def test_free_memory_is_not_fragmentation():
    # docs/signals.md worked example: 80 GiB GPU, 60 GiB used; the allocator holds 60 GiB of
    # which 30 GiB are tensors.
    free = S.free_memory_ratio(60 * GiB, 80 * GiB)
    frag = S.fragmentation_ratio(60 * GiB, 30 * GiB)
    assert free.value == pytest.approx(0.25)       # the design notes' "100 - used/total*100" = 25 %
    assert frag.value == pytest.approx(0.50)       # half of what the allocator holds is unusable
    assert S.free_memory_ratio(90 * GiB, 80 * GiB).invalid
    assert S.free_memory_ratio(1, 0).value is None


def test_f11_used_ratio_with_and_without_reserved():
    used = S.memory_used_ratio(116 * MiB, 12288 * MiB)
    with_reserved = S.memory_used_ratio(116 * MiB, 12288 * MiB, 368 * MiB, count_reserved=True)
    assert round(used.value * 100, 2) == 0.94
    assert round(with_reserved.value * 100, 2) == 3.94


def test_kv_waste_ratio():
    assert S.kv_waste_ratio(40, 3, 16).value == pytest.approx(1 - 40 / 48)
    assert S.kv_waste_ratio(0, 0, 16).value is None
    c = S.InvalidSampleCounter()
    assert S.kv_waste_ratio(50, 3, 16, c).invalid
    assert c.count("kv_waste_ratio") == 1


# --------------------------------------------------------------------------- counters, F04, F05
def test_counter_delta_and_reset():
    d = S.counter_delta(100, 130)
    assert d.value == 30 and d.inputs["reset"] is False
    r = S.counter_delta(1000, 40)          # restarted: the new value is the increase
    assert r.value == 40 and r.inputs["reset"] is True and "reset" in r.reason
    assert S.counter_delta(None, 5).value is None
    c = S.InvalidSampleCounter()
    assert S.counter_delta(5, float("nan"), "steps", c).value is None
    assert c.count("steps", "nan") == 1


def test_padding_ratio_and_batch_size():
    assert S.padding_ratio(300, 100).value == pytest.approx(0.25)
    zero = S.padding_ratio(0, 0)
    assert zero.value is None and "no tokens" in zero.reason
    assert S.effective_batch_size(96, 12).value == pytest.approx(8.0)
    assert S.effective_batch_size(0, 0).value is None


def _eng(**kw) -> EngineSnapshot:
    return EngineSnapshot(name="e0", kind="bundled", ok=True, **kw)


def test_batch_window_empty_window_is_no_data():
    a = _eng(steps_total=10, step_sequences_total=40, real_tokens_total=500, padded_tokens_total=20)
    w = S.batch_window(a, _eng(steps_total=10, step_sequences_total=40, real_tokens_total=500,
                               padded_tokens_total=20))
    assert w["padding_ratio"].value is None and w["effective_batch_size"].value is None
    w2 = S.batch_window(a, _eng(steps_total=14, step_sequences_total=56, real_tokens_total=560,
                                padded_tokens_total=40))
    assert w2["padding_ratio"].value == pytest.approx(20 / 80)
    assert w2["effective_batch_size"].value == pytest.approx(4.0)
    # engine restarted between polls: counters went down, the new values are the window
    w3 = S.batch_window(a, _eng(steps_total=2, step_sequences_total=6, real_tokens_total=30,
                                padded_tokens_total=10))
    assert w3["effective_batch_size"].value == pytest.approx(3.0)
    assert w3["padding_ratio"].value == pytest.approx(0.25)
    assert S.batch_window(None, a)["padding_ratio"].value is None


def test_batch_window_missing_counter_is_no_data_not_zero():
    a = _eng(steps_total=10, step_sequences_total=40)
    b = _eng(steps_total=12, step_sequences_total=44)
    w = S.batch_window(a, b)
    assert w["padding_ratio"].value is None
    assert w["effective_batch_size"].value == pytest.approx(2.0)


# --------------------------------------------------------------------------- histograms
def test_histogram_quantile_matches_promql_interpolation():
    # the PromQL-compatible example in ClickHouse's quantilePrometheusHistogram docs: 0.35
    b = [(0, 6), (0.5, 11), (1, 14), ("+Inf", 19)]
    assert S.histogram_quantile(0.5, b).value == pytest.approx(0.35)
    # lowest bucket with bound <= 0: the bound itself
    assert S.histogram_quantile(0.1, b).value == 0
    # rank on a bucket boundary
    b2 = [(0.1, 50), (0.2, 100), (math.inf, 100)]
    assert S.histogram_quantile(0.5, b2).value == pytest.approx(0.1)
    assert S.histogram_quantile(0.75, b2).value == pytest.approx(0.15)


def test_histogram_quantile_on_real_vllm_capture(fixtures_dir):
    text = (fixtures_dir / "vllm" / "metrics_samples.txt").read_text()
    buckets, count = [], None
    for line in text.splitlines():
        m = re.match(r'vllm:time_to_first_token_seconds_bucket\{le="([^"]+)".*\} (\S+)$', line)
        if m:
            buckets.append((m.group(1), float(m.group(2))))
        m = re.match(r"vllm:time_to_first_token_seconds_count\{.*\} (\S+)$", line)
        if m:
            count = float(m.group(1))
            break
    assert count == 140.0 and len(buckets) == 8
    doc = {"buckets": buckets, "count": count}       # the excerpt has no +Inf line: count stands in
    p50 = S.histogram_quantile(0.5, doc)
    p99 = S.histogram_quantile(0.99, doc)
    assert p50.value == pytest.approx(0.02 + 0.02 * (70 - 13) / (97 - 13))   # 0.03357
    assert p99.value == pytest.approx(0.08 + 0.02 * (138.6 - 138) / 2)      # 0.086
    assert not p99.at_least


def test_saturated_top_bucket_is_at_least_bound():
    doc = {"buckets": [(0.1, 5), (0.5, 10), ("+Inf", 100)], "count": 100, "sum": 300.0}
    q = S.histogram_quantile(0.99, doc)
    assert q == S.Quantile(0.5, at_least=True)
    assert str(q) == "≥ 0.5"
    assert q.exceeds(10.0)             # "≥ bound" never proves compliance


def test_histogram_quantile_no_data_and_bad_q():
    assert S.histogram_quantile(0.5, [(0.1, 0), ("+Inf", 0)]) is None
    assert S.histogram_quantile(0.5, [(0.1, 3)]) is None             # no +Inf and no count
    with pytest.raises(ValueError, match="q"):
        S.histogram_quantile(1.5, [(0.1, 1), ("+Inf", 1)])
    with pytest.raises(ValueError, match="q"):
        S.histogram_quantile(float("nan"), [(0.1, 1), ("+Inf", 1)])


def test_f03a_all_in_lowest_bucket_with_zero_sum_is_flagged():
    les = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
           "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "+Inf"]
    doc = {"buckets": [(le, 208) for le in les], "sum": 0.0, "count": 208}
    c = S.InvalidSampleCounter()
    s = S.latency_summary(doc, (0.5, 0.95, 0.99), counter=c)
    assert s.p(0.5).value == pytest.approx(0.0005)
    assert "implausible_zero_sum" in s.flags and not s.slo_usable
    assert c.count("ttft_seconds", "implausible_zero_sum") == 1


def test_f03b_more_observations_than_requests_is_inconsistent():
    doc = {"buckets": [(0.001, 8060), (0.005, 8060), ("+Inf", 8060)], "sum": 0.587, "count": 8060}
    c = S.InvalidSampleCounter()
    s = S.latency_summary(doc, finished_total=3810 + 108, running=0, counter=c)
    assert s.flags == ("count_exceeds_requests",)
    assert not s.slo_usable and "kept out of SLO" in s.reason
    assert c.count("ttft_seconds", "count_exceeds_requests") == 1
    ok = S.latency_summary(doc, finished_total=8000, running=60)
    assert ok.slo_usable and ok.flags == ()


def test_mean_outside_buckets_and_count_mismatch_are_flagged():
    doc = {"buckets": [(0.1, 10), (0.5, 10), ("+Inf", 10)], "sum": 30.0, "count": 10}
    assert "mean_outside_buckets" in S.latency_summary(doc).flags     # mean 3 s, all <= 0.1 s
    doc2 = {"buckets": [(0.1, 10), ("+Inf", 10)], "sum": 0.5, "count": 12}
    assert "count_mismatch" in S.latency_summary(doc2).flags


def test_f04_identical_scrapes_give_no_quantiles():
    h = {"buckets": [(0.1, 10), (0.5, 30), ("+Inf", 31)], "sum": 6.2, "count": 31}
    delta = S.histogram_delta(h, dict(h))
    assert delta.observations == 0
    s = S.latency_summary(delta, (0.5, 0.95, 0.99))
    assert s.quantiles == {0.5: None, 0.95: None, 0.99: None}
    assert all(v is None or not math.isnan(v.value) for v in s.quantiles.values())
    assert not s.slo_usable and s.reason == "no observations"


def test_histogram_delta_window_and_reset():
    a = {"buckets": [(0.1, 10), (0.5, 30), ("+Inf", 31)], "sum": 6.0, "count": 31}
    b = {"buckets": [(0.1, 12), (0.5, 40), ("+Inf", 50)], "sum": 16.0, "count": 50}
    d = S.histogram_delta(a, b)
    assert d.buckets == ((0.1, 2.0), (0.5, 10.0), (math.inf, 19.0))
    assert d.sum == pytest.approx(10.0) and d.count == 19
    reset = {"buckets": [(0.1, 1), (0.5, 2), ("+Inf", 2)], "sum": 0.3, "count": 2}
    r = S.histogram_delta(b, reset)
    assert r.observations == 2 and "reset" in r.notes[0]
    assert S.histogram_delta(None, b) is None


def test_to_histogram_rejects_bad_documents_naming_the_field():
    with pytest.raises(S.InvalidHistogram, match="buckets"):
        S.to_histogram({"sum": 1})
    with pytest.raises(S.InvalidHistogram, match=r"buckets\[1\]\.count"):
        S.to_histogram({"buckets": [(0.1, 1), ("+Inf", -2)]})
    s = S.latency_summary({"buckets": [(0.1, float("nan")), ("+Inf", 1)]})
    assert s.flags == ("invalid",) and s.p(0.99) is None


# --------------------------------------------------------------------------- quality, F20
F20 = [(1200, 180, 1024, "stop", 0.05), (2500, 210, 1024, "stop", 0.04),
       (4000, 240, 1024, "stop", 0.06), (9000, 1024, 1024, "length", 0.85),
       (12000, 1024, 1024, "length", 0.91), (15000, 1024, 1024, "length", 0.88)]


def _records(rows, precision="full"):
    return [{"prompt_tokens": p, "completion_tokens": c, "max_tokens": m, "finish_reason": f,
             "seq_rep": {"4": r}, "precision": precision} for p, c, m, f, r in rows]


def test_f20_degenerate_by_prompt_length_bucket():
    s = S.repetition_summary(_records(F20), edges=(8192,))
    assert {k: str(v) for k, v in s.by_bucket.items()} == {"<8192": "0/3", ">=8192": "3/3"}
    assert s.degenerate_rate.value == pytest.approx(0.5)
    assert s.mean_seq_rep.value == pytest.approx((0.05 + 0.04 + 0.06 + 0.85 + 0.91 + 0.88) / 6)
    d = S.repetition_summary(_records(F20))          # the engine's label set
    assert {k: str(v) for k, v in d.by_bucket.items()} == {
        "<512": "0/0", "512-2k": "0/1", "2k-8k": "0/2", ">=8k": "3/3"}
    assert d.by_bucket["<512"].rate is None
    assert str(d.by_precision["full"]) == "3/6"


def test_f20_diagnosis_names_long_context_not_int8():
    d = S.diagnose_degeneration(_records(F20))
    assert d.cause == "long_context"
    assert "long context" in d.reason and "not the int8" in d.reason
    assert d.inputs["long"] == "3/3" and d.inputs["short"] == "0/3"


def test_diagnosis_names_int8_when_int8_outputs_degenerate_at_equal_length():
    rows_full = [(1000, 100, 256, "stop", 0.05)] * 3
    rows_int8 = [(1000, 256, 256, "length", 0.80)] * 3
    d = S.diagnose_degeneration(_records(rows_full) + _records(rows_int8, "int8"))
    assert d.cause == "int8_precision"
    assert "3/3" in d.reason and "0/3" in d.reason


def test_diagnosis_no_degeneration_and_no_data():
    assert S.diagnose_degeneration(_records(F20[:3])).cause is None
    assert S.diagnose_degeneration([]).cause is None


def test_empty_window_repetition_is_no_data():
    s = S.repetition_summary([])
    assert s.mean_seq_rep.value is None and s.degenerate_rate.value is None


def test_engine_flag_and_repetition_stop_count_as_degenerate():
    recs = [{"prompt_tokens": 10, "seq_rep": {"4": 0.1}, "degenerate": True},
            {"prompt_tokens": 10, "finish_reason": "repetition"},
            {"prompt_tokens": 10, "seq_rep": {"4": float("nan")}}]     # unknown: excluded
    c = S.InvalidSampleCounter()
    s = S.repetition_summary(recs, counter=c)
    assert s.degenerate_rate.value == 1.0 and s.degenerate_rate.inputs["outputs"] == 2
    assert c.count("seq_rep_4", "nan") == 1


def test_perplexity_summary_excludes_invalid():
    c = S.InvalidSampleCounter()
    recs = [{"perplexity": math.exp(0.3755025565624237 / 3)}, {"perplexity": float("nan")},
            {"perplexity": 0.5}, {"perplexity": None}]
    s = S.perplexity_summary(recs, c)
    assert s.value == pytest.approx(1.1333, abs=1e-4)
    assert c.count("perplexity") == 2
    assert S.perplexity_summary([]).value is None


# --------------------------------------------------------------------------- OOM messages
F12 = ("CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of "
       "31.40 GiB of which 41.56 MiB is free.")
F13A = ("CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity of 15.77 GiB "
        "of which 514.19 MiB is free. Process 1 has 15.26 GiB memory in use. Of the allocated "
        "memory 13.73 GiB is allocated by PyTorch, and 736.86 MiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def test_parse_f12_message():
    n = S.parse_oom_message(F12)
    assert n.requested_bytes == 96 * MiB
    assert n.free_bytes == round(41.56 * MiB)
    assert n.total_bytes == round(31.40 * GiB)
    assert n.allocated_bytes is None
    assert S.format_bytes(n.free_bytes) == "41.56 MiB"
    assert S.format_bytes(n.requested_bytes) == "96.00 MiB"
    assert S.classify_oom(n) == "exhaustion"


def test_parse_and_classify_f13():
    a = S.parse_oom_message(F13A)
    assert a.reserved_unallocated_bytes == round(736.86 * MiB)
    assert a.allocated_bytes == round(13.73 * GiB)
    assert S.classify_oom(a) == "fragmentation"
    b = S.OomNumbers(requested_bytes=128 * MiB, free_bytes=round(100.19 * MiB),
                     allocated_bytes=round(93.46 * GiB),
                     reserved_unallocated_bytes=round(100.28 * MiB))
    assert S.classify_oom(b) == "exhaustion"
    c = S.OomNumbers(requested_bytes=round(124.68 * GiB), total_bytes=round(95.22 * GiB),
                     allocated_bytes=round(25.50 * GiB), reserved_unallocated_bytes=round(3.14 * GiB))
    assert S.classify_oom(c) == "impossible"
    assert S.classify_oom(S.OomNumbers()) is None


def test_parse_old_pytorch_format():
    old = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
           "14.56 GiB already allocated; 3.12 MiB free; 14.59 GiB reserved in total by PyTorch)")
    n = S.parse_oom_message(old)
    assert n.total_bytes == round(15.78 * GiB) and n.free_bytes == round(3.12 * MiB)
    assert n.reserved_unallocated_bytes == round(14.59 * GiB) - round(14.56 * GiB)
    assert S.classify_oom(n) == "fragmentation"      # 30 MiB unallocated >= 20 MiB requested


def test_parse_size_and_odd_text():
    assert S.parse_size("1.5 GiB") == 3 * GiB // 2
    with pytest.raises(ValueError, match="size"):
        S.parse_size("lots")
    assert S.parse_oom_message("something else entirely") == S.OomNumbers()
    assert S.parse_oom_message(None) == S.OomNumbers()


def test_hardware_fault_evidence():
    assert S.hardware_fault_evidence("CUDA error: out of memory (Xid 79)") == "Xid"
    assert S.hardware_fault_evidence("GPU has fallen off the bus") == "fallen off the bus"
    assert S.hardware_fault_evidence("uncorrectable ECC error encountered") is not None
    assert S.hardware_fault_evidence(F12) is None


def test_signal_is_a_frozen_dataclass_with_a_fresh_inputs_dict_each():
    """Signal's own __init__ keeps the dataclass contract: defaults, equality, replace, asdict,
    immutability, and a new ``inputs`` dict per signal (never one shared default)."""
    import dataclasses

    a, b = S.Signal("x", 1.0), S.Signal("x", 1.0)
    assert (a.reason, a.invalid, a.inputs) == (None, False, {})
    assert a == b and a.inputs is not b.inputs
    assert S.Signal("x", None, "why", True, {"raw": -1}).inputs == {"raw": -1}
    assert S.Signal("x", 1.0, inputs=None).inputs is None      # an explicit value is kept as given
    assert dataclasses.replace(a, value=2.0) == S.Signal("x", 2.0)
    assert dataclasses.asdict(S.Signal("y", 0.5, "r", False, {"k": 1})) == {
        "name": "y", "value": 0.5, "reason": "r", "invalid": False, "inputs": {"k": 1}}
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.value = 3.0
    assert repr(a) == "Signal(name='x', value=1.0, reason=None, invalid=False, inputs={})"
