"""The benchmark models, as Hugging Face directories that both the engine and transformers load.

* ``stories260K``: the real llama2.c checkpoint converted with ``engine.loader.save_hf_dir``.
* ``synthetic-100MB``: a Llama with the shape of docs/performance.md's 99.5 MB model (hidden 384, 8 layers, 6 heads /
  2 KV heads, FFN 1024, vocab 32000, tied embeddings: 24.9 M parameters, 99.5 MB in fp32)
  and random weights: transformers' own initialisation (normal, std ``initializer_range``
  0.02) under ``torch.manual_seed(seed)``; a word-level ``tokenizer.json`` with SentencePiece
  style pieces (the ids are what the benchmarks use; the text is never read).

Generated weights live in a cache directory outside git: ``$INFERCTL_BENCH_CACHE``, else
``$XDG_CACHE_HOME/inferctl/bench``, else ``~/.cache/inferctl/bench``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.common import STORIES_BIN

SYNTHETIC = dict(hidden_size=384, num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2,
                 intermediate_size=1024, vocab_size=32000, tie_word_embeddings=True,
                 max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0)


def cache_dir() -> Path:
    """Where generated models are kept (see the module doc)."""
    env = os.environ.get("INFERCTL_BENCH_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferctl" / "bench"


def stories_hf_dir(cache: Path | None = None) -> Path:
    """stories260K converted to a Hugging Face directory (made once)."""
    from inferctl.engine.loader import load_llama2c, save_hf_dir

    out = (cache or cache_dir()) / "stories260K-hf"
    if not (out / "model.safetensors").exists():
        save_hf_dir(load_llama2c(STORIES_BIN), out)
    return out


def _wordlevel_tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    i = 0
    while len(vocab) < vocab_size:
        vocab[f"\u2581w{i}"] = len(vocab)
        i += 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    return tok.to_str()


def synthetic_hf_dir(seed: int = 0, cache: Path | None = None, **overrides: int) -> Path:
    """The synthetic Llama (module doc) as a Hugging Face directory, made once per shape/seed.

    ``overrides`` change the shape (e.g. a tiny one for tests); the directory name encodes it.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {**SYNTHETIC, **overrides}
    tag = "synthetic" if not overrides else "synthetic-" + "-".join(f"{k}{v}" for k, v in sorted(overrides.items()))
    out = (cache or cache_dir()) / f"{tag}-seed{seed}"
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    torch.manual_seed(seed)
    cfg = LlamaConfig(**shape, head_dim=shape["hidden_size"] // shape["num_attention_heads"],
                      bos_token_id=1, eos_token_id=2, hidden_act="silu", attention_bias=False,
                      mlp_bias=False, torch_dtype="float32")
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.json").write_text(_wordlevel_tokenizer_json(shape["vocab_size"]), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
         "tokenizer_class": "PreTrainedTokenizerFast"}), encoding="utf-8")
    # save_pretrained may write "rope_parameters" instead of rope_theta; the engine reads both.
    return out


def model_dir(name: str, cache: Path | None = None) -> Path:
    """``stories260K`` | ``synthetic`` | ``synthetic-tiny`` (a 2-layer toy for smoke tests).

    Raises ValueError for another name.
    """
    if name == "stories260K":
        return stories_hf_dir(cache)
    if name == "synthetic":
        return synthetic_hf_dir(cache=cache)
    if name == "synthetic-tiny":
        return synthetic_hf_dir(cache=cache, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, intermediate_size=128, vocab_size=1000)
    raise ValueError(f"model must be stories260K, synthetic or synthetic-tiny, got {name!r}")
