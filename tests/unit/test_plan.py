"""``inferctl plan``: the planner's formulas against published figures, the engine's own weight and
KV accounting (the model built on the meta device: no memory), and its refusals naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.engine.attention import KVCache
from inferctl.engine.model import LlamaModel, ModelArgs, canonical_weight_names
from inferctl.tools.plan import PlanError, compute_plan, dims_from_flags, parse_count, read_model

GGUF = Path(__file__).resolve().parents[2].parent / "shared" / "models" / "smollm2-135m-instruct" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"


def _engine_accounting(d, dtype=torch.float32) -> tuple[int, int]:
    """(weight bytes, KV bytes per token) as the engine counts them, for a model of ``d``'s shape."""
    args = ModelArgs(dim=d.hidden, n_layers=d.layers, n_heads=d.heads, n_kv_heads=d.kv_heads, vocab_size=d.vocab,
                     hidden_dim=d.intermediate, max_seq_len=d.context_length or 512, tie_embeddings=d.tied,
                     head_dim=d.head_dim)
    weights = {n: torch.empty(s, device="meta") for n, s in canonical_weight_names(args).items()}
    model = LlamaModel(args, weights, device="meta", dtype=dtype)
    return model.weight_bytes(), KVCache.bytes_per_block(args.n_layers, 16, args.n_kv_heads, args.head_dim,
                                                         dtype) // 16


def test_published_figures_70b_fp16_weights_and_llama2_7b_kv_per_token():
    assert compute_plan(dims_from_flags("70B"), "fp16", 4096).weights_bytes == 140 * 10 ** 9
    p = compute_plan(dims_from_flags("7B", layers=32, kv_heads=32, head_dim=128), "fp16", 4096, concurrency=2)
    assert p.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    assert p.kv_bytes == 512 * 1024 * 4096 * 2          # 4 GiB for two 4k sequences
    assert compute_plan(dims_from_flags("7B"), "int4", 4096).weights_bytes == 3_500_000_000


def test_stories260k_matches_the_engine_accounting(stories_dir):
    d = read_model(str(stories_dir / "stories260K.bin"))
    w, kv = _engine_accounting(d)
    p = compute_plan(d, "fp32")
    assert p.context == 512 and p.weights_bytes == w and p.kv_bytes_per_token == kv == 1280
    assert compute_plan(d, "bf16").weights_bytes == _engine_accounting(d, torch.bfloat16)[0]


def test_hf_directory_gives_the_same_model_as_the_checkpoint(stories_dir, tmp_path):
    from inferctl.engine.loader import load_model, save_hf_dir

    save_hf_dir(load_model(str(stories_dir / "stories260K.bin")), tmp_path / "hf")
    a, b = read_model(str(stories_dir / "stories260K.bin")), read_model(str(tmp_path / "hf"))
    assert (b.source, b.params, b.layers, b.kv_heads, b.head_dim) == ("hf", a.params, a.layers, a.kv_heads, a.head_dim)
    assert b.stored_bytes == 4 * a.params     # the safetensors headers, float32


@pytest.mark.skipif(not GGUF.exists(), reason="SmolLM2 GGUF not in ../shared")
def test_smollm2_gguf_metadata_matches_the_engine_accounting():
    d = read_model(str(GGUF))
    assert (d.layers, d.heads, d.kv_heads, d.head_dim, d.hidden, d.intermediate, d.vocab, d.tied) == \
        (30, 9, 3, 64, 576, 1536, 49152, True)
    w, kv = _engine_accounting(d)
    p = compute_plan(d, "fp32", 8192, 16)
    assert abs(p.weights_bytes - w) / w < 0.02            # params from the tensor table vs the engine's layout
    assert p.kv_bytes_per_token == kv == 2 * 30 * 3 * 64 * 4
    stored = compute_plan(d, "auto", 8192, 16)
    # Q4_1: 20 bytes per 32 weights; the embedding Q8_0: 34 per 32 -> about 5.7 bits per weight, as stored
    assert stored.precision == "stored" and stored.weights_bytes == 96_576_768
    assert stored.kv_bytes == 2 * 30 * 3 * 64 * 2 * 8192 * 16


def test_activation_figures_and_gpu_fit():
    d = dims_from_flags(layers=2, heads=4, kv_heads=2, hidden=64, intermediate=128, vocab=100)
    p = compute_plan(d, "fp16", 1024, concurrency=3)
    assert p.activations["notes_term"] == 1024 ** 2 * 4 * 64 * 2
    assert p.activations["unfused_attention_scores"] == 2 * 3 * 4 * 1024 ** 2 * 2
    assert p.total_bytes == p.weights_bytes + p.kv_bytes + p.activations["engine_worst_step"]
    big = compute_plan(dims_from_flags("70B", layers=80, kv_heads=8, head_dim=128), "fp16", 4096)
    fits = {g.gpu: g for g in big.gpus}
    assert not fits["H100 SXM 80GB"].fits and fits["H100 SXM 80GB"].gpus_needed == 2
    assert fits["H200 SXM 141GB"].decode_tokens_per_s == pytest.approx(4.8e12 / 140e9)


@pytest.mark.parametrize("argv, flag", [
    (["--params", "7B", "--context", "-5"], "--context"),
    (["--params", "7B", "--context", "10", "--precision", "fp7"], "--precision"),
    (["--model", "no/such/model.gguf"], "--model"),
    (["--model", "meta-llama/Llama-2-7b-hf"], "--model"),
    (["--params", "seven", "--context", "10"], "--params"),
    (["--params", "7B", "--context", "10", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
])
def test_bad_input_names_the_flag(argv, flag):
    r = CliRunner().invoke(app, ["plan", *argv])
    assert r.exit_code == 2, r.output
    assert f"error: {flag}:" in r.output and "Traceback" not in r.output


def test_hub_id_is_not_downloaded():
    with pytest.raises(PlanError, match="hub ids are not downloaded"):
        read_model("meta-llama/Llama-2-7b-hf")
    assert parse_count("135M") == 135_000_000 and parse_count("6.7b") == 6_700_000_000


def test_piped_output_is_plain_full_rows_and_json(stories_dir):
    model = str(stories_dir / "stories260K.bin")
    r = CliRunner().invoke(app, ["plan", model, "--precision", "fp32"], terminal_width=60)
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if line.startswith("KV cache per token"))
    assert "2 × 5 layers × 4 KV heads × 8 head dim × 4 bytes (fp32)" in row     # not cut at 60 columns
    assert "H200 SXM 141GB" in r.output and "…" not in r.output and "│" not in r.output
    j = json.loads(CliRunner().invoke(app, ["plan", "--model", model, "--json", "--context", "256"]).stdout)
    assert j["kv_bytes"] == 1280 * 256 and j["weights_bytes"] == 1_040_128
