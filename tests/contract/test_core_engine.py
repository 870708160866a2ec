"""LLMEngine on the real stories260K model: continuous batching equivalence, OOM handling
through the accountant (budget, injected, impossible, retries), int8 switch, aborts,
admission (F14), stop conditions and the /stats document."""

from __future__ import annotations

import json

import pytest
import torch

from tests.core_helpers import drain, gutenberg_text
from inferctl.engine.config import ConfigError, EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.scheduler import AdmissionError

# llama2.c's documented greedy continuation of "Once upon a time" (models/stories260K/README.md)
REFERENCE = (", there was a little girl named Lily. She loved to play outside in the park. One day, "
             "she saw a big, red ball. She wanted to play with it, but it was too high.")


@pytest.fixture(scope="module")
def book_ids(bundle, gutenberg_dir):
    return bundle.tokenizer.encode(gutenberg_text(gutenberg_dir)[3000:60000], bos=False)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw)


def metric(engine: LLMEngine, name: str, labels: dict | None = None) -> float | None:
    return engine.registry.get_sample_value(name, labels or {})


def test_reference_continuation(bundle):
    engine = LLMEngine(bundle, EngineConfig())
    engine.add_request("r", bundle.tokenizer.encode("Once upon a time"), greedy(60))
    text = ""
    while engine.has_unfinished_requests():
        text += "".join(o.new_text for o in engine.step())
    assert text.startswith(REFERENCE)


def test_sixteen_concurrent_prompts_match_each_alone(bundle, book_ids):
    prompts = []
    for i in range(16):
        n = 4 + (i * 37) % 150                       # 4..151 tokens
        prompts.append(([1] + book_ids[i * 200:i * 200 + n], 24 + (i * 13) % 40))
    alone = {}
    for i, (p, m) in enumerate(prompts):
        engine = LLMEngine(bundle, EngineConfig())
        engine.add_request(str(i), p, greedy(m))
        alone[str(i)] = drain(engine)[0][str(i)]
    # 48-token steps force chunked prefill; 30 blocks x 16 slots hold ~ a third of the work
    engine = LLMEngine(bundle, EngineConfig(max_num_batched_tokens=48, num_kv_blocks=30))
    seen = {"mixed": 0, "max_tokens": 0}
    schedule = engine.scheduler.schedule

    def spy():
        out = schedule()
        seen["max_tokens"] = max(seen["max_tokens"], out.num_tokens)
        if out.num_prefill_tokens and out.num_decode_tokens:
            seen["mixed"] += 1
        return out

    engine.scheduler.schedule = spy
    for i, (p, m) in enumerate(prompts):
        engine.add_request(str(i), p, greedy(m))
    together, final = drain(engine)
    assert engine.scheduler.preemptions_total > 0
    assert seen["mixed"] > 0
    assert seen["max_tokens"] == 48                   # the budget is used, never exceeded
    assert together == alone
    assert all(final[k].finish_reason == "length" for k in final)
    assert engine.block_manager.num_used_blocks == 0
    assert engine.stats()["scheduler"]["preemptions_total"] == engine.scheduler.preemptions_total
    assert metric(engine, "inferctl_engine_preemptions_total") == engine.scheduler.preemptions_total


