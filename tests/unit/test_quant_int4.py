"""int4 weights (engine/quant_int4.py): GGUF Q4_0/Q4_1 blocks re-packed for torch's CPU int4
kernel, the int4 precision mode of the model, and the controller leaving an int4 engine alone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from inferctl.controller.policies import PrecisionPolicy
from inferctl.engine.quant_int4 import int4_from_gguf, int4_matmul, int4_weight_nbytes, quantize_int4
from tests.policy_helpers import actions, engine, oom

gguf = pytest.importorskip("gguf")
SMOL = Path("/work/shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
#: bf16 has 8 significant bits: each of d and m + 8d rounds by ≤ 2^-9 relative, so a weight
#: (q - 8)·d + z is off by ≤ 2^-9 (8|d| + |z|) ≤ 2^-7 · max|W| (documented in quant_int4).
REL = 2.0 ** -7


def _check(raw_like, w_ref: np.ndarray) -> None:
    w4 = int4_from_gguf([raw_like])
    wk = w4.dequantize().numpy()
    assert wk.shape == w_ref.shape
    assert np.abs(wk - w_ref).max() <= REL * np.abs(w_ref).max()
    x = torch.randn(3, w_ref.shape[1], generator=torch.Generator().manual_seed(0))
    ref = x @ torch.from_numpy(w_ref).t()
    y = int4_matmul(x, w4)
    assert y.dtype == torch.float32 and y.shape == ref.shape
    assert (y - ref).abs().max() <= 0.01 * ref.abs().max()


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_random_q4_blocks_match_gguf_dequantize(qtype):
    w = np.random.default_rng(1).standard_normal((40, 96)).astype(np.float32)  # N = 40 is padded to 48
    t = gguf.GGMLQuantizationType[qtype]
    data = gguf.quants.quantize(w, t)
    _check(SimpleNamespace(ggml_type=qtype, data=data, shape=w.shape), gguf.quants.dequantize(data, t))


@pytest.mark.skipif(not SMOL.is_file(), reason="SmolLM2 GGUF not present")
def test_real_smollm2_q4_1_tensors():
    from inferctl.engine.gguf import dequantize, iter_raw_tensors

    raws = [r for r in iter_raw_tensors(SMOL) if r.ggml_type == "Q4_1" and r.name.startswith(("blk.0.", "blk.29."))]
    assert len(raws) == 14
    for r in raws[:4] + raws[-3:]:
        _check(r, dequantize(r).numpy())


def test_quantize_float_weight_group32():
    w = torch.randn(20, 70, generator=torch.Generator().manual_seed(2))  # K padded to 96, N to 32
    q = quantize_int4(w)
    err = (q.dequantize() - w).abs()
    # half a step (max - min)/30 per group, plus bf16 rounding of the scales
    assert err.max() <= (w.max() - w.min()) / 30 * 1.05
    assert q.nbytes() == int4_weight_nbytes(20, 70) == 32 * 96 // 2 + 3 * 32 * 4


def test_model_int4_mode_bytes_and_no_way_back():
    from inferctl.engine.loader import build_demo_model

    m = build_demo_model().model
    ids, by_mode = torch.tensor([5, 9, 200]), m.weight_bytes_by_mode()
    m.set_precision("int4")
    assert m.precision == "int4" and m.weight_bytes() == by_mode["int4"] < by_mode["int8"]
    assert m.host_backup_bytes() == 0
    assert m.embed(ids).shape == (3, 64)
    with pytest.raises(ValueError, match="int4"):
        m.set_precision("full")
    with pytest.raises(ValueError, match="int4"):
        m.export_weights()


def test_precision_policy_never_degrades_an_int4_engine():
    p = PrecisionPolicy({"hold_seconds": 60.0})
    assert actions(p.observe(5.0, engine(5.0, precision="int4", faults=[oom(1, 5.0)]))) == []
    p = PrecisionPolicy({"hold_seconds": 60.0})   # the same fault on a full engine degrades
    assert "degrade" in actions(p.observe(5.0, engine(5.0, faults=[oom(1, 5.0)])))


def test_plan_int4_note_matches_the_engine_accounting():
    from inferctl.tools.plan import compute_plan, read_model

    if not SMOL.is_file():
        pytest.skip("SmolLM2 GGUF not present")
    p = compute_plan(read_model(str(SMOL)), "int4", 256)
    [note] = [n for n in p.notes if "int4 holds" in n]
    # the engine's /stats weights_bytes for this file in int4 with its CPU kernels (LlamaModel.weight_bytes()
    # after set_precision("int4") = weight_bytes_by_mode()["int4"], measured 2026-12-02: layer linears
    # Q4_1, the tied classifier int8 per row)
    assert "95,102,208 bytes" in note
