"""Speculative decoding in the real engine on stories260K: greedy output token-for-token
identical to non-speculative decoding (ngram and the int8 self-draft, several k, chunked
prefill, stop strings, repetition stop, max_tokens edge cases, forced preemption), logprobs
from the target, metrics, the int8 pause, and the sampled distribution (the first speculative
token against the target's exact softmax; an "always accept" rule fails the same check)."""

from __future__ import annotations

import math

import pytest

from tests.core_helpers import drain
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
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


#: Temperature of the sampled tests: the target's distribution after the prompt is broad, so a
#: draft token's p is far from 1 and "always accept" visibly skews the emitted tokens.
TEMP = 2.0
#: The model's own greedy story, restarted: its continuation repeats the prompt (ngram drafts).
SAMPLED_PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                  "Once upon a time, there was a little")


def _chi2_crit_p001(df: int) -> float:
    """0.001 critical value by the Wilson-Hilferty approximation (Johnson, Kotz & Balakrishnan,
    Continuous Univariate Distributions vol. 1, eq. 18.24): df (1 - 2/(9df) + z sqrt(2/(9df)))^3,
    z = 3.090 the standard normal's 0.999 quantile."""
    return df * (1 - 2 / (9 * df) + 3.090 * math.sqrt(2 / (9 * df))) ** 3


@pytest.fixture(scope="module")
def perturbed_draft(stories_dir, tmp_path_factory):
    """A draft checkpoint that disagrees with the target: stories260K with Gaussian noise (0.7 x
    each weight's overall std) on every float after the 7-int header. Same vocabulary."""
    import numpy as np

    raw = (stories_dir / "stories260K.bin").read_bytes()
    w = np.frombuffer(raw, dtype=np.float32, offset=28).copy()
    w += np.random.default_rng(7).normal(0.0, 0.7 * float(w.std()), size=w.shape).astype(np.float32)
    folder = tmp_path_factory.mktemp("draft")
    (folder / "tok512.bin").write_bytes((stories_dir / "tok512.bin").read_bytes())
    path = folder / "stories260K-noisy.bin"
    path.write_bytes(raw[:28] + w.tobytes())
    return path


def _target_probs_after(model, prompt: list[int], first: list[int]) -> dict[int, list[float]]:
    """The target's exact sampling distribution softmax(logits / TEMP) of the token after
    ``prompt + [t]`` for each ``t`` in ``first`` (one forward per t over a fresh paged cache)."""
    import torch

    from inferctl.engine.attention import AttentionMetadata, KVCache

    a, bs, out = model.args, 16, {}
    for t in sorted(set(first)):
        ids = prompt + [t]
        nb = -(-len(ids) // bs)
        kv = KVCache.allocate(a.n_layers, nb, bs, a.n_kv_heads, a.head_dim, model.dtype, model.device)
        meta = AttentionMetadata.build([(list(range(nb)), 0, len(ids), False)], bs, model.device)
        with torch.inference_mode():
            logits = model(torch.tensor(ids), torch.arange(len(ids)), kv, meta)[-1].float()
        out[t] = torch.softmax(logits / TEMP, dim=-1).tolist()
    return out


def _first_speculative_token_chi2(bundle, sc: dict, n: int = 600) -> tuple[float, int, dict]:
    """Pearson chi-square of the first speculated token (output position 1; position 0 comes
    from the prefill, never speculated) over ``n`` seeds against the target's exact
    distribution given each seed's position-0 token: expected count of v = sum over seeds of
    p(v | prompt, t0). Bins with an expected count below 5 are pooled. Returns (statistic,
    degrees of freedom, the spec_decode stats)."""
    prompt = bundle.tokenizer.encode(SAMPLED_PROMPT, bos=True)
    reqs = [(SAMPLED_PROMPT, SamplingParams(max_tokens=3, temperature=TEMP, seed=s, ignore_eos=True))
            for s in range(n)]
    engine, tokens, *_ = run(bundle, sc, reqs, max_num_seqs=n, max_num_batched_tokens=16384)
    exact = _target_probs_after(bundle.model, prompt, [t[0] for t in tokens.values()])
    V = bundle.args.vocab_size
    expected, observed = [0.0] * V, [0] * V
    for t in tokens.values():
        observed[t[1]] += 1
        for v, pv in enumerate(exact[t[0]]):
            expected[v] += pv
    big = [v for v in range(V) if expected[v] >= 5]
    pairs = [(observed[v], expected[v]) for v in big]
    pairs.append((n - sum(o for o, _ in pairs), n - sum(e for _, e in pairs)))
    stat = sum((o - e) ** 2 / e for o, e in pairs if e > 0)
    return stat, len(pairs) - 1, engine.stats()["spec_decode"]


SAMPLED_METHODS = ["ngram", "draft_model"]


def _sampled_spec(method: str, perturbed_draft) -> dict:
    if method == "ngram":
        return spec("ngram", 1, prompt_lookup_min=1)
    return spec("draft_model", 1, model=str(perturbed_draft))


@pytest.mark.parametrize("method", SAMPLED_METHODS)
def test_first_speculative_token_follows_the_target_distribution(bundle, perturbed_draft, method):
    """Leviathan/Chen: whatever the draft proposes, the emitted token is distributed as the
    target's p. The noisy draft model (and prompt lookup's point mass) disagree with p, so the
    rule's rejections and residual draws are exercised (chi-square goodness of fit, p = 0.001)."""
    stat, df, st = _first_speculative_token_chi2(bundle, _sampled_spec(method, perturbed_draft))
    assert st["num_drafts"] > 200    # at least a third of the seeds' first speculative token was verified
    assert 0 < st["num_accepted_tokens"] < st["num_draft_tokens"]   # drafts both accepted and rejected
    assert df >= 10 and stat < _chi2_crit_p001(df), (stat, df)


def test_the_distribution_check_catches_an_always_accept_rule(bundle, perturbed_draft, monkeypatch):
    """The check above is sharp: with the accept/reject rule replaced by "always accept the
    drafts" (then a bonus token from p), the same statistic is far beyond the critical value
    (measured: 467 against 55.6 at 27 degrees of freedom; the correct rule gave 19). Run with
    the noisy draft model: prompt lookup drafts for a third of the seeds only, which made the
    broken rule's statistic (69) too close to the critical value to be a sharp check; its
    point-mass branch is checked against a known p in tests/unit/test_spec_decode_rejection.py."""
    from inferctl.engine.spec_decode import decoder

    def always_accept(p, drafts, q, gen):
        import torch

        return list(drafts) + [int(torch.multinomial(p[len(drafts)], 1, generator=gen).item())], len(drafts)

    monkeypatch.setattr(decoder, "rejection_sample", always_accept)
    stat, df, st = _first_speculative_token_chi2(bundle, _sampled_spec("draft_model", perturbed_draft))
    assert st["num_accepted_tokens"] == st["num_draft_tokens"] > 300
    assert stat > 4 * _chi2_crit_p001(df), (stat, df)


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
