"""Test helpers for GGUF models: the real SmolLM2 file and transformers as the independent reader.

Hugging Face transformers loads the same GGUF file with its own reader and dequantizer
(``from_pretrained(dir, gguf_file=...)``, fp32, needs the ``accelerate`` package) and shares no
code with ``inferctl.engine``; the tests compare against it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SHARED = Path(os.environ.get("INFERCTL_SHARED", Path(__file__).resolve().parents[2] / "shared"))
SMOLLM_DIR = SHARED / "models" / "smollm2-135m-instruct"
SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM_GGUF = SMOLLM_DIR / SMOLLM_FILE

#: Top-2 logit margin under which two implementations may pick different argmaxes (issue 11).
NEAR_TIE = 0.01


def require_smollm() -> Path:
    """The GGUF path, or fail naming where it was looked for."""
    if not SMOLLM_GGUF.is_file():
        pytest.fail(f"SmolLM2 GGUF not found at {SMOLLM_GGUF} (set INFERCTL_SHARED)")
    return SMOLLM_GGUF


def hf_tokenizer():
    """transformers' tokenizer built from the GGUF metadata."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SMOLLM_DIR), gguf_file=SMOLLM_FILE)


def hf_model():
    """transformers' LlamaForCausalLM from the GGUF file, dequantized to fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(SMOLLM_DIR), gguf_file=SMOLLM_FILE, dtype=torch.float32)
    return m.eval()


def hf_greedy(model, prompt_ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """``n`` greedy tokens from transformers (KV-cached forward passes, raw logits) and each
    step's top-2 logit margin."""
    out: list[int] = []
    margins: list[float] = []
    with torch.inference_mode():
        res = model(torch.tensor([prompt_ids]), use_cache=True)
        for _ in range(n):
            logits = res.logits[0, -1].float()
            top = torch.topk(logits, 2).values
            margins.append(float(top[0] - top[1]))
            t = int(logits.argmax())
            out.append(t)
            res = model(torch.tensor([[t]]), past_key_values=res.past_key_values, use_cache=True)
    return out, margins


def first_divergence(ours: list[int], ref: list[int]) -> int:
    """Index of the first token where ``ours`` and ``ref`` differ (``len(ref)`` if none)."""
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            return i
    return len(ref) if len(ours) >= len(ref) else len(ours)
