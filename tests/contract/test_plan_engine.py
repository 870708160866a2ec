"""``inferctl plan`` against the engine's own memory accountant: the engine built on CPU in this
process, its weights and KV pool as the accountant reports them, and the planner's figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_model
from inferctl.tools.plan import compute_plan, read_model

GGUF = Path(__file__).resolve().parents[2].parent / "shared" / "models" / "smollm2-135m-instruct" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"


def _engine_numbers(spec: str) -> tuple[int, float]:
    eng = LLMEngine(load_model(spec), EngineConfig(device="cpu", num_threads=1))
    snap = eng.accountant.snapshot()
    per_token = snap["kv_pool_bytes"] / (eng.num_kv_blocks * eng.config.block_size)
    return snap["weights_bytes"], per_token


def test_stories260k_plan_matches_the_engine_accountant(stories_dir):
    spec = str(stories_dir / "stories260K.bin")
    weights, kv_per_token = _engine_numbers(spec)
    plan = compute_plan(read_model(spec), "fp32")
    # the simulated allocator rounds each allocation up to 512 bytes
    assert abs(plan.weights_bytes - weights) / weights < 0.01
    assert abs(plan.kv_bytes_per_token - kv_per_token) / kv_per_token < 0.01


@pytest.mark.skipif(not GGUF.exists() or importlib.util.find_spec("inferctl.engine.gguf") is None,
                    reason="needs the SmolLM2 GGUF and the engine's GGUF loader (inferctl.engine.gguf)")
def test_smollm2_plan_matches_the_engine_accountant():
    weights, kv_per_token = _engine_numbers(str(GGUF))     # the engine dequantizes to float32
    plan = compute_plan(read_model(str(GGUF)), "fp32", 8192, 16)
    assert abs(plan.weights_bytes - weights) / weights < 0.03
    assert abs(plan.kv_bytes_per_token - kv_per_token) / kv_per_token < 0.01
