"""Decode steps in one C++ call for all decoder layers (``torch.ops.inferctl_cpu.decode_layers``).

At batch 1 a small model's step was ~900 small torch ops (per layer: norm, QKV GEMV, RoPE, KV
write, gather/bmm/softmax/bmm, output projection, residual, norm, gate/up, SiLU·up, down, residual),
so per-op overhead, not arithmetic, set its speed (docs/performance.md). ``csrc/decode_step.cpp``
runs every layer of such a step in one op: the same formulas in float32 (see that file), K/V read
in place from the paged pool through each sequence's block table, the GEMVs through the
extension's own ``gemv_f32``/``gemv_int8``/``q4_matmul`` kernels (an fp32 linear takes a GEMM —
oneDNN's where engine.onednn says so (:func:`mm_mask`), else torch's MKL — called from inside
the op, where ``cpu_kernels.f32_kernel_wins`` says so for the batch: the op's ``torch_mm_mask``),
threads only through ``at::parallel_for`` and torch's own pool.

:func:`layer_weights` is the one predicate: it returns the op's weight lists for a step the fused
path can run, else None (the model then takes its per-op path unchanged). Eligible: the engine's
CPU kernels built (``INFERCTL_CPU_KERNELS`` not off) and exporting ``decode_layers``; float32
model on CPU; a float32 KV pool (not int8); a decode-only step (every sequence one new token, one
logit row each) of at most ``cpu_kernels.MAX_DECODE_BATCH`` (64) sequences; every layer linear either float32
in the ``[out, in]`` layout, int8 per-channel (``Linear.q`` an ``Int8Weight``) or GGUF Q4_1 blocks run
by the kernels (a ``Q4Weight``, engine.q4_kernels; torch's int4 layout ``Int4Weight`` is not).

The model's output head (final RMSNorm + classifier) runs in the same call when the classifier is
stored like the layer linears (:func:`head_tensors`; wave 7): the op then returns the logits, so the
step's largest GEMV (half the weights of the 99.5 MB model) shares the kernels and threads.

The step's token ids and positions go into the op too (:func:`decode_tokens`, ``decode_tokens`` in
C++; wave 9): it reads each token's embedding row (:func:`embed_tensors`: the float32 table or tied
classifier in either layout, or the int8 rows and their scales, the values ``LlamaModel.embed``
computes) and the RoPE rows of each position (``LlamaModel.rope_table``) itself, instead of the
step running ``embed`` and ``rope_at``'s two ``index_select`` first (~25-30 µs of a ~250 µs batch-1
step of stories260K, docs/performance.md). A caller's ``inputs_embeds`` keeps :func:`decode_layers`.

Numerics: the same math as the per-op path with a different summation order (8-lane partial
sums in the dot products and GEMVs); tests/unit/test_fused_decode.py bounds the logits' difference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from inferctl.engine import cpu_kernels, onednn
from inferctl.engine.q4_kernels import Q4Weight
from inferctl.engine.quant import Int8Weight

if TYPE_CHECKING:
    from inferctl.engine.attention import AttentionMetadata, KVCache

#: ``torch_mm_mask``: bit j + ONEDNN_SHIFT makes layer linear j's GEMM (bit j) oneDNN's (engine.onednn)
#: instead of torch's default ``mm`` (MKL); HEAD_ONEDNN_BIT the same for the head's (``head_mm``)
ONEDNN_SHIFT = 4
HEAD_ONEDNN_BIT = 1 << 8
#: ``rope_style`` → the op's integer code
ROPE_CODES = {"interleaved": 0, "half": 1}

#: bumped by :func:`weights_changed`; a model's cached plan (:func:`layer_weights`) built at an older
#: value is rebuilt
_generation = [0]


def weights_changed() -> None:
    """Invalidate every model's cached fused-decode plan: called by ``engine.model.Linear`` whenever
    its ``weight`` or ``q`` attribute is assigned (quantize, restore, int4 start, construction)."""
    _generation[0] += 1


def _linear_tensors(lin: Any, no_scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(weight, scales) the op takes for one ``engine.model.Linear`` (``no_scales``, an empty
    tensor, for a float32 weight), or None when it cannot."""
    q = lin.q
    if q is None:
        w = lin.weight
        if getattr(lin, "layout", None) != "out_in" or w is None or w.dtype != torch.float32 or not w.is_contiguous():
            return None
        return w, no_scales
    if type(q) is Q4Weight:
        ok = q.ops is not None and q.blocks.device.type == "cpu" and q.blocks.is_contiguous()
        return (q.blocks, no_scales) if ok else None
    if type(q) is not Int8Weight or q.qweight.device.type != "cpu" or not q.qweight.is_contiguous():
        return None
    return q.qweight, q.scales


