"""Prompt logprobs in the engine (vLLM's ``prompt_logprobs``), checked against a plain forward.

The reference is teacher forcing with ``engine.model`` directly: one chunk over the whole
prompt with every row's logits (``model_helpers.Harness``), ``log_softmax``, and the logprob
of token t+1 read from row t.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.core_helpers import drain, gutenberg_text
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_model
from inferctl.engine.memory_plan import estimate_step_activation_bytes
from inferctl.engine.sampling_params import SamplingParams, SamplingParamsError
from tests.model_helpers import Harness

TOL = 1e-4


@pytest.fixture(scope="module")
def bundle(stories_dir):
    return load_model(str(stories_dir / "stories260K.bin"))


@pytest.fixture(scope="module")
def book_prompt(bundle, gutenberg_dir):
    """BOS + 299 tokens of Frankenstein (byte-fallback pieces included)."""
    text = gutenberg_text(gutenberg_dir, "pg84.txt")
    start = text.index("You will rejoice")
    return [bundle.tokenizer.bos_id] + bundle.tokenizer.encode(text[start:start + 3000], bos=False)[:299]


def reference(model, ids: list[int]) -> torch.Tensor:
    """``log_softmax`` of a plain full forward over ``ids``: row t = distribution of token t+1."""
    return torch.log_softmax(Harness(model, num_blocks=64).step([(0, ids, True)]).float(), dim=-1)


def pl(k: int | None, max_tokens: int = 4, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, prompt_logprobs=k, **kw)


def check_against_reference(entries, ids: list[int], ref: torch.Tensor, k: int) -> float:
    """Assert the vLLM semantics of ``entries`` against ``ref``; return the max abs diff."""
    assert len(entries) == len(ids) and entries[0] is None
    worst = 0.0
    for t in range(1, len(ids)):
        row = ref[t - 1]
        entry = entries[t]
        tok = ids[t]
        assert tok in entry and len(entry) <= k + 1
        lp, rank = entry[tok]
        worst = max(worst, abs(lp - float(row[tok])))
        assert rank == int((row >= row[tok]).sum())          # vLLM: tokens with logprob >= its own
        top_v, top_i = row.topk(k)
        for r, (v, i) in enumerate(zip(top_v.tolist(), top_i.tolist()), start=1):
            assert i in entry
            worst = max(worst, abs(entry[i].logprob - v))
            if i != tok:
                assert entry[i].rank == r
    return worst


def test_prompt_logprobs_across_chunks_in_a_mixed_batch_match_teacher_forcing(bundle, book_prompt):
    eng = LLMEngine(bundle, EngineConfig(num_threads=1, max_num_batched_tokens=48))
    other_a = bundle.tokenizer.encode("Once upon a time")
    other_b = bundle.tokenizer.encode("Tom had a big blue truck. He pushed it")
    eng.add_request("other-a", other_a, SamplingParams(max_tokens=30, temperature=0.0))
    eng.add_request("book", book_prompt, pl(3))
    eng.add_request("other-b", other_b, SamplingParams(max_tokens=12, temperature=0.0))
    outs: dict[str, list] = {}
    steps_to_first = None
    for step in range(1, 500):
        if not eng.has_unfinished_requests():
            break
        for o in eng.step():
            outs.setdefault(o.request_id, []).append(o)
            if o.request_id == "book" and steps_to_first is None:
                steps_to_first = step
    # 300 prompt tokens with a 48-token budget shared with two other requests: >= 7 chunks
    assert steps_to_first >= math.ceil(len(book_prompt) / 48)
    first = outs["book"][0]
    ref = reference(bundle.model, book_prompt)
    worst = check_against_reference(first.prompt_logprobs, book_prompt, ref, 3)
    assert worst <= TOL, worst
    # only the first output carries them; the other requests never get any
    assert all(o.prompt_logprobs is None for o in outs["book"][1:])
    assert all(o.prompt_logprobs is None for rid in ("other-a", "other-b") for o in outs[rid])
    # the first generated token comes from the last prompt row (not a prompt logprob)
    assert first.new_token_ids == [int(ref[-1].argmax())]
    assert abs(first.logprobs[0] - float(ref[-1].max())) <= TOL
    # the requests that did not ask are unchanged by sharing the batch with one that did
    for rid, ids, n in (("other-a", other_a, 30), ("other-b", other_b, 12)):
        alone = LLMEngine(bundle, EngineConfig(num_threads=1, max_num_batched_tokens=48))
        alone.add_request(rid, ids, SamplingParams(max_tokens=n, temperature=0.0))
        tokens, _ = drain(alone)
        assert tokens[rid] == [t for o in outs[rid] for t in o.new_token_ids]
    assert eng.block_manager.num_used_blocks == 0


def test_zero_alternatives_one_token_prompt_and_validation(bundle):
    eng = LLMEngine(bundle, EngineConfig(num_threads=1, max_num_batched_tokens=16))
    ids = bundle.tokenizer.encode("The little cat found a box. It jumped inside and went to sleep.")
    eng.add_request("k0", ids, pl(0, max_tokens=1))
    eng.add_request("bos", [bundle.tokenizer.bos_id], pl(2, max_tokens=1))
    outs = {o.request_id: o for o in (o for _ in range(50) for o in eng.step())}
    entries = outs["k0"].prompt_logprobs
    ref = reference(bundle.model, ids)
    assert [list(e) for e in entries[1:]] == [[t] for t in ids[1:]]      # only the actual token
    assert check_against_reference(entries, ids, ref, 0) <= TOL
    assert outs["bos"].prompt_logprobs == [None]
    for bad in (-1, 21, True, 1.5, "2"):
        with pytest.raises(SamplingParamsError) as e:
            SamplingParams(prompt_logprobs=bad)
        assert e.value.field == "prompt_logprobs"


def test_a_recompute_mid_prefill_keeps_prompt_logprobs_right(bundle, book_prompt):
    """An OOM after two chunks re-queues the request (blocks freed, recomputed from 0): the
    entries of the first attempt are replaced, not duplicated."""
    eng = LLMEngine(bundle, EngineConfig(num_threads=1, max_num_batched_tokens=64,
                                         oom_backoff_seconds=0.0))
    ids = book_prompt[:200]
    eng.add_request("book", ids, pl(1, max_tokens=2))
    assert eng.step() == [] and eng.step() == []          # two chunks of 64 scored
    eng.inject_fault("oom", 1)
    assert eng.step() == []                                 # the third chunk runs out of memory
    faults = eng.stats()["faults"]
    assert faults["oom_total"] == 1 and faults["last_oom"]["requeued_requests"] == 1
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    assert [o.finish_reason for o in outs] == [None, "length"]
    assert outs[1].prompt_logprobs is None
    assert check_against_reference(outs[0].prompt_logprobs, ids, reference(bundle.model, ids), 1) <= TOL


def test_the_step_estimate_counts_every_logits_row_and_its_log_softmax(bundle, book_prompt):
    a = bundle.args
    dims = dict(dim=a.dim, hidden_dim=a.hidden_dim, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads,
                vocab_size=a.vocab_size, act_bytes=4)
    base = estimate_step_activation_bytes(100, 1, 100 * 100, 100, **dims)
    assert estimate_step_activation_bytes(100, 100, 100 * 100, 100, num_logprob_rows=99, **dims) \
        == base + 4 * a.vocab_size * (99 + 99)
    # the runner reserves exactly that for a prompt-logprobs prefill chunk
    ids = book_prompt[:64]
    got = {}
    for name, params in (("plain", SamplingParams(max_tokens=1)), ("pl", pl(0, max_tokens=1))):
        eng = LLMEngine(bundle, EngineConfig(num_threads=1, max_num_batched_tokens=64))
        eng.add_request(name, ids, params)
        sched = eng.scheduler.schedule()
        got[name] = eng.runner.execute(sched.scheduled).activation_bytes
    assert got["pl"] - got["plain"] == 4 * a.vocab_size * (63 + 63)


def test_a_budget_that_fits_the_prefill_but_not_its_logits_runs_out_honestly(bundle, book_prompt):
    """With an explicit budget, a prompt-logprobs prefill that needs more than the headroom
    goes through the accountant and fails as an OOM (503), while the same prompt without
    prompt logprobs completes: the logits rows are really budgeted."""
    ids = book_prompt[:128]
    probe = LLMEngine(bundle, EngineConfig(num_threads=1, max_num_batched_tokens=128, num_kv_blocks=16))
    plain_act = probe.runner.estimate_activation_bytes(128, 1, 128 * 128, 128)
    pl_act = probe.runner.estimate_activation_bytes(128, 128, 128 * 128, 128, num_logprob_rows=127)
    rnd = lambda n: -(-n // 512) * 512                      # noqa: E731 - the allocator's rounding
    budget = rnd(bundle.model.weight_bytes()) + rnd(16 * probe.kv_bytes_per_block) + rnd(plain_act) + 4096
    assert rnd(pl_act) > rnd(plain_act) + 4096
    cfg = EngineConfig(num_threads=1, max_num_batched_tokens=128, num_kv_blocks=16, memory_budget_bytes=budget,
                       max_oom_retries=0, oom_backoff_seconds=0.0)
    eng = LLMEngine(bundle, cfg)
    eng.add_request("plain", ids, SamplingParams(max_tokens=1))
    _, final = drain(eng)
    assert final["plain"].finish_reason == "length"
    eng.add_request("pl", ids, pl(0, max_tokens=1))
    _, final = drain(eng)
    assert final["pl"].finish_reason == "error" and final["pl"].error_status == 503
    assert eng.stats()["faults"]["last_oom"]["requested_bytes"] == rnd(pl_act)
