"""Speculative decoding and the engine's memory and step budget on stories260K: the draft's
weights, KV pool and activations are in the memory plan and the accountant (``/stats``), an OOM
of the draft path is a recorded fault that loses nothing, and decodes keep their draft tokens in
the step budget during a burst of prefills."""

from __future__ import annotations

import pytest

from tests.core_helpers import drain
from inferctl.contract.units import MiB
from inferctl.engine.attention import KVCache
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.memory_plan import estimate_step_activation_bytes
from inferctl.engine.sampling_params import SamplingParams

PROMPTS = ["Once upon a time", "One day, a little boy named Tim", "The cat sat on the mat. The cat"]


def _round512(n: int) -> int:
    return -(-n // 512) * 512


def _enc(bundle, text: str) -> list[int]:
    return bundle.tokenizer.encode(text, bos=True)


def test_int8_self_draft_is_reserved_in_the_plan_and_shown_in_stats(bundle):
    budget, B, bs = 4 * MiB, 64, 16
    a, m = bundle.args, bundle.model
    # by hand: the target's weights, the int8 copy's weights (weight_bytes_by_mode, the model's own
    # formula, not the draft object), one KV block of each pool (the same shape: the twin pool),
    # one activation headroom for both (the draft has the target's shape: the same profile)
    w_full, w_int8 = m.weight_bytes(), m.weight_bytes_by_mode()["int8"]
    bpb = KVCache.bytes_per_block(a.n_layers, bs, a.n_kv_heads, a.head_dim, m.dtype, False)
    profile = estimate_step_activation_bytes(B, 1, B * B, B, a.dim, a.hidden_dim, a.n_heads, a.n_kv_heads,
                                             a.vocab_size, 4)
    slack = 4 * 512
    blocks_alone = (budget - w_full - profile - slack) // bpb
    blocks_spec = (budget - w_full - w_int8 - profile - slack) // (2 * bpb)
    assert blocks_spec < blocks_alone // 2 + 1   # the draft's reservation is real

    cfg = dict(memory_budget_bytes=budget, max_num_batched_tokens=B, block_size=bs)
    plain = LLMEngine(bundle, EngineConfig(**cfg))
    eng = LLMEngine(bundle, EngineConfig(speculative_config={"method": "int8_self", "num_speculative_tokens": 3},
                                         **cfg))
    assert plain.block_manager.num_blocks == blocks_alone
    assert eng.block_manager.num_blocks == blocks_spec
    mem = eng.stats()["memory"]
    assert mem["draft_weights_bytes"] == _round512(w_int8)
    assert mem["draft_kv_pool_bytes"] == _round512(blocks_spec * bpb)
    assert mem["kv_pool_bytes"] == _round512(blocks_spec * bpb)
    assert mem["weights_bytes"] == _round512(w_full)   # the target's alone: the precision policies read it
    assert mem["budget_bytes"] - mem["free_bytes"] == mem["reserved_bytes"] >= (
        _round512(w_full) + _round512(w_int8) + 2 * _round512(blocks_spec * bpb))
    st = eng.stats()["spec_decode"]
    assert st["draft_weights_bytes"] == w_int8 and st["draft_kv_pool_bytes"] == blocks_spec * bpb
    assert plain.stats()["memory"]["draft_weights_bytes"] == 0
    assert plain.stats()["memory"]["draft_kv_pool_bytes"] == 0
    # the draft's pool really has the target's number of blocks
    assert eng.spec.draft.kv_cache.nbytes() == blocks_spec * bpb


def test_ngram_reserves_nothing(bundle):
    cfg = dict(memory_budget_bytes=4 * MiB, max_num_batched_tokens=64)
    plain = LLMEngine(bundle, EngineConfig(**cfg))
    eng = LLMEngine(bundle, EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3}, **cfg))
    assert eng.block_manager.num_blocks == plain.block_manager.num_blocks
    assert eng.stats()["memory"]["draft_weights_bytes"] == 0


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def test_an_oom_in_the_draft_path_is_a_fault_that_loses_nothing(bundle):
    ref = LLMEngine(bundle, EngineConfig())
    for i, p in enumerate(PROMPTS):
        ref.add_request(f"r{i}", _enc(bundle, p), _greedy(24))
    want, _ = drain(ref)

    eng = LLMEngine(bundle, EngineConfig(speculative_config={"method": "int8_self", "num_speculative_tokens": 3}))
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", _enc(bundle, p), _greedy(24))
    tokens: dict[str, list[int]] = {}
    for out in eng.step():   # the prefill step: no drafts yet
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert all(len(t) == 1 for t in tokens.values()) and len(tokens) == 3
    eng.inject_fault("oom", 1)   # the next activation reservation fails: the draft forward's
    outs = eng.step()
    assert sorted(o.request_id for o in outs) == ["r0", "r1", "r2"]    # the step ran, without drafts
    assert all(len(o.new_token_ids) == 1 for o in outs)
    for out in outs:
        tokens[out.request_id].extend(out.new_token_ids)
    more, final = drain(eng)
    for rid, t in more.items():
        tokens[rid].extend(t)
    assert tokens == want
    assert all(f.finish_reason == "length" for f in final.values())
    st = eng.stats()
    assert st["faults"]["oom_total"] == 1
    last = st["faults"]["last_oom"]
    assert last["action"] == "skip_drafts" and last["source"] == "injected"
    assert last["requeued_requests"] == 0 and last["failed_requests"] == 0
    assert st["spec_decode"]["draft_ooms"] == 1 and st["spec_decode"]["num_drafts"] > 0
    assert eng.scheduler.preemptions_total == 0 and eng.block_manager.num_used_blocks == 0
    assert st["memory"]["activation_bytes"] == 0   # every reservation released


