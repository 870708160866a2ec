"""``inferctl plan --speculative-config`` against the engine's accountant: an engine with a draft
model built on CPU in this process (stories260K), its ``draft_weights`` and ``draft_kv_cache``
allocations, and the planner's draft figures."""

from __future__ import annotations

import json

import pytest

from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_model
from inferctl.tools.plan import compute_plan, read_model


@pytest.mark.parametrize("method", ["int8_self", "draft_model"])
def test_the_plans_draft_matches_the_engine_accountant(stories_dir, method):
    path = str(stories_dir / "stories260K.bin")
    cfg = {"method": method, "num_speculative_tokens": 3, **({"model": path} if method == "draft_model" else {})}
    eng = LLMEngine(load_model(path), EngineConfig(device="cpu", num_threads=1, speculative_config=json.dumps(cfg)))
    snap = eng.accountant.snapshot()
    tokens = eng.num_kv_blocks * eng.config.block_size
    plan = compute_plan(read_model(path), "fp32", speculative_config=cfg)
    # the simulated allocator rounds each allocation up to 512 bytes
    assert abs(plan.draft["weights_bytes"] - snap["draft_weights_bytes"]) <= 512
    assert plan.draft["kv_bytes_per_token"] * tokens == snap["draft_kv_pool_bytes"]