def layer_weights(model: Any, kv_cache: "KVCache", meta: "AttentionMetadata",
                  num_tokens: int) -> tuple[list[torch.Tensor], ...] | None:
    """``(attn_norm, ffn_norm, weights, scales)`` lists for :func:`decode_layers` when this step
    can run fused (see the module docstring), else None. ``model``: an engine.model.LlamaModel
    (typed Any: model.py imports this module, and the import graph stays without a circle).
    ``meta`` must be prepared. The lists are built once and cached on the model until
    :func:`weights_changed` runs (any Linear weight replaced)."""
    ops = model.kernel_ops
    if (ops is None or not meta.all_decode or num_tokens != meta.num_seqs or num_tokens > cpu_kernels.MAX_DECODE_BATCH
            or meta.logits_indices.shape[0] != num_tokens or kv_cache.kv_int8 or kv_cache.k.dtype != torch.float32
            or not (kv_cache.k.is_contiguous() and kv_cache.v.is_contiguous())
            or model.dtype != torch.float32 or model.device.type != "cpu" or not hasattr(ops, "decode_layers")):
        return None
    # the lists are cached on the model and rebuilt when any Linear's ``weight`` or ``q`` was assigned
    # since (engine.model.Linear calls weights_changed: a precision switch both ways, the int4 start,
    # a new Linear); checking 21 linears' weight identities every step cost ~13 µs
    plan = model.__dict__.get("_fused_decode_plan")
    if plan is None or plan[0] != _generation[0]:
        lins = [lin for blk in model.layers for lin in (blk.wqkv, blk.wo, blk.w13, blk.w2)]
        lists = _build_lists(model, lins)
        head = _linear_tensors(model.output, torch.empty(0, dtype=torch.float32))
        plan = model.__dict__["_fused_decode_plan"] = [
            _generation[0], lists, None if head is None or lists is None else (model.norm, *head), {},
            _embed_source(model)]
    return plan[1]


def embed_tensors(model: Any) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(table, scales)`` for :func:`decode_tokens`: the model's embedding rows as a [vocab, dim] float32
    tensor of any strides (the untied table, or the tied classifier in its "out_in" layout or the
    transposed view of its "in_out" one) with ``scales`` None, or int8 rows [vocab, >= dim] with their
    float32 scales [vocab] (the untied int8 table or the tied int8 classifier: row × scale is what
    ``LlamaModel.embed`` returns); None when the rows are stored otherwise (torch's int4 layout, another
    dtype). Valid right after :func:`layer_weights` returned lists for this model (the same cached plan)."""
    plan = model.__dict__.get("_fused_decode_plan")
    return None if plan is None else plan[4]


def _embed_source(model: Any) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    if model.tok_embeddings is not None:
        t = model.tok_embeddings
        return (t, None) if t.dtype == torch.float32 and t.device.type == "cpu" else None
    q = model.tok_embeddings_q if model.tok_embeddings_q is not None else model.output.q
    if q is not None:
        ok = type(q) is Int8Weight and q.qweight.device.type == "cpu" and q.qweight.is_contiguous()
        return (q.qweight, q.scales) if ok else None
    w = model.output.weight
    if w is None or w.dtype != torch.float32 or w.device.type != "cpu":
        return None
    return (w, None) if model.output.layout == "out_in" else (w.t(), None)


def head_tensors(model: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(final norm [dim], classifier weight, scales)`` for :func:`decode_layers`' ``head`` when the
    output layer can run inside the op (float32 in the ``[out, in]`` layout, int8 per channel or Q4_1
    blocks, like the layer linears), else None (the model then runs it itself). Valid right after
    :func:`layer_weights` returned lists for this model (the same cached plan)."""
    plan = model.__dict__.get("_fused_decode_plan")
    return None if plan is None else plan[2]


def _build_lists(model: Any, lins: list[Any]) -> tuple[list[torch.Tensor], ...] | None:
    weights: list[torch.Tensor] = []
    scales: list[torch.Tensor] = []
    no_scales = torch.empty(0, dtype=torch.float32)
    for lin in lins:
        pair = _linear_tensors(lin, no_scales)
        if pair is None:
            return None
        weights.append(pair[0])
        scales.append(pair[1])
    return ([blk.attention_norm for blk in model.layers], [blk.ffn_norm for blk in model.layers], weights, scales)


