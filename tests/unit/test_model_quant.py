"""int8 weight-only mode: memory, perplexity, exact rollback; the quantizer and the int8 matmul."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from inferctl.engine.loader import load_llama2c
from inferctl.engine.quant import (K_ALIGN, int8_matmul, int8_weight_nbytes, quantize_kv, dequantize_kv,
                          quantize_per_channel)
from tests.model_helpers import Harness

EVAL = Path(__file__).resolve().parents[1] / "data" / "eval_stories.txt"


@pytest.fixture()
def stories(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin")


def _perplexity(bundle) -> float:
    nll, n = 0.0, 0
    lines = [ln for ln in EVAL.read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert 20 <= len(lines) <= 40
    for ln in lines:
        ids = bundle.tokenizer.encode(ln)
        logits = Harness(bundle.model).step([(0, ids, True)])
        lp = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])
        nll -= lp.sum().item()
        n += len(ids) - 1
    return math.exp(nll / n)


def test_int8_memory_perplexity_and_exact_rollback(stories):
    m = stories.model
    a = stories.args
    full_bytes = m.weight_bytes()
    n_params = sum(t.numel() for t in m.export_weights().values())
    assert full_bytes == 4 * n_params  # tied classifier stored once
    ppl_full = _perplexity(stories)
    prompt = stories.tokenizer.encode("Once upon a time")
    logits_full = Harness(m).step([(0, prompt, True)])

    m.set_precision("int8")
    assert m.precision == "int8"
    int8_bytes = m.weight_bytes()
    # denominator 1: all weight bytes of the model (norms stay fp32)
    assert full_bytes / int8_bytes >= 3.5, (full_bytes, int8_bytes)
    # denominator 2: only the quantized (2-D) parameters
    norm_bytes = 4 * a.dim * (2 * a.n_layers + 1)
    assert (full_bytes - norm_bytes) / (int8_bytes - norm_bytes) >= 3.5
    by_mode = m.weight_bytes_by_mode()
    assert (by_mode["full"], by_mode["int8"]) == (full_bytes, int8_bytes) and by_mode["int4"] < int8_bytes
    assert m.host_backup_bytes() == full_bytes - norm_bytes  # rollback copy, not in weight_bytes
    ppl_int8 = _perplexity(stories)
    assert ppl_int8 != ppl_full
    assert abs(ppl_int8 - ppl_full) / ppl_full <= 0.02, (ppl_full, ppl_int8)
    assert ppl_full < 8.0  # the model really predicts the eval text (uniform would be 512)

    m.set_precision("full")
    assert m.precision == "full" and m.host_backup_bytes() == 0
    assert m.weight_bytes() == full_bytes
    assert torch.equal(Harness(m).step([(0, prompt, True)]), logits_full)


def test_precision_mode_validation(stories):
    with pytest.raises(ValueError, match="precision mode"):
        stories.model.set_precision("fp4")
    stories.model.set_precision("full")  # idempotent
    assert stories.model.precision == "full"


def test_quantize_per_channel_error_and_padding():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 172, generator=g)
    w[3] = 0.0
    q = quantize_per_channel(w)
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == (40, 176) and q.in_features == 172
    assert torch.all(q.qweight[:, 172:] == 0)
    deq = q.dequantize()
    assert torch.all(deq[3] == 0)
    # absmax rounding: error per weight at most half a step of its row's scale
    assert torch.all((deq - w).abs() <= q.scales[:, None] / 2 + 1e-7)
    assert q.qweight.abs().max().item() == 127
    assert q.nbytes() == int8_weight_nbytes(40, 172) == 40 * 176 + 40 * 4 + 40 * 2
    with pytest.raises(ValueError, match="2-D"):
        quantize_per_channel(torch.zeros(3))


@pytest.mark.parametrize("k", [64, 172, 8, 20])
@pytest.mark.parametrize("m", [1, 5])
def test_int8_matmul_kernel_and_fallback_agree(k, m):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(48, k, generator=g)
    x = torch.randn(m, k, generator=g)
    q = quantize_per_channel(w)
    ref = x @ q.dequantize().t()
    y_kernel = int8_matmul(x, q, use_kernel=True)
    y_fallback = int8_matmul(x, q, use_kernel=False)
    assert y_kernel.dtype == torch.float32 and y_kernel.shape == (m, 48)
    scale = ref.abs().max().item()
    assert (y_fallback - ref).abs().max().item() <= 1e-5 * scale
    assert (y_kernel - ref).abs().max().item() <= 1e-2 * scale  # bf16 activations
    with pytest.raises(ValueError, match="features"):
        int8_matmul(torch.zeros(1, k + 1), q)
    assert K_ALIGN == 16


def test_kv_quantization_round_trip():
    x = torch.randn(7, 4, 8)
    q, s = quantize_kv(x)
    assert q.dtype == torch.int8 and s.shape == (7, 4)
    back = dequantize_kv(q, s, torch.float32)
    assert torch.all((back - x).abs() <= s[..., None] / 2 + 1e-7)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dim", [64, 52])   # 52: the int8 rows are padded to 64 columns
def test_int8_embed_equals_the_five_op_form(tied, dim):
    """LlamaModel.embed in int8 (one token: cached numpy views; more: index_select + one multiply)
    is bit-identical to converting the int8 rows to float32 and multiplying by the scales."""
    from inferctl.engine.model import LlamaModel, ModelArgs, canonical_weight_names
    args = ModelArgs(dim=dim, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=97, hidden_dim=96,
                     max_seq_len=64, tie_embeddings=tied)
    g = torch.Generator().manual_seed(5)
    model = LlamaModel(args, {n: torch.randn(s, generator=g) for n, s in canonical_weight_names(args).items()})
    model.set_precision("int8")
    q = model.tok_embeddings_q if not tied else model.output.q
    assert q.qweight.shape[1] == 64
    for ids in ([0], [96], [41], [3, 96, 3, 0], list(range(97))):
        t = torch.tensor(ids)
        ref = q.qweight.index_select(0, t)[:, :dim].to(torch.float32) * q.scales.index_select(0, t)[:, None]
        got = model.embed(t)
        assert got.dtype == torch.float32 and got.shape == (len(ids), dim) and got.is_contiguous()
        assert torch.equal(got, ref)
    for bad in (97, -1):
        with pytest.raises((IndexError, RuntimeError)):
            model.embed(torch.tensor([bad]))
    model.set_precision("full")   # the cached numpy views are dropped (not kept alive in full precision)
    assert "_embed_np" not in model.__dict__
    model.set_precision("int8")
    q = model.tok_embeddings_q if not tied else model.output.q
    assert torch.equal(model.embed(torch.tensor([5])), q.qweight[5:6, :dim].float() * q.scales[5])
