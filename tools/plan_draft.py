"""``inferctl plan --speculative-config JSON``: the memory a speculative draft model adds to a plan.

The engine keeps a draft model's weights and a KV pool of its own beside the target's
(``engine/memory_plan.py``, accountant tags ``draft_weights`` and ``draft_kv_cache``); the pool
has as many blocks as the target's (the two share block tables, docs/speculative-decoding.md),
so at a given context and concurrency it holds the same number of tokens. What the planner adds
(bytes):

* ``ngram`` (prompt lookup): no second model, nothing added.
* ``int8_self``: the target's own weights quantized to int8 per output channel
  (``engine.spec_decode.proposers.build_int8_self_draft``): 1 byte a weight, the inner dimension
  padded to ``engine.quant.K_ALIGN``, + 4 bytes (float32 scale) + 2 bytes (bf16 unit scale) per
  output row (``engine.quant.int8_weight_nbytes``; ``LlamaModel.weight_bytes_by_mode()["int8"]``),
  the norms at the activation width; its KV cache is the target's twin (same dimensions and
  dtype), so per token it equals the target's.
* ``draft_model``: the draft checkpoint's dimensions (read like ``--model``); the engine loads it
  in the target's dtype, so its weights are its params × the plan's bits / 8 (as stored for a
  GGUF when the plan is "stored"), and its KV per token is 2 × its layers × KV heads × head dim
  × the KV element. Its vocabulary must be the target's (the engine refuses another).

The draft's forwards run before the target's, never at once, so the engine keeps one activation
headroom for both: the plan's activation term becomes the worse of the two models' worst steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from inferctl.contract.speculative import (METHOD_DRAFT_MODEL, METHOD_INT8_SELF, SpeculativeConfigError,
                                           parse_speculative_config)

__all__ = ["DraftError", "DraftFigures", "draft_figures", "parse_flag"]

FLAG = "--speculative-config"


class DraftError(ValueError):
    """A bad ``--speculative-config`` or draft model (``tools/plan_compute.py`` reports it as its
    ``PlanError`` naming :data:`FLAG`; this module imports nothing of the planner's)."""


@dataclass
class DraftFigures:
    """A draft model's share of a plan (bytes; None = not computable from what was given)."""

    method: str
    name: str
    weights_bytes: int | None
    kv_bytes_per_token: int | None
    kv_bytes: int | None
    worst_step_bytes: int | None


def parse_flag(text: str | None):
    """The flag's JSON → a ``SpeculativeConfig`` or None (empty / absent).

    Raises:
        DraftError: the contract's message, naming the key and limit.
    """
    try:
        return parse_speculative_config(text)
    except SpeculativeConfigError as exc:
        raise DraftError(str(exc)) from None


def _int8_weights(d, act_bytes: int) -> int | None:
    """``LlamaModel.weight_bytes_by_mode()["int8"]`` for dims ``d`` (None when one is missing)."""
    if None in (d.layers, d.hidden, d.heads, d.kv_heads, d.head_dim, d.intermediate, d.vocab):
        return None
    from inferctl.engine.quant import int8_weight_nbytes

    mats = [(d.vocab, d.hidden)] * (1 if d.tied is not False else 2)
    qkv_out = (d.heads + 2 * d.kv_heads) * d.head_dim
    mats += [(qkv_out, d.hidden), (d.hidden, d.heads * d.head_dim), (2 * d.intermediate, d.hidden),
             (d.hidden, d.intermediate)] * d.layers
    return (2 * d.layers + 1) * d.hidden * act_bytes + sum(int8_weight_nbytes(o, i) for o, i in mats)


def draft_figures(spec, target, bits: int | None, kv_elem_bytes: int, target_kv_per_token: int | None,
                  context: int, concurrency: int, act_bytes: int, notes: list[str], *,
                  read_model: Callable[[str], Any], worst_step: Callable[[Any], int | None]) -> DraftFigures | None:
    """The draft's figures for ``spec`` (a ``SpeculativeConfig``) beside ``target`` (``ModelDims``)
    at the plan's weight ``bits`` (None: "as stored"); appends to ``notes``. ``read_model`` reads
    a draft checkpoint's ``ModelDims``, ``worst_step(dims)`` is the engine's worst activation
    step for a model (the planner's). None for no speculation or ``ngram``.

    Raises:
        DraftError: the draft model cannot be read or its vocabulary differs from the target's.
    """
    if spec is None:
        return None
    if spec.method not in (METHOD_INT8_SELF, METHOD_DRAFT_MODEL):
        notes.append(f"speculative decoding ({spec.method}): no draft model, nothing added to memory")
        return None
    if spec.method == METHOD_INT8_SELF:
        draft, name = target, f"int8 copy of {target.name}"
        weights = _int8_weights(target, act_bytes)
        kv_tok = target_kv_per_token
    else:
        try:
            draft = read_model(spec.model)
        except ValueError as exc:
            raise DraftError(f"speculative_config.model: {getattr(exc, 'message', exc)}") from None
        if None not in (draft.vocab, target.vocab) and draft.vocab != target.vocab:
            raise DraftError(f"speculative_config.model: the draft's vocabulary ({draft.vocab} tokens) differs "
                             f"from the target's ({target.vocab}): the two must share a tokenizer")
        name = draft.name
        if bits is None:
            weights = draft.stored_bytes if draft.stored_bytes is not None else draft.params * 2
        else:
            weights = draft.params * bits // 8
        kv_tok = (2 * draft.layers * draft.kv_heads * draft.head_dim * kv_elem_bytes
                  if None not in (draft.layers, draft.kv_heads, draft.head_dim) else None)
    if weights is None:
        notes.append("speculative draft weights: no data (int8_self needs every dimension, or a --model)")
    worst = worst_step(draft)
    notes.append(f"speculative decoding ({spec.method}, {spec.num_speculative_tokens} tokens): the draft "
                 f"({name}) keeps its own weights and a KV pool of as many blocks as the target's")
    return DraftFigures(spec.method, name, weights, kv_tok, None if kv_tok is None else kv_tok * context * concurrency,
                        worst)


def as_dict(f: DraftFigures | None) -> dict[str, Any] | None:
    """The figures as a plain dict for ``--json`` (None without a draft)."""
    from dataclasses import asdict

    return None if f is None else asdict(f)
