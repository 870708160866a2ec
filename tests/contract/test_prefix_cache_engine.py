"""Automatic prefix caching in the real engine (stories260K): outputs identical with and
without caching, exact hit counts, reference counts after finish/abort/preemption, and the
precision switch invalidating the cache."""

from __future__ import annotations

import pytest

from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.sampling_params import SamplingParams
from tests.core_helpers import drain

BS = 16


@pytest.fixture(scope="module")
def prompts(bundle):
    enc = bundle.tokenizer.encode
    system = enc("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
                 "park with her friends. One day, her mom said", bos=True)
    tails = ["that they would go to the zoo.", "it was time for bed.", "she could have a cookie.",
             "the sun was very hot.", "a big dog was coming.", "Lily had to share her toys."]
    return [system + enc(" " + t, bos=False) for t in tails], len(system)


def metric(engine: LLMEngine, name: str) -> float:
    return engine.registry.get_sample_value(name) or 0.0


def steps(engine: LLMEngine, n: int, tokens: dict) -> None:
    """Run ``n`` steps, keeping the tokens they produce in ``tokens``."""
    for _ in range(n):
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)


def finish(engine: LLMEngine, tokens: dict) -> dict:
    rest, _ = drain(engine)
    for rid, ids in rest.items():
        tokens.setdefault(rid, []).extend(ids)
    return tokens


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """Generate; the first request runs a few steps alone (its blocks are cached before the
    others arrive), the others come together."""
    tokens: dict = {}
    engine.add_request("r0", prompts[0], params)
    steps(engine, 5, tokens)
    for i, p in enumerate(prompts[1:], start=1):
        engine.add_request(f"r{i}", p, params)
    return finish(engine, tokens)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_outputs_identical_with_and_without_caching(bundle, prompts, temperature):
    ps, _ = prompts
    params = SamplingParams(max_tokens=40, temperature=temperature, seed=7 if temperature else None,
                            logprobs=2)
    on = LLMEngine(bundle, EngineConfig(num_kv_blocks=128, max_num_batched_tokens=64))
    off = LLMEngine(bundle, EngineConfig(num_kv_blocks=128, max_num_batched_tokens=64, enable_prefix_caching=False))
    got_on, got_off = run(on, ps, params), run(off, ps, params)
    assert got_on == got_off
    assert metric(on, "inferctl_engine_prefix_cache_hits_total") > 0
    assert metric(off, "inferctl_engine_prefix_cache_queries_total") == 0


def test_prompt_logprobs_unchanged_and_not_served_from_cache(bundle, prompts):
    ps, _ = prompts
    engine = LLMEngine(bundle, EngineConfig(num_kv_blocks=128))
    engine.add_request("warm", ps[0], SamplingParams(max_tokens=4, temperature=0.0))
    drain(engine)
    lp = SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=1)
    engine.add_request("p", ps[0], lp)
    first = next(o for o in engine.step() if o.request_id == "p")
    drain(engine)
    fresh = LLMEngine(bundle, EngineConfig(num_kv_blocks=128, enable_prefix_caching=False))
    fresh.add_request("p", ps[0], lp)
    ref = next(o for o in fresh.step() if o.request_id == "p")
    drain(fresh)
    assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(ps[0])
    assert [e and {k: round(v.logprob, 5) for k, v in e.items()} for e in first.prompt_logprobs] == \
        [e and {k: round(v.logprob, 5) for k, v in e.items()} for e in ref.prompt_logprobs]


