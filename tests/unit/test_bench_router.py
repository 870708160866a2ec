"""bench.router's pure parts: the load sentence, the affinity workload's prompts, the report, the
router-side overhead quantile, the per-turn affinity table."""

import os
import threading

import pytest

from bench.router import _pin, histogram_quantile, load_sentence, render, system_prompts
from bench.router_affinity import by_turn_table, summarize


def test_the_load_warning_appears_only_above_the_cpu_count():
    quiet = load_sentence("up 6:19, load average: 0.65, 1.01, 1.32", 0.65, 2)
    busy = load_sentence("up 6:19, load average: 7.9, 5.0, 3.1", 7.9, 2)
    assert "above the CPU count (2)" not in quiet and "0.65 on 2 CPUs" in quiet
    assert "shared with other engineers" not in quiet
    assert "**The load average at the start (7.9) was above the CPU count (2)**" in busy


def test_system_prompts_are_long_distinct_and_never_reused_by_a_later_run():
    first, second = system_prompts(0, 3, 2000), system_prompts(1, 3, 2000)
    assert len(first) == 3 and all(len(p) > 2000 for p in first)
    passages = [p.split("\n\n", 1)[1] for p in first + second]
    assert len(set(passages)) == 6 and all(len(p) == 2000 for p in passages)
    assert system_prompts(0, 3, 2000) == first        # the same run gets the same prompts


def _run(p50, mean, hit, replicas):
    turns = [{"turn": 1, "ttft_p50": 4 * p50, "ttft_mean": 4 * mean, "n": 3, "cached": 0.1},
             {"turn": 2, "ttft_p50": p50, "ttft_mean": mean, "n": 3, "cached": hit / 1000},
             {"turn": 3, "ttft_p50": p50 / 2, "ttft_mean": mean / 2, "n": 3, "cached": hit / 1000}]
    return {"ttft_p50": p50, "ttft_p99": 2 * p50, "ttft_mean": mean, "later_p50": p50 / 2, "later_mean": mean / 2,
            "turns": turns, "n": 9, "errors": 0, "empty": 0,
            "replicas": replicas, "samples": [], "cache_queried": 1000.0, "cache_hit": hit, "wall": 12.0, "run": 1}


def test_render_reports_the_affinity_gain_cache_share_and_batches():
    over = {"direct_p50": 0.3, "direct_p99": 0.4, "router_p50": 0.31, "router_p99": 0.45, "direct_rps": 200.0,
            "router_rps": 180.0, "errors": 0, "n": 512, "router_own_mean": 0.0003, "router_cpu_ms_per_req": 1.5,
            "engine_cpu_ms_per_req_direct": 4.5, "engine_cpu_ms_per_req_routed": 4.7, "seqs_per_step_direct": 30.0,
            "seqs_per_step_routed": 28.0, "added_p50": 0.01, "added_p99": 0.05}
    tp = {k: {"tok_s": 1000.0, "req_s": 30.0, "p50": 0.5, "errors": 0} for k in ("r1", "r2", "r3")}
    aff = {"runs": {"aff": [_run(0.5, 1.0, 800.0, {"chat-0": 9})], "off": [_run(2.0, 2.5, 400.0, {"chat-1": 9})]},
           "chats": 6, "groups": 3, "turns": 3, "system_chars": 6000, "model": "SmolLM2", "max_tokens": 8}
    res = {"overhead": [over], "sequential": [{"direct_p50": 0.03, "router_p50": 0.032, "added_p50": 0.002}],
           "throughput": tp, "affinity": aff, "clients": 64, "per_client": 4, "tp_seconds": 6.0}
    text = render(res, "load average: 0.5", {"load_1m": 0.5, "cpus": 2})
    assert "**75.0 % lower p50**" in text and "60.0 % lower mean" in text    # 1 - 0.5/2.0, 1 - 1.0/2.5
    assert "| 80.0 |" in text and "| 40.0 |" in text                          # cached share of each run
    assert "30.0 / 28.0" in text and "| 1.50 |" in text
    assert "was above the CPU count" not in text and "0.5 on 2 CPUs" in text


def test_the_router_side_quantile_follows_prometheus_histogram_quantile_over_the_rounds_buckets():
    inf = float("inf")
    before = {"buckets": {0.001: 10.0, 0.002: 10.0, 0.005: 10.0, inf: 10.0}}
    after = {"buckets": {0.001: 10.0, 0.002: 70.0, 0.005: 100.0, inf: 110.0}}   # this round: 0 / 60 / 30 / 10
    # rank 50 of 100 falls in (0.001, 0.002], 50 of its 60: 0.001 + 0.001 * 50/60
    assert abs(histogram_quantile(0.5, before, after) - (0.001 + 0.001 * 50 / 60)) < 1e-12
    assert histogram_quantile(0.95, before, after) == 0.005       # rank 95 in +Inf: the highest finite bound
    assert histogram_quantile(0.5, after, after) is None          # nothing observed in the round


