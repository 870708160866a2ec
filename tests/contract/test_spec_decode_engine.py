"""Speculative decoding in the real engine on stories260K: greedy output token-for-token
identical to non-speculative decoding (ngram and the int8 self-draft, several k, chunked
prefill, stop strings, repetition stop, max_tokens edge cases, forced preemption), logprobs
from the target, metrics, the int8 pause, and the sampled distribution."""

from __future__ import annotations

import math

import pytest

from tests.core_helpers import drain
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_llama2c
from inferctl.engine.sampling_params import SamplingParams

PROMPTS = [
    "Once upon a time",
    "Lily and Ben went to the park. Lily and Ben went to the park. Lily and Ben",
    "The cat sat on the mat. The cat sat on the mat. The cat",
    "One day, a little boy named Tim",
    "Tom had a big red ball. He liked to play with his ball",
    "She",
]
MAX_TOKENS = [40, 1, 2, 57, 64, 3]


@pytest.fixture(scope="module")
def bundle(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin", stories_dir / "tok512.bin")


@pytest.fixture(autouse=True)
def full_precision_after(bundle):
    yield
    bundle.model.set_precision("full")


def spec(method: str, k: int, **kw) -> dict:
    return {"method": method, "num_speculative_tokens": k, **kw}


def requests(stop: str | None = None) -> list[tuple[str, SamplingParams]]:
    out = []
    for i, mt in enumerate(MAX_TOKENS):
        kw = dict(max_tokens=mt, temperature=0, ignore_eos=i % 2 == 0, logprobs=2 if i == 0 else None)
        if i == 3 and stop:
            kw["stop"] = [stop]
        if i == 4:
            kw["repetition_stop"] = True
        out.append((PROMPTS[i], SamplingParams(**kw)))
    return out


def run(bundle, speculative_config=None, reqs=None, **cfg):
    engine = LLMEngine(bundle, EngineConfig(speculative_config=speculative_config, **cfg))
    for i, (prompt, params) in enumerate(reqs):
        engine.add_request(f"r{i}", bundle.tokenizer.encode(prompt, bos=True), params)
    texts: dict[str, str] = {}
    lps: dict[str, list[float]] = {}
    tops: dict[str, list] = {}
    tokens: dict[str, list[int]] = {}
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            texts[out.request_id] = texts.get(out.request_id, "") + out.new_text
            lps.setdefault(out.request_id, []).extend(out.logprobs)
            if out.top_logprobs:
                tops.setdefault(out.request_id, []).extend(out.top_logprobs)
            if out.finished:
                final[out.request_id] = (out.finish_reason, out.completion_tokens)
    return engine, tokens, texts, lps, tops, final


@pytest.fixture(scope="module")
def stop_string(bundle):
    """A stop string that occurs in the middle of request 3's greedy output."""
    _, _, texts, _, _, _ = run(bundle, None, requests())
    text = texts["r3"]
    assert len(text) > 60
    return text[40:46]


@pytest.fixture(scope="module")
def baseline(bundle, stop_string):
    return run(bundle, None, requests(stop_string), max_num_batched_tokens=24)


@pytest.mark.parametrize("method, k", [("ngram", 1), ("ngram", 4), ("int8_self", 2), ("int8_self", 5)])
def test_greedy_output_is_identical_to_non_speculative(bundle, baseline, stop_string, method, k):
    # a 24-token budget chunks the prompts, so prefill chunks and verified drafts share steps
    engine, tokens, texts, lps, tops, final = run(bundle, spec(method, k), requests(stop_string),
                                                  max_num_batched_tokens=24)
    _, b_tokens, b_texts, b_lps, b_tops, b_final = baseline
    assert tokens == b_tokens
    assert texts == b_texts
    assert final == b_final
    assert final["r1"] == ("length", 1) and final["r2"] == ("length", 2)    # never more than asked
    assert final["r3"][0] == "stop" and stop_string not in texts["r3"]
    for rid in b_lps:    # the emitted tokens' logprobs come from the target's distribution
        assert lps[rid] == pytest.approx(b_lps[rid], abs=1e-4)
    assert [sorted(t) for t in tops["r0"]] == [sorted(t) for t in b_tops["r0"]]
    st = engine.stats()["spec_decode"]
    assert st["num_drafts"] > 0 and 0 < st["num_accepted_tokens"] <= st["num_draft_tokens"]
    assert engine.block_manager.num_used_blocks == 0


def test_forced_preemption_keeps_output_identical(bundle):
    reqs = [(p, SamplingParams(max_tokens=90, temperature=0, ignore_eos=True)) for p in PROMPTS[:4]]
    base = run(bundle, None, reqs, num_kv_blocks=14, max_num_seqs=4)
    eng, tokens, *_ = run(bundle, spec("int8_self", 4), reqs, num_kv_blocks=14, max_num_seqs=4)
    assert base[0].scheduler.preemptions_total > 0 and eng.scheduler.preemptions_total > 0
    assert tokens == base[1]
    eng2, tokens2, *_ = run(bundle, spec("ngram", 3), reqs, num_kv_blocks=14, max_num_seqs=4)
    assert eng2.scheduler.preemptions_total > 0
    assert tokens2 == base[1]


def test_metrics_count_drafts_and_acceptance_by_position(bundle):
    reqs = [(PROMPTS[1], SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))]
    engine, *_ = run(bundle, spec("ngram", 3), reqs)
    get = engine.registry.get_sample_value
    drafts = get("inferctl_engine_spec_decode_num_drafts_total")
    draft_toks = get("inferctl_engine_spec_decode_num_draft_tokens_total")
    acc = get("inferctl_engine_spec_decode_num_accepted_tokens_total")
    per_pos = [get("inferctl_engine_spec_decode_num_accepted_tokens_per_pos_total", {"position": str(p)})
               for p in range(3)]
    st = engine.stats()["spec_decode"]
    assert drafts == st["num_drafts"] > 0
    assert draft_toks == st["num_draft_tokens"] and acc == st["num_accepted_tokens"] > 0
    assert sum(per_pos) == acc and per_pos[0] >= per_pos[1] >= per_pos[2]
    assert st["acceptance_rate"] == pytest.approx(acc / draft_toks)
    # every generated token is counted once, drafts included
    assert get("inferctl_engine_generation_tokens_total", {"model": engine.model_name}) == 48


