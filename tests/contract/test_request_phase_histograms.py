"""Per-request queue, prefill and decode time histograms (vLLM's request-phase metrics) on the
real engine: their sum is each request's end-to-end latency, and a queued request's queue time
covers the request ahead of it."""

from __future__ import annotations

import pytest

from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_llama2c
from inferctl.engine.sampling_params import SamplingParams
from tests.core_helpers import drain


@pytest.fixture(scope="module")
def bundle(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin", stories_dir / "tok512.bin")


def value(engine: LLMEngine, name: str, suffix: str) -> float:
    return engine.registry.get_sample_value(f"inferctl_engine_{name}_seconds_{suffix}",
                                            {"model": engine.model_name})


def test_phase_histograms_add_up_to_e2e_and_measure_queueing(bundle):
    engine = LLMEngine(bundle, EngineConfig(max_num_seqs=1, num_kv_blocks=64))   # one at a time: b queues
    ids = bundle.tokenizer.encode("Once upon a time", bos=True)
    engine.add_request("a", ids, SamplingParams(max_tokens=30, temperature=0.0))
    engine.add_request("b", ids, SamplingParams(max_tokens=5, temperature=0.0))
    seqs = {rid: engine._seqs[rid] for rid in ("a", "b")}
    drain(engine)
    for phase in ("queue", "prefill", "decode"):
        assert value(engine, f"request_{phase}_time", "count") == 2
    total = sum(value(engine, f"request_{p}_time", "sum") for p in ("queue", "prefill", "decode"))
    assert total == pytest.approx(value(engine, "e2e_request_latency", "sum"), rel=1e-9)
    a, b = seqs["a"], seqs["b"]
    # b waited in the queue until a finished: its queue time spans a's whole life
    assert b.scheduled_time - b.arrival_time >= a.last_token_time - a.scheduled_time > 0
    assert a.last_token_time - a.first_token_time > 0          # 29 decode steps
    assert value(engine, "request_decode_time", "sum") == pytest.approx(
        (a.last_token_time - a.first_token_time) + (b.last_token_time - b.first_token_time))


def test_aborted_requests_stay_out_of_the_phase_histograms(bundle):
    engine = LLMEngine(bundle, EngineConfig(num_kv_blocks=64))
    ids = bundle.tokenizer.encode("Once upon a time", bos=True)
    engine.add_request("x", ids, SamplingParams(max_tokens=30, temperature=0.0))
    engine.step()
    engine.abort_request("x")
    drain(engine)
    assert value(engine, "request_queue_time", "count") == 0