def test_summarize_and_the_by_turn_table_separate_the_cold_turn_from_the_later_ones():
    res = {"ttft": [4.0, 4.0, 1.0, 1.0, 0.5, 0.5], "errors": 0, "empty": 0, "replicas": {"a": 6}, "samples": [],
           "by_turn": [{"ttft": [4.0, 4.0], "queried": 100.0, "hit": 0.0},
                       {"ttft": [1.0, 1.0], "queried": 200.0, "hit": 150.0},
                       {"ttft": [0.5, 0.5], "queried": 0.0, "hit": 0.0}]}
    r = summarize(res, 1, 10.0, 300.0, 150.0)
    assert [t["ttft_p50"] for t in r["turns"]] == [4.0, 1.0, 0.5]
    assert [t["cached"] for t in r["turns"]] == [0.0, 0.75, None]           # nothing looked up: no data, not 0
    assert r["later_p50"] == 0.75 and r["later_mean"] == 0.75 and r["ttft_mean"] == 11 / 6
    off = summarize({**res, "by_turn": [{"ttft": [4.0, 4.0], "queried": 100.0, "hit": 0.0},
                                        {"ttft": [3.0, 3.0], "queried": 200.0, "hit": 50.0},
                                        {"ttft": [3.0, 3.0], "queried": 200.0, "hit": 50.0}],
                     "ttft": [4.0, 4.0, 3.0, 3.0, 3.0, 3.0]}, 2, 10.0, 500.0, 100.0)
    table, gain = by_turn_table({"runs": {"aff": [r], "off": [off]}, "turns": 3})
    assert abs(gain["later_p50"] - 0.75) < 1e-12                             # 1 - 0.75 / 3.0
    assert "| **gain** (1 − affinity ÷ off) | 1 | 0.0 % |" in table         # the cold turn: no gain
    assert "| **gain** (1 − affinity ÷ off) | 2 | 66.7 % |" in table
    assert "| affinity | 2 | 1,000.0 | 1,000.0 | 75.0 |" in table


def test_pinning_reaches_every_thread_of_the_process_not_only_the_main_one():
    allowed = os.sched_getaffinity(0)
    one = {min(allowed)}
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        _pin(0, one)
        tids = os.listdir(f"/proc/{os.getpid()}/task")
        assert len(tids) >= 2 and all(os.sched_getaffinity(int(t)) == one for t in tids)
    finally:
        _pin(0, allowed)
        stop.set()
        worker.join()
    assert os.sched_getaffinity(0) == allowed


def test_overhead_only_write_replaces_part_one_and_keeps_the_rest_of_the_router_section():
    from bench.router import OVERHEAD_END, OVERHEAD_START, replace_overhead

    legacy = ("# B\n\n<!-- bench:other:start -->\nother\n<!-- bench:other:end -->\n\n<!-- bench:router:start -->\n"
              "### Router\n\nload sentence\n\n**Router overhead**, old table\n\n| old |\n\nOne client, old.\n\n"
              "**Aggregate throughput** table\n\n**Prefix affinity** table\n\nLead's note.\n"
              "<!-- bench:router:end -->\n")
    once = replace_overhead(legacy, "NEW overhead block")
    assert "old table" not in once and "One client, old." not in once and "| old |" not in once
    assert f"load sentence\n\n{OVERHEAD_START}\nNEW overhead block\n{OVERHEAD_END}\n\n**Aggregate throughput**" in once
    assert once.endswith("**Prefix affinity** table\n\nLead's note.\n<!-- bench:router:end -->\n")
    assert once.startswith("# B\n\n<!-- bench:other:start -->\nother\n")
    twice = replace_overhead(once, "NEWER")           # the markers now bound part 1
    assert "NEW overhead block" not in twice and twice.count(OVERHEAD_START) == 1
    assert f"{OVERHEAD_START}\nNEWER\n{OVERHEAD_END}\n\n**Aggregate throughput**" in twice
    assert twice.replace("NEWER", "NEW overhead block") == once
    with pytest.raises(ValueError):
        replace_overhead("# B\n", "x")
    with pytest.raises(ValueError):
        replace_overhead("<!-- bench:router:start -->\nno part 1\n<!-- bench:router:end -->", "x")