def test_int8_self_pauses_while_the_target_is_int8(bundle):
    reqs = [(p, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)) for p in PROMPTS[:3]]
    engine = LLMEngine(bundle, EngineConfig(speculative_config=spec("int8_self", 3)))
    engine.request_precision("int8")
    for i, (p, params) in enumerate(reqs):
        engine.add_request(f"a{i}", bundle.tokenizer.encode(p, bos=True), params)
    int8_tokens, _ = drain(engine)
    st = engine.stats()["spec_decode"]
    assert st["paused"] == "target_int8" and st["num_drafts"] == 0
    ref = LLMEngine(bundle, EngineConfig())    # the model is int8 now: the reference runs int8 too
    for i, (p, params) in enumerate(reqs):
        ref.add_request(f"a{i}", bundle.tokenizer.encode(p, bos=True), params)
    assert drain(ref)[0] == int8_tokens
    engine.request_precision("full")
    for i, (p, params) in enumerate(reqs):
        engine.add_request(f"b{i}", bundle.tokenizer.encode(p, bos=True), params)
    drain(engine)
    st = engine.stats()["spec_decode"]
    assert st["paused"] is None and st["num_drafts"] > 0


#: A broad target distribution (the rigorous check of the accept/reject rule is the unit test's
#: chi-square against a known p; this one checks the engine's wiring end to end).
TEMP = 1.5


def _chi2_two_sample(a: dict[int, int], b: dict[int, int]) -> tuple[float, int]:
    """Two-sample chi-square for equal sample sizes (sum (a-b)^2/(a+b)), bins with fewer than
    10 observations pooled into one; returns (statistic, degrees of freedom)."""
    keys = set(a) | set(b)
    big = [t for t in keys if a.get(t, 0) + b.get(t, 0) >= 10]
    rest_a = sum(a.get(t, 0) for t in keys if t not in big)
    rest_b = sum(b.get(t, 0) for t in keys if t not in big)
    pairs = [(a.get(t, 0), b.get(t, 0)) for t in big] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
    return sum((x - y) ** 2 / (x + y) for x, y in pairs), len(pairs) - 1


def _chi2_crit_p001(df: int) -> float:
    """0.001 critical value by the Wilson-Hilferty approximation (Johnson, Kotz & Balakrishnan,
    Continuous Univariate Distributions vol. 1, eq. 18.24): df (1 - 2/(9df) + z sqrt(2/(9df)))^3,
    z = 3.090 the standard normal's 0.999 quantile."""
    return df * (1 - 2 / (9 * df) + 3.090 * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("method", ["ngram", "int8_self"])
def test_sampled_tokens_follow_the_target_distribution(bundle, method):
    """Over many seeds, the tokens at the speculated positions (1 and 2; position 0 comes from
    the prefill) are distributed as without speculation (two-sample chi-square, p = 0.001)."""
    n = 400
    # the model's own greedy story, restarted: its continuation repeats the prompt, so ngram drafts
    prompt = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
              "Once upon a time, there was a little")
    reqs = [(prompt, SamplingParams(max_tokens=3, temperature=TEMP, seed=s, ignore_eos=True)) for s in range(n)]
    hist = {}
    for name, sc in (("off", None), (method, spec(method, 2))):
        # a budget that holds every prefill, so decodes have room for their drafts
        engine, tokens, *_ = run(bundle, sc, reqs, max_num_seqs=n, max_num_batched_tokens=16384)
        for pos in (1, 2):
            h = hist.setdefault((name, pos), {})
            for t in tokens.values():
                h[t[pos]] = h.get(t[pos], 0) + 1
        if sc:
            st = engine.stats()["spec_decode"]
            assert st["num_drafts"] > n // 4 and st["num_accepted_tokens"] > 0
    for pos in (1, 2):
        stat, df = _chi2_two_sample(hist[("off", pos)], hist[(method, pos)])
        assert df >= 2 and stat < _chi2_crit_p001(df), (pos, stat, df)


def test_draft_model_method_with_its_own_kv_pool(bundle, stories_dir, baseline, stop_string):
    """draft_model: a second checkpoint drafts (here the same file, so every draft is accepted)."""
    cfg = spec("draft_model", 3, model=str(stories_dir / "stories260K.bin"))
    engine, tokens, *_ = run(bundle, cfg, requests(stop_string), max_num_batched_tokens=24)
    assert tokens == baseline[1]
    st = engine.stats()["spec_decode"]
    assert st["num_drafts"] > 0 and st["acceptance_rate"] == pytest.approx(1.0, abs=0.02)


def test_draft_model_that_cannot_load_is_a_config_error(bundle, tmp_path):
    from inferctl.engine.config import ConfigError

    with pytest.raises(ConfigError) as info:
        LLMEngine(bundle, EngineConfig(speculative_config=spec("draft_model", 2, model=str(tmp_path / "none.bin"))))
    assert info.value.field == "speculative_config.model"