def _burst(bundle, speculative_config):
    """One request decoding, then six prompts of 30+ tokens arriving at once with a 32-token budget.
    Returns (tokens per request, drafts made in each step that admitted a waiting prefill)."""
    eng = LLMEngine(bundle, EngineConfig(speculative_config=speculative_config, max_num_batched_tokens=32,
                                         max_num_seqs=16))
    eng.add_request("a", _enc(bundle, PROMPTS[0]), _greedy(80))
    tokens: dict[str, list[int]] = {}

    def step():
        for out in eng.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)

    while len(tokens.get("a", [])) < 3:
        step()
    names = ["Lily", "Tom", "Sue", "Max", "Amy", "Sam"]   # distinct first blocks: no prefix-cache hits
    for i, name in enumerate(names):
        long = f"{name} and Ben went to the park. They played on the swings and the slide. Then they sat"
        assert len(_enc(bundle, long)) >= 28   # each prompt alone fills the rest of the budget
        eng.add_request(f"p{i}", _enc(bundle, long), _greedy(4))
    drafts_per_step = []
    while eng.scheduler.waiting:
        before = eng.spec.num_drafts if eng.spec else 0
        step()
        drafts_per_step.append((eng.spec.num_drafts if eng.spec else 0) - before)
    more, _ = drain(eng)
    for rid, t in more.items():
        tokens.setdefault(rid, []).extend(t)
    return tokens, drafts_per_step


@pytest.mark.parametrize("method", ["int8_self", "ngram"])
def test_a_decode_keeps_its_drafts_during_a_prefill_burst(bundle, method):
    want, _ = _burst(bundle, None)
    tokens, drafts = _burst(bundle, {"method": method, "num_speculative_tokens": 3,
                                     **({"prompt_lookup_min": 1} if method == "ngram" else {})})
    assert tokens == want
    assert len(drafts) >= 5          # the burst lasted several steps (each admitted a prefill)
    if method == "int8_self":        # the draft model always proposes: "a" drafted in every step
        assert all(d >= 1 for d in drafts), drafts
    else:                            # prompt lookup proposes only on a match
        assert sum(drafts) >= len(drafts) // 2, drafts


def test_draft_catch_up_forwards_stay_within_the_profiled_step(bundle):
    """A draft forward feeds at most max_num_batched_tokens tokens (the step the plan profiled):
    prompts longer than that are caught up over several steps, output unchanged."""
    B = 16
    prompts = [PROMPTS[1] + " and his friend went to the park to play with a big red ball", PROMPTS[2] * 2]
    assert all(len(_enc(bundle, p)) > B for p in prompts)
    ref = LLMEngine(bundle, EngineConfig(max_num_batched_tokens=B))
    eng = LLMEngine(bundle, EngineConfig(speculative_config={"method": "int8_self", "num_speculative_tokens": 3},
                                         max_num_batched_tokens=B))
    fed: list[int] = []
    forward = eng.spec.draft._forward

    def spy(chunks):
        fed.append(sum(len(toks) for _, toks, _ in chunks))
        return forward(chunks)

    eng.spec.draft._forward = spy
    for e in (ref, eng):
        for i, p in enumerate(prompts):
            e.add_request(f"r{i}", _enc(bundle, p), _greedy(30))
    assert drain(eng)[0] == drain(ref)[0]
    assert max(fed) <= B and eng.stats()["spec_decode"]["num_drafts"] > 0