def test_the_full_report_marks_part_one_so_an_overhead_only_run_can_replace_it():
    from bench.router import OVERHEAD_END, OVERHEAD_START, render_overhead

    over = {"direct_p50": 0.3, "direct_p99": 0.4, "router_p50": 0.301, "router_p99": 0.45, "direct_rps": 200.0,
            "router_rps": 180.0, "errors": 0, "n": 512, "router_own_mean": 0.0003, "router_cpu_ms_per_req": 0.7,
            "engine_cpu_ms_per_req_direct": 4.5, "engine_cpu_ms_per_req_routed": 4.7, "seqs_per_step_direct": 30.0,
            "seqs_per_step_routed": 28.0, "added_p50": 0.001, "added_p99": 0.05}
    ov = {"overhead": [over], "sequential": [{"direct_p50": 0.03, "router_p50": 0.032, "added_p50": 0.002}],
          "clients": 64, "per_client": 4, "pinned": [[0], [1]]}
    text = render_overhead(ov)
    assert "**added p50 1.00 ms**" in text and "**Target met**" in text and "| 0.70 |" in text
    assert "router on CPU [1]" in text
    tp = {k: {"tok_s": 1000.0, "req_s": 30.0, "p50": 0.5, "errors": 0} for k in ("r1", "r2", "r3")}
    aff = {"runs": {"aff": [_run(0.5, 1.0, 800.0, {"chat-0": 9})], "off": [_run(2.0, 2.5, 400.0, {"chat-1": 9})]},
           "chats": 6, "groups": 3, "turns": 3, "system_chars": 6000, "model": "SmolLM2", "max_tokens": 8}
    full = render({**ov, "throughput": tp, "affinity": aff, "tp_seconds": 6.0}, "load average: 0.5",
                  {"load_1m": 0.5, "cpus": 2})
    assert f"{OVERHEAD_START}\n{text}\n{OVERHEAD_END}" in full
    assert full.index(OVERHEAD_END) < full.index("**Aggregate throughput**")


def test_the_overhead_part_names_the_haproxy_data_plane_and_drops_the_python_explanation():
    from bench.router import main, render_overhead

    over = {"direct_p50": 0.030, "direct_p99": 0.04, "router_p50": 0.0335, "router_p99": 0.045, "direct_rps": 200.0,
            "router_rps": 190.0, "errors": 0, "n": 512, "router_own_mean": None, "router_cpu_ms_per_req": 0.05,
            "engine_cpu_ms_per_req_direct": 4.5, "engine_cpu_ms_per_req_routed": 4.7, "seqs_per_step_direct": 30.0,
            "seqs_per_step_routed": 28.0, "added_p50": 0.0035, "added_p99": 0.005}
    ov = {"overhead": [over], "sequential": [{"direct_p50": 0.03, "router_p50": 0.032, "added_p50": 0.002}],
          "clients": 64, "per_client": 4, "pinned": [[0], [1]], "data_plane": "haproxy"}
    text = render_overhead(ov)
    assert "(`--data-plane haproxy`: HAProxy carries the requests" in text
    assert "**Target not met** (median of the rounds)." in text and "one event loop" not in text
    python = render_overhead({**ov, "data_plane": "python"})
    assert "--data-plane" not in python and "one event loop" in python
    with pytest.raises(SystemExit) as exc:            # only the overhead part measures another plane
        main(["--router-data-plane", "haproxy", "--reference-proxy", "none"])
    assert exc.value.code == 2


def test_descendants_finds_the_routers_one_haproxy_child_as_the_bench_reads_it():
    import subprocess
    import sys

    from bench.router import descendants

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess,sys; p=subprocess.Popen(['sleep','30']);"
                               "print(p.pid, flush=True); sys.stdin.read()"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert descendants(parent.pid) == [child]
    finally:
        subprocess.run(["kill", str(child)])
        parent.stdin.close()
        parent.wait(10)


def test_overhead_write_keeps_the_previous_runs_below_the_new_one():
    from bench.router import OVERHEAD_END, OVERHEAD_START, replace_overhead

    doc = (f"<!-- bench:router:start -->\nintro\n\n{OVERHEAD_START}\nPart 1, finished 2026-12-04 12:43 UTC; old.\n\n"
           f"#### Earlier run (2026-12-03 06:33 UTC)\n\nolder\n{OVERHEAD_END}\n\n**Aggregate throughput**\n"
           "<!-- bench:router:end -->\n")
    out = replace_overhead(doc, "Part 1, finished 2026-12-04 14:40 UTC; new.", keep=True)
    inner = out[out.index(OVERHEAD_START):out.index(OVERHEAD_END)]
    assert inner.index("new.") < inner.index("#### Earlier run (2026-12-04 12:43 UTC)") < inner.index("old.") \
        < inner.index("#### Earlier run (2026-12-03 06:33 UTC)") < inner.index("older")
    assert out.count(OVERHEAD_START) == 1 and out.endswith("**Aggregate throughput**\n<!-- bench:router:end -->\n")
    assert "old." not in replace_overhead(doc, "new.")           # without keep: replaced


def test_the_overhead_reading_of_a_router_without_the_histograms_is_no_data():
    from bench.router import histogram_quantile, parse_overhead

    empty = parse_overhead("inferctl_router_requests_total{replica=\"e0\",status=\"2xx\"} 5.0\n")
    assert (empty["count"], empty["upstream_count"], empty["buckets"]) == (0.0, 0.0, {})
    assert histogram_quantile(0.5, empty, empty) is None
    full = parse_overhead('inferctl_router_overhead_seconds_bucket{le="0.001"} 3.0\n'
                          'inferctl_router_overhead_seconds_bucket{le="+Inf"} 4.0\n'
                          "inferctl_router_overhead_seconds_count 4.0\ninferctl_router_overhead_seconds_sum 0.01\n")
    assert (full["count"], full["sum"], full["buckets"][0.001]) == (4.0, 0.01, 3.0)
