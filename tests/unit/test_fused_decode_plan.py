"""engine.fused_decode's cached plan: the op's weight lists are built once and rebuilt only after a
``Linear`` weight was replaced (``engine.model.Linear`` calls ``fused_decode.weights_changed``), so a
stale plan after a precision switch (either way), the int4 start or a single linear's quantize/restore
would hand the op tensors the model no longer computes with. Also the per-batch-size flags cached for
``decode_layers`` (``torch_mm_mask``, ``head_mm``) against ``cpu_kernels.f32_kernel_wins``."""

from __future__ import annotations

import pytest
import torch

from inferctl.engine import cpu_kernels, fused_decode, onednn
from inferctl.engine.attention import AttentionMetadata
from inferctl.engine.model import LlamaModel, ModelArgs, canonical_weight_names
from tests.model_helpers import Harness

OPS = cpu_kernels.ops_for("cpu", torch.float32)
pytestmark = pytest.mark.skipif(OPS is None, reason="CPU kernels did not build here (no compiler/ninja)")


def _model(tied: bool = True) -> LlamaModel:
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, hidden_dim=96,
                     max_seq_len=256, tie_embeddings=tied)
    g = torch.Generator().manual_seed(7)
    return LlamaModel(args, {n: torch.randn(s, generator=g) * 0.3 for n, s in canonical_weight_names(args).items()})


def _current(model: LlamaModel) -> list[torch.Tensor]:
    """What the op must receive now: each layer linear's float32 weight, int8 qweight or Q4_1 blocks."""
    lins = [lin for blk in model.layers for lin in (blk.wqkv, blk.wo, blk.w13, blk.w2)]
    return [lin.weight if lin.q is None else (lin.q.blocks if hasattr(lin.q, "blocks") else lin.q.qweight)
            for lin in lins]


def _plan(model: LlamaModel):
    h = Harness(model, block_size=4)
    meta = AttentionMetadata.build([([0, 1], 5, 1, False)], 4)
    meta.prepare(4)
    return fused_decode.layer_weights(model, h.cache, meta, 1), fused_decode.head_tensors(model)


def _assert_fresh(model: LlamaModel) -> None:
    lists, head = _plan(model)
    assert lists is not None
    assert all(a is b for a, b in zip(lists[2], _current(model), strict=True))
    out = model.output
    assert head is not None and head[1] is (out.weight if out.q is None else out.q.qweight)


def test_plan_follows_every_precision_switch():
    model = _model()
    _assert_fresh(model)
    for mode in ("int8", "int8", "full", "int8", "full"):
        model.set_precision(mode)
        _assert_fresh(model)


def test_plan_follows_a_single_linear_replaced_outside_set_precision():
    model = _model(tied=False)
    _assert_fresh(model)
    full = model.layers[1].w2.quantize_()
    _assert_fresh(model)
    model.layers[1].w2.restore_(full)
    _assert_fresh(model)
    model.layers[0].wo.weight_t = model.layers[0].wo.weight_t.clone()
    _assert_fresh(model)


def test_int4_start_drops_the_stale_fp32_plan():
    """The int4 start (``lin.q = …`` in engine.quant_int4) replaces every linear: the op must get the
    Q4_1 blocks (or the model its per-op path), never the fp32 lists cached before it."""
    model = _model()
    _assert_fresh(model)
    model.set_precision("int4")
    lists, _ = _plan(model)
    assert lists is None or all(a is b for a, b in zip(lists[2], _current(model), strict=True))
    assert all(lin.q is not None for blk in model.layers for lin in (blk.wqkv, blk.w2))


def test_plan_is_not_rebuilt_without_a_change():
    model = _model()
    _plan(model)
    plan = model.__dict__["_fused_decode_plan"]
    _plan(model)
    assert model.__dict__["_fused_decode_plan"] is plan


@pytest.mark.parametrize("nthreads", [1, 2])
def test_cached_flags_equal_the_predicate(monkeypatch, nthreads):
    """decode_layers passes torch_mm_mask / head_mm from a per-(batch, threads) cache: the values
    f32_kernel_wins gives at that batch size and thread count."""
    model = _model()
    seen = []
    monkeypatch.setattr(model, "kernel_ops", type("Ops", (), {
        "decode_layers": staticmethod(lambda *a: seen.append((a[17], a[21])) or a[0])})())
    lists, head = _plan(model)
    old = torch.get_num_threads()
    torch.set_num_threads(nthreads)
    try:
        for B in (1, onednn.GEMV_MAX_ROWS, onednn.GEMV_MAX_ROWS + 1, cpu_kernels.MAX_BATCH, cpu_kernels.MAX_BATCH + 1,
                  cpu_kernels.MAX_BATCH_MT + 1) * 2:
            meta = AttentionMetadata.build([([i], 0, 1, False) for i in range(B)], 4)
            x = torch.zeros(B, 64)
            fused_decode.decode_layers(model, lists, x, x, x, Harness(model, block_size=4).cache, meta, head)
            w = head[1]
            mask = 0
            for j, lw in enumerate(lists[2][:4]):    # each layer linear by its own size (f32 here)
                if not cpu_kernels.f32_kernel_wins(B, lw.numel() * 4):
                    mask |= 1 << j | (onednn.wins(B, lw.numel()) << (j + fused_decode.ONEDNN_SHIFT))
            head_mm = not cpu_kernels.f32_kernel_wins(B, w.numel() * w.element_size())
            if head_mm and onednn.wins(B, w.numel()):
                mask |= fused_decode.HEAD_ONEDNN_BIT
            assert seen[-1] == (mask, head_mm)
    finally:
        torch.set_num_threads(old)