def test_budget_oom_on_a_long_book_prompt_then_int8_completes(bundle, book_ids):
    prompt = [1] + book_ids[:449]                     # 450 tokens, in chunks of 128
    blocks = 48
    kv = blocks * 20480                               # 2 * 5 layers * 16 * 4 heads * 8 * 4 bytes
    probe = LLMEngine(bundle, EngineConfig(max_num_batched_tokens=128, num_kv_blocks=blocks))
    assert probe.kv_bytes_per_block == 20480
    act_peak = probe.runner.estimate_activation_bytes(128, 1, 128 * 384, 384)   # 3rd chunk
    def rnd(n):                                       # the allocator's 512-byte rounding
        return -(-n // 512) * 512
    full_w, int8_w = (rnd(bundle.model.weight_bytes_by_mode()["full"]),
                      rnd(bundle.model.weight_bytes_by_mode()["int8"]))
    budget = int8_w + kv + rnd(act_peak) + 300_000    # int8 leaves room; full is ~460 KB short
    cfg = EngineConfig(max_num_batched_tokens=128, num_kv_blocks=blocks, memory_budget_bytes=budget,
                       max_oom_retries=1, oom_backoff_seconds=0.0)
    engine = LLMEngine(bundle, cfg)
    engine.add_request("book", prompt, greedy(16))
    _, final = drain(engine)
    out = final["book"]
    assert out.finish_reason == "error" and out.error_status == 503 and "retry" in out.error
    faults = engine.stats()["faults"]
    assert faults["oom_total"] == 2                   # first try + one retry
    f = faults["last_oom"]
    assert (f["kind"], f["source"], f["precision"]) == ("exhaustion", "budget", "full")
    assert f["requested_bytes"] == rnd(act_peak)
    assert f["total_bytes"] == budget
    assert f["allocated_bytes"] == full_w + kv
    assert f["reserved_unallocated_bytes"] == 0
    assert f["free_bytes"] == budget - full_w - kv
    assert faults["recent"][0]["requeued_requests"] == 1 and faults["recent"][1]["failed_requests"] == 1
    assert "Tried to allocate" in f["message"]
    assert metric(engine, "inferctl_engine_oom_total", {"kind": "exhaustion"}) == 2
    assert metric(engine, "inferctl_engine_request_errors_total", {"model": "stories260K", "reason": "oom"}) == 1
    # the engine keeps serving
    engine.add_request("short", bundle.tokenizer.encode("Once upon a time"), greedy(10))
    assert drain(engine)[1]["short"].finish_reason == "length"
    # int8 weights free ~750 KB of the budget: the same request now fits
    engine.request_precision("int8")
    engine.add_request("book", prompt, greedy(16))
    tokens, final = drain(engine)
    assert final["book"].finish_reason == "length" and len(tokens["book"]) == 16
    stats = engine.stats()
    assert stats["engine"]["precision"] == "int8"
    assert stats["memory"]["weights_bytes"] == int8_w
    assert stats["memory"]["int8_weights_bytes"] == bundle.model.weight_bytes_by_mode()["int8"]
    assert stats["faults"]["oom_total"] == 2
    assert stats["kv_cache"]["blocks_used"] == 0
    assert metric(engine, "inferctl_engine_precision_switches_total", {"to": "int8"}) == 1
    assert metric(engine, "inferctl_engine_precision_mode", {"mode": "int8"}) == 1


def test_injected_oom_requeues_and_the_output_is_unchanged(bundle):
    ids = bundle.tokenizer.encode("Once upon a time")
    ref = LLMEngine(bundle, EngineConfig())
    ref.add_request("r", ids, greedy(30))
    expected = drain(ref)[0]["r"]
    engine = LLMEngine(bundle, EngineConfig(oom_backoff_seconds=0.0))
    engine.add_request("r", ids, greedy(30))
    got = []
    for _ in range(5):
        for o in engine.step():
            got += o.new_token_ids
    engine.inject_fault("oom", 1)
    assert engine.step() == []                        # the step ran out of memory
    assert engine.block_manager.num_used_blocks == 0  # re-queued for recompute
    assert engine.scheduler.num_waiting == 1
    tokens, final = drain(engine)
    assert got + tokens["r"] == expected
    assert final["r"].finish_reason == "length"
    f = engine.stats()["faults"]["last_oom"]
    assert (f["source"], f["requeued_requests"], f["free_bytes"]) == ("injected", 1, 0)
    with pytest.raises(ValueError):
        engine.inject_fault("xid", 1)


def test_oom_retries_exhausted_fail_the_request_with_a_hint(bundle):
    engine = LLMEngine(bundle, EngineConfig(max_oom_retries=2, oom_backoff_seconds=0.0))
    engine.add_request("r", bundle.tokenizer.encode("Once upon a time"), greedy(10))
    engine.inject_fault("oom", 3)
    _, final = drain(engine)
    out = final["r"]
    assert out.finished and out.finish_reason == "error" and out.error_status == 503
    assert "after 2 retries" in out.error and "retry later" in out.error
    stats = engine.stats()
    assert stats["requests"]["by_finish_reason"]["error"] == 1
    assert stats["faults"]["oom_total"] == 3
    engine.add_request("s", bundle.tokenizer.encode("Tom"), greedy(5))
    assert drain(engine)[1]["s"].finish_reason == "length"


def test_impossible_oom_rejects_the_culprit_without_retry(bundle, book_ids):
    full_w = -(-bundle.model.weight_bytes() // 512) * 512
    budget = full_w + 16 * 20480 + 300_000
    engine = LLMEngine(bundle, EngineConfig(max_num_batched_tokens=256, num_kv_blocks=16,
                                            memory_budget_bytes=budget, oom_backoff_seconds=0.0))
    engine.add_request("huge", [1] + book_ids[:199], greedy(4))          # one 200-token chunk
    engine.add_request("small", bundle.tokenizer.encode("Tom"), greedy(4))
    _, final = drain(engine)
    assert final["huge"].finish_reason == "error" and final["huge"].error_status == 400
    assert "can never fit" in final["huge"].error
    assert final["small"].finish_reason == "length"
    faults = engine.stats()["faults"]
    assert faults["oom_total"] == 1 and faults["last_oom"]["kind"] == "impossible"
    assert faults["last_oom"]["requested_bytes"] > faults["last_oom"]["total_bytes"] == budget
    assert faults["last_oom"]["requeued_requests"] == 1


def test_abort_frees_blocks_at_once(bundle):
    engine = LLMEngine(bundle, EngineConfig())
    engine.add_request("a", bundle.tokenizer.encode("Once upon a time"), greedy(100))
    engine.add_request("b", bundle.tokenizer.encode("Tom"), greedy(100))
    for _ in range(40):
        engine.step()
    used_b = len(engine._seqs["b"].block_table)
    assert engine.block_manager.num_used_blocks > used_b
    engine.abort_request("a")
    assert engine.block_manager.num_used_blocks == used_b
    engine.abort_request("b")
    engine.abort_request("unknown")
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished_requests()
    stats = engine.stats()
    assert stats["requests"]["by_finish_reason"]["abort"] == 2
    assert stats["kv_cache"]["blocks_used"] == 0 and stats["kv_cache"]["usage_ratio"] == 0.0
    assert metric(engine, "inferctl_engine_requests_total", {"model": "stories260K", "finish_reason": "abort"}) == 2


def test_f14_admission_errors_and_the_engine_keeps_serving(bundle):
    # the F14 numbers are past stories260K's 512 positions: admission is what is tested, not output quality
    engine = LLMEngine(bundle, EngineConfig(max_model_len=16384, num_kv_blocks=1000, allow_long_max_model_len=True))
    with pytest.raises(AdmissionError) as ei:
        engine.add_request("a", [1] * 112946, greedy(10000))
    assert ei.value.status == 400 and "122946 > max_model_len 16384" in ei.value.message
    with pytest.raises(AdmissionError) as ei:
        engine.add_request("b", [1] * 15000, greedy(2000))
    assert ei.value.status == 400 and ei.value.field == "max_tokens"
    big = LLMEngine(bundle, EngineConfig(max_model_len=32768, num_kv_blocks=1000, allow_long_max_model_len=True))
    with pytest.raises(AdmissionError) as ei:
        big.add_request("c", [1] * 17000, greedy(16))
    assert "1063 KV blocks of 16 tokens > 1000" in ei.value.message
    for e in (engine, big):
        e.add_request("ok", bundle.tokenizer.encode("Once upon a time"), greedy(8))
        assert drain(e)[1]["ok"].finish_reason == "length"
        assert e.stats()["kv_cache"]["blocks_used"] == 0
    assert engine.stats()["requests"]["admission_errors_total"] == 2
    assert metric(engine, "inferctl_engine_request_errors_total",
                  {"model": "stories260K", "reason": "invalid_request"}) == 2
    with pytest.raises(AdmissionError, match="outside the vocabulary"):
        engine.add_request("v", [1, 512], greedy(4))
    with pytest.raises(AdmissionError, match="empty"):
        engine.add_request("e", [], greedy(4))


def test_draining_refuses_new_requests_with_503(bundle):
    engine = LLMEngine(bundle, EngineConfig())
    engine.add_request("a", bundle.tokenizer.encode("Tom"), greedy(5))
    engine.set_draining(True)
    with pytest.raises(AdmissionError) as ei:
        engine.add_request("b", bundle.tokenizer.encode("Tom"), greedy(5))
    assert ei.value.status == 503
    assert drain(engine)[1]["a"].finish_reason == "length"    # in-flight work finishes
    assert engine.stats()["engine"]["draining"] is True
    engine.set_draining(False)
    engine.add_request("b", bundle.tokenizer.encode("Tom"), greedy(5))


def test_stop_string_eos_and_repetition_stop(bundle):
    engine = LLMEngine(bundle, EngineConfig(repetition_stop_max_ngram=16))
    ids = bundle.tokenizer.encode("Once upon a time")
    engine.add_request("s", ids, SamplingParams(max_tokens=60, temperature=0, stop=["Lily"]))
    engine.add_request("t", bundle.tokenizer.encode("Tom"), greedy(400, repetition_stop=True))
    text = {"s": ""}
    tokens, final = {}, {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.request_id == "s":
                text["s"] += o.new_text
            if o.finished:
                final[o.request_id] = o
    assert final["s"].finish_reason == "stop"
    assert text["s"] == ", there was a little girl named "
    assert final["t"].finish_reason == "repetition" and len(tokens["t"]) < 400
    recent = {r["request_id"]: r for r in engine.stats()["requests"]["recent"]}
    assert recent["t"]["degenerate"] is True and recent["t"]["seq_rep"]["4"] > 0.3
    assert recent["s"]["degenerate"] is False
    # TinyStories checkpoints end a story with BOS (llama2.c run.c stops there): a stop token
    engine.add_request("e", bundle.tokenizer.encode("The cat"),
                       SamplingParams(max_tokens=480, temperature=0, stop_token_ids=[1]))
    tokens, final = drain(engine)
    assert final["e"].finish_reason == "stop" and tokens["e"][-1] == 1 and len(tokens["e"]) < 480
    # the same id as the tokenizer's EOS ends the request too, unless ignore_eos
    engine._eos_id = 1
    engine.add_request("e", bundle.tokenizer.encode("The cat"), SamplingParams(max_tokens=480, temperature=0))
    engine.add_request("i", bundle.tokenizer.encode("The cat"), greedy(480))
    tokens, final = drain(engine)
    assert final["e"].finish_reason == "stop" and tokens["e"][-1] == 1
    assert final["i"].finish_reason == "length" and 1 in tokens["i"]


def test_precision_switch_mid_generation_keeps_every_request(bundle):
    engine = LLMEngine(bundle, EngineConfig())
    for i, p in enumerate(["Once upon a time", "Tom", "The cat", "Lily and Ben"]):
        engine.add_request(str(i), bundle.tokenizer.encode(p), greedy(40))
    for _ in range(10):
        engine.step()
    before = engine.stats()["memory"]["weights_bytes"]
    engine.request_precision("int8")
    assert engine.stats()["engine"]["requested_precision"] == "int8"
    tokens, final = drain(engine)
    assert all(f.finish_reason == "length" for f in final.values()) and len(final) == 4
    assert all(len(t) >= 30 for t in tokens.values())
    stats = engine.stats()
    assert stats["engine"]["precision"] == "int8"
    assert stats["memory"]["weights_bytes"] < before / 3
    assert {r["precision"] for r in stats["requests"]["recent"]} == {"mixed"}
    # back to full: the weights are restored exactly, so greedy output is the reference again
    engine.request_precision("full")
    engine.add_request("r", bundle.tokenizer.encode("Once upon a time"), greedy(60))
    tokens, _ = drain(engine)
    assert bundle.tokenizer.decode(tokens["r"]).startswith(REFERENCE)
    assert engine.stats()["memory"]["weights_bytes"] == before
    with pytest.raises(ValueError):
        engine.request_precision("fp4")


def test_stats_document(bundle):
    engine = LLMEngine(bundle, EngineConfig(memory_budget_bytes=64 << 20, max_num_batched_tokens=256))
    s = engine.stats()
    assert s["requests"]["ttft_seconds"] == {"p50": None, "p90": None, "p99": None, "count": 0}
    assert s["kv_cache"]["waste_ratio"] is None and s["requests"]["recent"] == []
    assert s["engine"]["model"] == "stories260K" and s["engine"]["models"] == ["stories260K"]
    assert s["engine"]["kv_cache_dtype"] == "fp32" and s["memory"]["budget_bytes"] == 64 << 20
    kv = s["kv_cache"]
    assert kv["num_blocks"] * 20480 == s["memory"]["kv_pool_bytes"]
    assert s["memory"]["weights_bytes"] + s["memory"]["kv_pool_bytes"] <= 64 << 20
    for i in range(3):
        engine.add_request(str(i), bundle.tokenizer.encode("Once upon a time"), greedy(20 + i))
    for _ in range(5):
        engine.step()
    mid = engine.stats()
    stored = mid["kv_cache"]["tokens_stored"]
    used = mid["kv_cache"]["blocks_used"]
    assert stored == 3 * (5 + 4)                      # 5 prompt tokens + 4 fed outputs each
    assert mid["kv_cache"]["waste_ratio"] == pytest.approx(1 - stored / (used * 16))
    drain(engine)
    s = engine.stats()
    json.dumps(s, allow_nan=False)
    r = s["requests"]
    assert r["finished_total"] == 3 and r["completion_tokens_total"] == 20 + 21 + 22
    assert r["prompt_tokens_total"] == 15
    assert r["ttft_seconds"]["count"] == 3 and r["ttft_seconds"]["p50"] > 0
    assert r["itl_seconds"]["count"] == 19 + 20 + 21
    assert r["e2e_seconds"]["p99"] >= r["e2e_seconds"]["p50"] > 0
    rec = r["recent"][0]
    assert set(rec) >= {"request_id", "prompt_tokens", "completion_tokens", "finish_reason",
                        "ttft_seconds", "e2e_seconds", "seq_rep", "distinct", "perplexity",
                        "degenerate", "precision"}
    assert 1.0 < rec["perplexity"] < 20.0
    sch = s["scheduler"]
    assert sch["padded_tokens_total"] == 0 and sch["real_tokens_total"] == 15 + 19 + 20 + 21
    assert sch["step_sequences_total"] >= sch["steps_total"] > 0
    assert s["faults"] == {**s["faults"], "oom_total": 0, "last_oom": None, "recent": []}
    assert metric(engine, "inferctl_engine_generation_tokens_total", {"model": "stories260K"}) == 63
    assert metric(engine, "inferctl_engine_kv_cache_blocks", {"state": "used"}) == 0


def test_config_errors_name_the_field(bundle):
    with pytest.raises(ConfigError) as ei:
        LLMEngine(bundle, EngineConfig(memory_budget_bytes=1_000_000))
    assert ei.value.field == "memory_budget_bytes" and "max_num_batched_tokens" in str(ei.value)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="fp8")
    with pytest.raises(ConfigError, match="model was loaded on 'cpu'"):
        LLMEngine(bundle, EngineConfig(device="cuda:0"))       # the engine never moves a model
    with pytest.raises(ConfigError, match="model was loaded in 'float32'"):
        LLMEngine(bundle, EngineConfig(dtype="bfloat16"))


def test_int8_kv_cache_serves(bundle):
    engine = LLMEngine(bundle, EngineConfig(kv_cache_dtype="int8", num_kv_blocks=64))
    engine.add_request("r", bundle.tokenizer.encode("Once upon a time"), greedy(20))
    tokens, final = drain(engine)
    assert final["r"].finish_reason == "length" and len(tokens["r"]) == 20
    s = engine.stats()
    assert s["engine"]["kv_cache_dtype"] == "int8"
    assert s["kv_cache"]["bytes_per_block"] == 2 * 5 * 16 * 4 * 8 + 2 * 5 * 16 * 4 * 4


class FailingModel:
    """Wraps the real model; raises ``errors`` (one per call) before running it."""

    def __init__(self, model, errors):
        self.model = model
        self.errors = list(errors)

    def __call__(self, *args):
        if self.errors:
            raise self.errors.pop(0)
        return self.model(*args)


def test_cuda_oom_codes_requeue_and_hardware_errors_fail_the_step(bundle):
    ids = bundle.tokenizer.encode("Once upon a time")
    engine = LLMEngine(bundle, EngineConfig(oom_backoff_seconds=0.0))
    engine.runner.model = FailingModel(bundle.model, [RuntimeError("CUDA error: operation not permitted")])
    engine.add_request("r", ids, greedy(12))
    tokens, final = drain(engine)
    assert final["r"].finish_reason == "length" and len(tokens["r"]) == 12
    f = engine.stats()["faults"]["last_oom"]
    assert (f["source"], f["kind"], f["requeued_requests"]) == ("cuda", "exhaustion", 1)
    assert f["requested_bytes"] is None and f["free_bytes"] is None     # the message had no numbers
    # a sticky CUDA error is a hardware fault: never an OOM, the step's requests fail with 500
    engine.runner.model = FailingModel(bundle.model,
                                       [RuntimeError("CUDA error: an illegal memory access was encountered")])
    engine.add_request("h", ids, greedy(12))
    _, final = drain(engine)
    assert final["h"].finish_reason == "error" and final["h"].error_status == 500
    assert "hardware" in final["h"].error
    s = engine.stats()
    assert s["faults"]["oom_total"] == 1 and s["faults"]["hardware_errors_total"] == 1
    assert s["kv_cache"]["blocks_used"] == 0
    engine.add_request("ok", ids, greedy(3))
    assert drain(engine)[1]["ok"].finish_reason == "length"
    assert metric(engine, "inferctl_engine_request_errors_total", {"model": "stories260K", "reason": "internal"}) == 1


def test_fragmentation_oom_empties_the_cache_and_retries(bundle):
    from inferctl.contract.units import GiB, MiB
    from inferctl.engine.oom import format_oom_message
    msg = format_oom_message(2 * MiB, 80 * GiB, 1 * MiB, 10 * GiB, 3 * MiB)   # U 3 MiB >= R 2 MiB
    engine = LLMEngine(bundle, EngineConfig())
    engine.runner.model = FailingModel(bundle.model, [torch.OutOfMemoryError(msg)])
    emptied = []
    real_empty = engine.accountant.empty_cache
    # record whether the request was still in flight at each call: once for the fragmentation
    # OOM (in flight), once when the engine went idle after finishing it
    engine.accountant.empty_cache = lambda: emptied.append(engine.has_unfinished_requests()) or real_empty()
    engine.add_request("r", bundle.tokenizer.encode("Tom"), greedy(8))
    tokens, final = drain(engine)
    assert final["r"].finish_reason == "length" and len(tokens["r"]) == 8
    f = engine.stats()["faults"]["last_oom"]
    assert (f["kind"], f["action"], f["source"]) == ("fragmentation", "empty_cache", "cuda")
    assert f["reserved_unallocated_bytes"] == 3 * MiB and f["requested_bytes"] == 2 * MiB
    assert round(100 * f["fragmentation_ratio"], 2) == round(100 * 3 / (10 * 1024 + 3), 2)
    assert emptied == [True, False]
    assert engine.backoff_remaining() == 0.0          # no backoff for fragmentation


def test_a_precision_switch_that_raises_is_refused_and_the_engine_keeps_serving(bundle, monkeypatch):
    # CUDA: restoring the full weights onto the device can itself run out of memory. The switch
    # must be refused (weights still accounted, requested precision back to the current one),
    # never leave the engine re-trying a switch whose weights handle is gone on every step.
    engine = LLMEngine(bundle, EngineConfig())
    weights = engine.stats()["memory"]["weights_bytes"]

    def fail(mode):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")

    monkeypatch.setattr(bundle.model, "set_precision", fail)
    engine.add_request("r", bundle.tokenizer.encode("Once upon a time"), greedy(60))
    engine.request_precision("int8")
    text = "".join(o.new_text for o in engine.step())
    monkeypatch.undo()
    s = engine.stats()["engine"]
    assert s["precision"] == "full" and s["requested_precision"] == "full"
    assert "switch to int8 refused" in s["precision_error"] and "Tried to allocate" in s["precision_error"]
    assert engine.stats()["memory"]["weights_bytes"] == weights
    while engine.has_unfinished_requests():
        text += "".join(o.new_text for o in engine.step())
    assert text.startswith(REFERENCE)
