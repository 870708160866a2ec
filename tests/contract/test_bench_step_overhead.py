"""bench.step_overhead at tiny sizes (plumbing, not a benchmark)."""

from __future__ import annotations

from bench.step_overhead import best, measure


def test_measure_reports_step_times_op_counts_and_a_token_hash(stories_dir):
    a = measure("stories260K", "full", 6)
    assert 0 < a["b1_p10_ms"] <= a["b1_p50_ms"] and a["b32_ms_per_step"] > 0
    # a fused batch-1 step is ~30 aten ops since wave 9 (the token ids and positions go into the op): the
    # profiler counted real ops, not just the step's few Python-level calls
    assert a["b32_aten_ops"] >= a["b1_aten_ops"] > 20
    assert len(a["tokens_sha1"]) == 12 and a["torch_threads"] == 1
    b = measure("stories260K", "full", 6)
    assert b["tokens_sha1"] == a["tokens_sha1"]        # greedy: the same tokens every run


def test_best_takes_the_lowest_times_and_lists_every_hash():
    runs = [dict(b1_p10_ms=2.0, b1_p50_ms=3.0, b32_ms_per_step=9.0, b1_aten_ops=900, b32_aten_ops=1000,
                 tokens_sha1="aaa"),
            dict(b1_p10_ms=1.5, b1_p50_ms=3.5, b32_ms_per_step=8.0, b1_aten_ops=900, b32_aten_ops=1000,
                 tokens_sha1="bbb")]
    b = best(runs)
    assert (b["b1_p10_ms"], b["b1_p50_ms"], b["b32_ms_per_step"]) == (1.5, 3.0, 8.0)
    assert b["hashes"] == ["aaa", "bbb"]
