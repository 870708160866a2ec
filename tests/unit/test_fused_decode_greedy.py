"""The fused decode op's ``greedy_out`` (issue 12, wave 10): with the output head in the op, the op also
writes each logits row's greedy pick (token, logprob) into a caller's float64 [2B] buffer, the values
``greedy_logprobs`` returns for the same logits (tests/unit/test_sampler_greedy_op.py pins those against
torch.argmax and torch.log_softmax), and the logits it returns are unchanged bit for bit."""

from __future__ import annotations

import pytest
import torch

from inferctl.engine import cpu_kernels, fused_decode
from inferctl.engine.attention import AttentionMetadata
from tests.model_helpers import Harness
from tests.unit.test_fused_decode import _VARIANTS, three_decode_rows

OPS = cpu_kernels.ops_for("cpu", torch.float32)
needs_ops = pytest.mark.skipif(OPS is None, reason="CPU kernels did not build here (no compiler/ninja)")
WITH_HEAD = [v for v in _VARIANTS if not v.endswith("in_out")]


def _setup(variant: str):
    model, h, meta, lists = three_decode_rows(variant)
    a = model.args
    rest = (meta.slot_mapping, meta.block_tables, meta.seq_lens, *lists, a.n_heads, a.n_kv_heads,
            fused_decode.ROPE_CODES[a.rope_style], a.norm_eps, model.scale, 0)
    return model, h, rest, fused_decode.head_tensors(model)


@needs_ops
@pytest.mark.parametrize("variant", WITH_HEAD)
@pytest.mark.parametrize("entry", ["decode_tokens", "decode_layers"])
def test_greedy_out_is_greedy_logprobs_of_the_same_logits(variant, entry):
    model, h, rest, head = _setup(variant)
    ids, pos = torch.tensor([96, 0, 41]), torch.tensor([5, 3, 9])
    if entry == "decode_tokens":
        lead = (ids, pos, *fused_decode.embed_tensors(model), *model.rope_table(10, ids.device))
    else:
        lead = (model.embed(ids).contiguous(), *model.rope_at(pos, 10))
    pools = [(h.cache.k.clone(), h.cache.v.clone()) for _ in range(2)]
    plain = getattr(OPS, entry)(*lead, *pools[0], *rest, *head)
    out = torch.full((6,), -7.0, dtype=torch.float64)
    logits = getattr(OPS, entry)(*lead, *pools[1], *rest, *head, False, out)
    assert logits.shape == (3, model.args.vocab_size)
    assert torch.equal(logits, plain)                    # the logits are not changed by the pick
    assert torch.equal(pools[0][0], pools[1][0]) and torch.equal(pools[0][1], pools[1][1])
    assert torch.equal(out, OPS.greedy_logprobs(logits))
    assert out[0::2].tolist() == [float(t) for t in logits.argmax(-1).tolist()]
    assert torch.equal(out[1::2].float(), torch.log_softmax(logits, -1).gather(1, logits.argmax(-1, True))[:, 0])


@needs_ops
def test_greedy_out_bad_input():
    model, h, rest, head = _setup("tied full")
    ids, pos = torch.tensor([96, 0, 41]), torch.tensor([5, 3, 9])
    lead = (ids, pos, *fused_decode.embed_tensors(model), *model.rope_table(10, ids.device))
    for bad in (torch.zeros(4, dtype=torch.float64), torch.zeros(6, dtype=torch.float32),
                torch.zeros(12, dtype=torch.float64)[::2]):
        with pytest.raises(RuntimeError, match="greedy_out must be"):
            OPS.decode_tokens(*lead, h.cache.k, h.cache.v, *rest, *head, False, bad)
    with pytest.raises(RuntimeError, match="greedy_out needs the output head"):
        OPS.decode_tokens(*lead, h.cache.k, h.cache.v, *rest, None, None, None, False, torch.zeros(6).double())


@needs_ops
@pytest.mark.parametrize("variant", ["tied full", "untied int8", "tied full in_out"])
def test_model_forward_fills_greedy_out_only_with_the_head_in_the_op(variant, monkeypatch):
    """LlamaModel.forward passes greedy_out to the op when the op returns the logits; with the head outside
    the op (an "in_out" classifier) or on the per-op path the buffer is left as the caller wrote it."""
    outs = {}
    for fused in (True, False):
        model = _VARIANTS[variant]()
        if "int8" in variant:
            model.set_precision("int8")
        if not fused:
            monkeypatch.setattr(fused_decode, "layer_weights", lambda *a, **k: None)
        h = Harness(model, block_size=4)
        h.step([(0, [1, 50, 60, 70], False)])
        meta = AttentionMetadata.build([(h._ensure(0, 5), 4, 1, False)], 4)
        buf = torch.full((2,), -1.0, dtype=torch.float64)
        with torch.inference_mode():
            logits = model(torch.tensor([80]), torch.tensor([4]), h.cache, meta, greedy_out=buf)
        outs[fused] = (logits, buf)
        monkeypatch.undo()
    logits, buf = outs[True]
    if variant.endswith("in_out"):
        assert buf.tolist() == [-1.0, -1.0]
    else:
        assert torch.equal(buf, OPS.greedy_logprobs(logits))
    assert outs[False][1].tolist() == [-1.0, -1.0]
    assert int(logits.argmax()) == int(outs[False][0].argmax())
