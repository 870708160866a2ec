"""llama2.c ↔ Hugging Face: converted stories260K gives the same logits here and in transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inferctl.engine.loader import load_hf_dir, load_llama2c, load_model, save_hf_dir
from inferctl.engine.tokenizer import HFTokenizer
from tests.model_helpers import Harness

TEXTS = ["Once upon a time", "Lily and Tom went to the park.\nThey saw a dog.", "Hello wörld é 🎉!",
         "  two  spaces", "a", "The end. The END! 123"]


@pytest.fixture(scope="module")
def converted(stories_dir, tmp_path_factory):
    src = load_llama2c(stories_dir / "stories260K.bin")
    out = save_hf_dir(src, tmp_path_factory.mktemp("hf") / "stories260K")
    return src, out


def test_converted_directory_layout(converted):
    src, out = converted
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["hidden_size"] == 64 and cfg["num_key_value_heads"] == 4 and cfg["tie_word_embeddings"] is True
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_converted_tokenizer_encodes_like_llama2c(converted, stories_dir):
    src, out = converted
    hf = HFTokenizer(out / "tokenizer.json")
    assert (hf.bos_id, hf.eos_id, hf.vocab_size) == (1, 2, 512)
    eval_lines = (Path(__file__).resolve().parents[1] / "data" / "eval_stories.txt").read_text().splitlines()
    for t in TEXTS + eval_lines:
        ids = src.tokenizer.encode(t)
        assert hf.encode(t) == ids, t
        assert hf.decode(ids) == src.tokenizer.decode(ids) == t


def test_llama2c_hf_and_transformers_logits_agree(converted):
    src, out = converted
    hf = load_model(str(out))
    assert hf.args.rope_style == "half" and src.args.rope_style == "interleaved"
    prompt = src.tokenizer.encode("Once upon a time")
    toks_a, rows_a = Harness(src.model).greedy(0, prompt, 48)
    toks_b, rows_b = Harness(hf.model, block_size=5, shuffle=True).greedy(0, prompt, 48)
    assert toks_a == toks_b
    la, lb = torch.stack(rows_a), torch.stack(rows_b)
    assert (la - lb).abs().max().item() <= 1e-4

    transformers = pytest.importorskip("transformers")
    ref = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ref.eval()
    seq = prompt + toks_a
    with torch.inference_mode():
        lt = ref(torch.tensor([seq])).logits[0, len(prompt) - 1:-1].float()
    assert lt.shape == la.shape
    assert (la - lt).abs().max().item() <= 1e-4
    assert (lb - lt).abs().max().item() <= 1e-4


def test_wrong_permutation_is_detected(converted, tmp_path):
    """Without the wq/wk permutation the first tokens can still agree; 40+ tokens expose it."""
    src, out = converted
    from safetensors.torch import load_file, save_file
    st = load_file(str(out / "model.safetensors"))
    canon = src.model.export_weights()
    for i in range(src.args.n_layers):
        st[f"model.layers.{i}.self_attn.q_proj.weight"] = canon[f"layers.{i}.attention.wq.weight"]
        st[f"model.layers.{i}.self_attn.k_proj.weight"] = canon[f"layers.{i}.attention.wk.weight"]
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("config.json", "tokenizer.json"):
        (bad / f).write_bytes((out / f).read_bytes())
    save_file(st, str(bad / "model.safetensors"))
    prompt = src.tokenizer.encode("Once upon a time")
    good, _ = Harness(src.model).greedy(0, prompt, 48)
    wrong, _ = Harness(load_hf_dir(bad).model).greedy(0, prompt, 48)
    assert wrong != good


def test_round_trip_through_int8_mode(converted, tmp_path):
    """Converting while the model is in int8 writes the full-precision weights."""
    src, out = converted
    src.model.set_precision("int8")
    try:
        again = save_hf_dir(src, tmp_path / "again")
    finally:
        src.model.set_precision("full")
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