def decode_layers(model: Any, lists: tuple[list[torch.Tensor], ...], x: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, kv_cache: "KVCache", meta: "AttentionMetadata",
                  head: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                  greedy_out: torch.Tensor | None = None) -> torch.Tensor:
    """All decoder layers of one decode step: ``x`` [B, dim] float32 → [B, dim] (before the final
    norm), or with ``head`` (:func:`head_tensors`) the logits [B, vocab] float32 (final RMSNorm and
    classifier in the same call); writes each token's K/V into ``kv_cache`` at ``meta.slot_mapping``.
    ``cos``/``sin`` [B, 1, head_dim]: the model's RoPE table rows (``LlamaModel.rope_at``). ``lists``:
    what :func:`layer_weights` returned. ``meta``'s ``slot_mapping``/``block_tables``/``seq_lens`` are
    passed as they are (contiguous int64, as ``AttentionMetadata.build`` makes them). ``greedy_out``
    (float64 [2B], contiguous; only with ``head``): the op also writes each logits row's greedy pick into
    it, ``[token 0, logprob 0, token 1, ...]``, the values ``greedy_logprobs`` returns for those logits (the
    same C++ code; one op call instead of two in a greedy decode step, issue 12 wave 10). Raises
    RuntimeError (from the op) on inconsistent input, a non-contiguous metadata field included, and on a
    ``greedy_out`` of another size or dtype or without ``head``."""
    a = model.args
    attn_norm, ffn_norm, weights, scales = lists
    norm, out_w, out_s = head if head is not None else (None, None, None)
    flags = _mm_flags(model, x.shape[0], weights[:4], out_w)
    # the metadata's contract fields are views of one contiguous int64 buffer (AttentionMetadata.build),
    # so only x (an embedding or a caller's inputs_embeds) may need a copy; the op checks every input
    return model.kernel_ops.decode_layers(
        x if x.is_contiguous() else x.contiguous(), cos, sin, kv_cache.k, kv_cache.v, meta.slot_mapping,
        meta.block_tables, meta.seq_lens,
        attn_norm, ffn_norm, weights, scales, a.n_heads, a.n_kv_heads, ROPE_CODES[a.rope_style], a.norm_eps,
        model.scale, flags[0], norm, out_w, out_s, flags[1], greedy_out)


def decode_tokens(model: Any, lists: tuple[list[torch.Tensor], ...], input_ids: torch.Tensor,
                  positions: torch.Tensor, emb: tuple[torch.Tensor, torch.Tensor | None],
                  rope: tuple[torch.Tensor, torch.Tensor], kv_cache: "KVCache", meta: "AttentionMetadata",
                  head: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                  greedy_out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`decode_layers` from the step's ``input_ids`` and ``positions`` ([B] int64, contiguous) instead
    of their embeddings and RoPE rows: the op reads row ``input_ids[b]`` of ``emb`` (:func:`embed_tensors`)
    and rows ``positions[b]`` of ``rope`` (``LlamaModel.rope_table``: cos/sin [n, 1, head_dim] covering
    every position of the step) itself. Same result as :func:`decode_layers` over ``LlamaModel.embed``
    and ``LlamaModel.rope_at`` of the same ids and positions, bit for bit (the same row values reach the
    same core). Raises IndexError (from the op) for a token id outside the table or a position outside
    the RoPE table, RuntimeError on other inconsistent input. ``greedy_out``: as :func:`decode_layers`."""
    a = model.args
    attn_norm, ffn_norm, weights, scales = lists
    norm, out_w, out_s = head if head is not None else (None, None, None)
    flags = _mm_flags(model, input_ids.shape[0], weights[:4], out_w)
    return model.kernel_ops.decode_tokens(
        input_ids, positions, emb[0], emb[1], rope[0], rope[1], kv_cache.k, kv_cache.v, meta.slot_mapping,
        meta.block_tables, meta.seq_lens,
        attn_norm, ffn_norm, weights, scales, a.n_heads, a.n_kv_heads, ROPE_CODES[a.rope_style], a.norm_eps,
        model.scale, flags[0], norm, out_w, out_s, flags[1], greedy_out)


def mm_mask(B: int, layer0: list[torch.Tensor], out_w: torch.Tensor | None) -> tuple[int, bool]:
    """(torch_mm_mask, head_mm) for a batch of ``B`` with layer 0's four linears ``layer0`` (every layer
    has their shapes) and the classifier ``out_w``: bit j (j = 0 wqkv, 1 wo, 2 w13, 3 w2) when linear j
    is float32 and ``cpu_kernels.f32_kernel_wins`` says a GEMM for it, bit j + :data:`ONEDNN_SHIFT`
    when that GEMM is oneDNN's (``onednn.wins``), :data:`HEAD_ONEDNN_BIT` the same for the head's GEMM
    (``head_mm``)."""
    mask = 0
    for j, w in enumerate(layer0):
        if w.dtype == torch.float32 and not cpu_kernels.f32_kernel_wins(B, w.numel() * 4):
            mask |= 1 << j
            if onednn.wins(B, w.numel()):
                mask |= 1 << (j + ONEDNN_SHIFT)
    head_mm = (out_w is not None and out_w.dtype == torch.float32
               and not cpu_kernels.f32_kernel_wins(B, out_w.numel() * 4))
    if head_mm and onednn.wins(B, out_w.numel()):
        mask |= HEAD_ONEDNN_BIT
    return mask, head_mm


def _mm_flags(model: Any, B: int, layer0: list[torch.Tensor], out_w: torch.Tensor | None) -> tuple[int, bool]:
    """:func:`mm_mask`, kept in the plan (its weights fixed) and keyed by the thread count too
    (f32_kernel_wins reads it)."""
    cache = model.__dict__.get("_fused_decode_plan", (None,) * 4)[3]
    key = (B, torch.get_num_threads(), out_w is not None)
    flags = None if cache is None else cache.get(key)
    if flags is None:
        flags = mm_mask(B, layer0, out_w)
        if cache is not None:
            cache[key] = flags
    return flags