def test_hit_counters_rise_by_the_exact_shared_full_blocks(bundle, prompts):
    ps, sys_len = prompts
    engine = LLMEngine(bundle, EngineConfig(num_kv_blocks=128))
    params = SamplingParams(max_tokens=8, temperature=0.0)
    engine.add_request("a", ps[0], params)
    drain(engine)
    assert metric(engine, "inferctl_engine_prefix_cache_queries_total") == len(ps[0])
    assert metric(engine, "inferctl_engine_prefix_cache_hits_total") == 0
    engine.add_request("b", ps[1], params)
    drain(engine)
    # b shares the system prompt: its full blocks of the shared part hit (and not the last token)
    shared = next(i for i, (x, y) in enumerate(zip(ps[0], ps[1])) if x != y)
    expect = min(shared // BS, (len(ps[1]) - 1) // BS) * BS
    assert shared >= sys_len and expect > 0
    assert metric(engine, "inferctl_engine_prefix_cache_queries_total") == len(ps[0]) + len(ps[1])
    assert metric(engine, "inferctl_engine_prefix_cache_hits_total") == expect
    # the very same prompt again: every full block but the one holding the last token
    engine.add_request("a2", ps[0], params)
    drain(engine)
    assert metric(engine, "inferctl_engine_prefix_cache_hits_total") == expect + (len(ps[0]) - 1) // BS * BS


def test_no_reference_left_after_finish_abort_and_preemption(bundle, prompts):
    ps, _ = prompts
    engine = LLMEngine(bundle, EngineConfig(num_kv_blocks=14, max_num_batched_tokens=48))
    params = SamplingParams(max_tokens=60, temperature=0.0)
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, params)
    tokens: dict = {}
    steps(engine, 6, tokens)
    engine.abort_request("r1")
    finish(engine, tokens)
    assert engine.scheduler.preemptions_total > 0
    bm = engine.block_manager
    assert all(r == 0 for r in bm.pool.ref)
    assert bm.num_used_blocks == 0 and bm.tokens_stored == 0 and bm.waste_ratio is None
    assert engine.stats()["kv_cache"]["blocks_free"] == 14
    # preempted and recomputed (partly from the cache) requests still give the uncached output
    off = LLMEngine(bundle, EngineConfig(num_kv_blocks=128, enable_prefix_caching=False))
    for i in (0, 2, 3, 4, 5):
        off.add_request(f"r{i}", ps[i], params)
    ref, _ = drain(off)
    assert engine.block_manager.pool.evictions_total > 0
    for i in (0, 2, 3, 4, 5):
        assert tokens[f"r{i}"] == ref[f"r{i}"]


def test_precision_switch_invalidates_the_cache(bundle, prompts):
    ps, _ = prompts
    params = SamplingParams(max_tokens=30, temperature=0.0)
    engine = LLMEngine(bundle, EngineConfig(num_kv_blocks=128))
    engine.add_request("full", ps[0], params)
    drain(engine)
    assert engine.block_manager.pool.num_cached_blocks > 0
    engine.request_precision("int8")
    assert engine.precision == "int8" and engine.block_manager.pool.num_cached_blocks == 0
    hits = metric(engine, "inferctl_engine_prefix_cache_hits_total")
    engine.add_request("after", ps[0], params)
    after, _ = drain(engine)
    assert metric(engine, "inferctl_engine_prefix_cache_hits_total") == hits    # nothing stale reused
    fresh = LLMEngine(bundle, EngineConfig(num_kv_blocks=128, enable_prefix_caching=False))
    assert fresh.precision == "int8"           # the shared model is in int8 now
    fresh.add_request("after", ps[0], params)
    ref, _ = drain(fresh)
    assert after["after"] == ref["after"]


def test_a_burst_shares_the_prefix_within_one_step(bundle, prompts):
    ps, _ = prompts
    params = SamplingParams(max_tokens=12, temperature=0.0)
    on = LLMEngine(bundle, EngineConfig(num_kv_blocks=128))
    off = LLMEngine(bundle, EngineConfig(num_kv_blocks=128, enable_prefix_caching=False))
    for engine in (on, off):
        for i, p in enumerate(ps[:4]):
            engine.add_request(f"r{i}", p, params)
    got, ref = drain(on)[0], drain(off)[0]
    assert got == ref
    shared = next(i for i, (x, y) in enumerate(zip(ps[0], ps[1])) if x != y) // BS * BS
    # all four are admitted in the first step; r1..r3 reuse what r0 computes in that very step
    assert metric(on, "inferctl_engine_prefix_cache_hits_total") == 3 * shared


def test_stats_has_a_prefix_cache_section_the_controller_parses(bundle, prompts):
    from inferctl.controller.engines.bundled import snapshot_from_stats

    ps, _ = prompts
    params = SamplingParams(max_tokens=4, temperature=0.0)
    engine = LLMEngine(bundle, EngineConfig(num_kv_blocks=128))
    assert engine.stats()["prefix_cache"] == {"queries_total": 0, "hits_total": 0, "hit_ratio": None}
    run(engine, ps[:3], params)
    pc = engine.stats()["prefix_cache"]
    queries = metric(engine, "inferctl_engine_prefix_cache_queries_total")
    hits = metric(engine, "inferctl_engine_prefix_cache_hits_total")
    assert (pc["queries_total"], pc["hits_total"]) == (queries, hits)       # the /metrics counts
    assert pc["queries_total"] == sum(len(p) for p in ps[:3])               # every prompt token looked up
    assert hits > 0 and pc["hit_ratio"] == pytest.approx(hits / queries)    # r1, r2 reuse r0's blocks
    snap = snapshot_from_stats(engine.stats(), name="main")                 # the controller's parse
    assert snap.ok and snap.precision == "full" and snap.invalid == []
    off = LLMEngine(bundle, EngineConfig(num_kv_blocks=128, enable_prefix_caching=False))
    run(off, ps[:2], params)
    assert off.stats()["prefix_cache"] == {"queries_total": 0, "hits_total": 0, "hit_ratio": None}
