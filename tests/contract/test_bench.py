"""The benchmark plumbing (tiny sizes: these are not benchmarks)."""

from __future__ import annotations

import pytest

from bench import common
from bench.runners import RunResult, run_engine, run_hf_static, static_batch_accounting
from bench.sweep import falls
from bench.throughput import render as render_throughput


def test_workload_is_seeded_and_in_range():
    a = common.make_workload(32, 512)
    assert a == common.make_workload(32, 512)
    assert a != common.make_workload(32, 512, seed=1)
    assert all(16 <= len(r.prompt) <= 256 and 16 <= r.max_tokens <= 256 for r in a)
    assert all(3 <= t < 512 for r in a for t in r.prompt)
    assert len({len(r.prompt) for r in a}) > 10             # mixed lengths
    with pytest.raises(ValueError, match="output_range"):
        common.make_workload(2, 512, output_range=(5, 4))


def test_workload_reproduces_performance_md_static_waste():
    """docs/performance.md (earlier baseline): HF static batch of 32: 38 % padded prefill, 51 % of decode slots on
    finished requests — the same requests, not just the same distribution."""
    acc = static_batch_accounting(common.make_workload(32, 32000))
    assert acc["prefill_pad"] / acc["prefill_total"] == pytest.approx(0.38, abs=0.005)
    assert acc["finished_slots"] / acc["decode_total"] == pytest.approx(0.51, abs=0.005)


def test_static_batch_accounting_by_hand():
    reqs = [common.Request((5,) * 2, 1), common.Request((5,) * 4, 3)]
    acc = static_batch_accounting(reqs)
    # P_max 4, O_max 3: prefill pad 2 of 8; finished slots 2 of 6
    assert (acc["prefill_pad"], acc["prefill_total"], acc["finished_slots"], acc["decode_total"]) == (2, 8, 2, 6)
    # held: 2*(4+1) + 2*(4+2) + 2*(4+3) = 36; real: (2+1 + 4+1) + (3 + 6) + (3 + 7) = 27
    assert (acc["kv_held"], acc["kv_real"]) == (36, 27)


def test_percentile_matches_numpy():
    import numpy as np

    vals = [0.3, 1.0, 0.2, 5.0, 2.5]
    for q in (0, 50, 90, 99, 100):
        assert common.percentile(vals, q) == pytest.approx(float(np.percentile(vals, q)))
    assert common.percentile([], 50) is None


def test_write_section_replaces_only_its_own(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("# Benchmarks\n\nhand-written intro\n")
    facts = {"load_1m": 0.5, "load_5m": 0.4, "load_15m": 0.3, "cpus": 2, "cpu": "x", "torch": "t"}
    common.write_section("a", common.section("a", "A", "first", facts, cmd="python -m bench.a"), doc)
    common.write_section("b", common.section("b", "B", "other", facts, cmd="python -m bench.b"), doc)
    common.write_section("a", common.section("a", "A", "second", facts, cmd="python -m bench.a --x"), doc)
    text = doc.read_text()
    assert "hand-written intro" in text and "other" in text and "second" in text and "first" not in text
    assert text.count("<!-- bench:a:start -->") == 1 and "`python -m bench.a --x`" in text
    assert "load average at the start 0.5 / 0.4 / 0.3" in text
    with pytest.raises(ValueError):
        common.write_section("a", "not a section", doc)


def test_falls_and_verdicts():
    assert falls([10.0, 20.0, 19.5, 40.0]) == [(2, pytest.approx(0.025))]
    base = RunResult("hf-static", "m", 32, 32, 100, 1.0, [1.0] * 32, 0.4, 0.38, 0.51, 0.4)
    eng = RunResult("engine", "m", 32, 32, 100, 0.25, [0.2] * 32, 0.0, None, None, 0.03,
                    extra={"mean_batch": 20.0, "steps": 50, "preemptions": 0})
    text = render_throughput([base, eng])
    assert "4.00×" in text and "target ≥ 3×: met" in text and "≤ 4 %: met" in text


def test_engine_runner_on_stories(stories_dir):
    reqs = common.make_workload(3, 512, prompt_range=(4, 12), output_range=(3, 9))
    r = run_engine(stories_dir / "stories260K.bin", reqs, threads=1, name="stories")
    assert r.useful_tokens == sum(q.max_tokens for q in reqs)
    assert r.padding_ratio == 0.0 and 0 <= r.kv_waste_ratio < 1
    assert len(r.latencies) == 3 and r.p99 >= r.p50 > 0


def test_hf_static_runner_on_converted_stories(tmp_path, stories_dir):
    from inferctl.engine.loader import load_llama2c, save_hf_dir

    d = save_hf_dir(load_llama2c(stories_dir / "stories260K.bin"), tmp_path / "hf")
    reqs = [common.Request(tuple(range(10, 14)), 2), common.Request(tuple(range(10, 16)), 4)]
    r = run_hf_static(d, reqs, batch_size=2, threads=1, warmup=False)
    assert r.useful_tokens == 6 and r.batch == 2
    assert r.prefill_pad_ratio == pytest.approx(2 / 12) and r.finished_slot_ratio == pytest.approx(2 / 8)
    assert len(r.latencies) == 2 and r.latencies[0] == r.latencies[1]     # a static batch ends together


def test_controller_tick_runs_at_tiny_sizes(stories_dir, capsys):
    """``python -m bench.controller_tick`` runs (4 engines over loopback HTTP, 1 GPU, 1 tick,
    no doc write) and reports every engine up."""
    from bench.controller_tick import main

    assert main(["--engines", "4", "--ticks", "1", "--quick", "--probe", "0", "--models", "aiohttp"]) == 0
    out = capsys.readouterr().out
    assert "Tick CPU at 4 engines" in out and "| 4 / 1 | aiohttp | 4/4 |" in out
