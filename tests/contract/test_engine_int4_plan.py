"""--precision int4 at start: the memory plan counts the 4-bit weights the engine will run with,
not the fp32 weights it drops, so the KV pool gets the blocks the budget holds beside them."""

from __future__ import annotations

import pytest

from inferctl.engine.config import ConfigError, EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import build_demo_model
from inferctl.engine.memory_plan import _ROUNDING_SLACK
from inferctl.engine.sampling_params import SamplingParams

SMALL = dict(device="cpu", num_threads=1, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)


def _engine(budget: int | None, precision: str) -> LLMEngine:
    extra = {} if budget is None else {"memory_budget_bytes": budget}
    return LLMEngine(build_demo_model(), EngineConfig(**SMALL, **extra), precision)


def test_int4_start_plans_the_kv_pool_from_the_int4_weight_bytes():
    probe = _engine(None, "full")
    by_mode, bpb, headroom = probe._weight_bytes_by_mode, probe.kv_bytes_per_block, probe.profile_activation_bytes
    budget = by_mode["full"] + headroom + _ROUNDING_SLACK + 10 * bpb
    full = _engine(budget, "full")
    int4 = _engine(budget, "int4")
    assert full.num_kv_blocks == 10
    assert int4.precision == "int4"
    # every byte the 4-bit weights leave free goes to the pool (fp32 plan: 10 blocks)
    assert int4.num_kv_blocks == (budget - by_mode["int4"] - headroom - _ROUNDING_SLACK) // bpb
    assert int4.num_kv_blocks == 10 + (by_mode["full"] - by_mode["int4"]) // bpb > 10
    snap = int4.accountant.snapshot()
    assert snap["weights_bytes"] >= by_mode["int4"] and snap["weights_bytes"] < by_mode["int8"]
    assert snap["allocated_bytes"] + headroom <= budget
    # and it serves: a greedy request runs to its length in int4
    int4.add_request("r", [5, 9, 200], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    toks = []
    while int4.has_unfinished_requests():
        toks += [t for o in int4.step() for t in o.new_token_ids]
    assert len(toks) == 4


def test_a_budget_only_int4_weights_fit_in_starts_int4_and_refuses_full():
    probe = _engine(None, "full")
    by_mode, bpb, headroom = probe._weight_bytes_by_mode, probe.kv_bytes_per_block, probe.profile_activation_bytes
    budget = by_mode["int4"] + headroom + _ROUNDING_SLACK + 2 * bpb    # < the fp32 weights + headroom
    assert budget < by_mode["full"] + headroom
    assert _engine(budget, "int4").num_kv_blocks == 2
    with pytest.raises(ConfigError, match="memory_budget_bytes"):
        _engine(budget, "full")


def test_an_unknown_start_precision_is_refused():
    with pytest.raises(ValueError, match="precision"):
        _engine(None, "int3")


def test_no_start_precision_keeps_the_model_in_the_precision_it_is_in():
    bundle = build_demo_model()
    bundle.model.set_precision("int8")
    assert LLMEngine(bundle, EngineConfig(**SMALL)).precision == "int8"
    assert bundle.model.precision == "int8"
