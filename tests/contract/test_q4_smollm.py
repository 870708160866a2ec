"""SmolLM2 (GGUF Q4_1) in --precision int4 through the engine's GGUF-block kernel: every layer
linear 4-bit (the file's Q4_1 blocks), the tied classifier int8 (the file's is Q8_0), and the
greedy tokens of the C++ kernel equal those of the plain-PyTorch fallback
(dequantize + matmul) on the same blocks."""

from __future__ import annotations

import pytest

from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_model
from inferctl.engine.q4_kernels import Q4Weight
from inferctl.engine.quant import Int8Weight
from inferctl.engine.quant_int4 import q4_ops
from inferctl.engine.sampling_params import SamplingParams
from tests.gguf_helpers import require_smollm

PROMPT = "The capital of France is Paris. The capital of Italy is"
N = 16


def _linears(model):
    return [getattr(b, a) for b in model.layers for a in ("wqkv", "wo", "w13", "w2")]


def _greedy(eng: LLMEngine, prompts: list[list[int]], n: int) -> list[list[int]]:
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while eng.has_unfinished_requests():
        for o in eng.step():
            out[o.request_id] += list(o.new_token_ids)
    return [out[f"r{i}"] for i in range(len(prompts))]


def test_smollm2_int4_greedy_kernel_equals_fallback():
    if q4_ops("cpu") is None:
        pytest.skip("engine CPU kernels not built here")
    bundle = load_model(require_smollm())
    eng = LLMEngine(bundle, EngineConfig(device="cpu", num_threads=2, max_num_seqs=4, max_model_len=256), "int4")
    model = eng.model
    assert model.precision == "int4"
    assert all(isinstance(lin.q, Q4Weight) and lin.q.ops is not None for lin in _linears(model))
    assert isinstance(model.output.q, Int8Weight)
    assert model.weight_bytes() == 95_102_208      # layer linears 0.625 B/weight, classifier int8, fp32 norms
    prompt = bundle.tokenizer.encode(PROMPT)
    [kernel] = _greedy(eng, [prompt], N)
    assert len(kernel) == N
    # The fallback (ops None: dequantize + matmul in plain PyTorch, ~2 s a step here) predicts the
    # kernel's token at positions 0, 5, 10 and 15 from the kernel's own prefix, in one batched prefill.
    for lin in _linears(model):
        lin.q.ops = None
    cuts = (0, 5, 10, 15)
    fallback = _greedy(eng, [prompt + kernel[:c] for c in cuts], 1)
    assert [f[0] for f in fallback] == [kernel[c] for c in cuts]
