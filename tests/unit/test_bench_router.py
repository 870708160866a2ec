"""bench.router's pure parts: the load sentence, the affinity workload's prompts, the report."""

from bench.router import load_sentence, render, system_prompts


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
    return {"ttft_p50": p50, "ttft_p99": 2 * p50, "ttft_mean": mean, "n": 9, "errors": 0, "empty": 0,
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
