"""``inferctl plan``'s arithmetic: memory and GPUs for a model (:class:`~tools.plan_model.ModelDims`),
a precision, a context and a concurrency (the product notes' §1.1 formula and §5.1 hardware
guide), as a :class:`Plan` (:func:`compute_plan`):

* **weights** = params × bits / 8 at ``--precision`` (fp32 32, bf16/fp16 16, int8 8, int4 4
  bits). Real quantized formats add scales (GGUF Q4_1 stores 32 weights in 20 bytes, i.e. 5
  bits each), so for a GGUF file the file's own tensor bytes are given too ("as stored");
  ``--precision auto`` uses them.
* **KV cache** = 2 (K and V) × layers × KV heads × head dim × bytes per element, per token;
  × ``--context`` × ``--concurrency`` (every sequence at full context, the worst case). The
  element is the KV cache dtype (``auto``: fp32 for fp32 models, else 2 bytes — weight-only
  int8/int4 leave the KV cache in 16 bits, as vLLM's ``--kv-cache-dtype auto``).
* **activations per step**: three figures (:func:`activation_figures`):
  - the notes' term ``sequence² × heads × hidden × bytes`` as written, for one sequence. It
    pictures *unfused* attention materialising the score matrix, but the score matrix is
    ``heads × sequence²`` per layer — the extra ``× hidden`` over-counts by a factor of
    ``hidden`` (576 for SmolLM2, 8192 for a 70B);
  - the unfused score matrix itself, ``2 × concurrency × heads × context² × bytes`` (scores
    and probabilities of one layer, every sequence prefilling its whole context at once). With
    fused / flash attention (FlashAttention, Dao et al. 2022, arXiv:2205.14135) or paged
    decode kernels (vLLM) it is never materialised, so this over-counts; it also ignores the
    MLP temporaries and the logits (``tokens × vocab × 4`` bytes), where it under-counts;
  - the engine's own estimate (``inferctl.engine.memory_plan.estimate_step_activation_bytes``,
    the eager PyTorch forward of this project's engine): the worst of a ``max_num_batched_tokens``
    prefill chunk at the end of the context and a decode step of every sequence at full
    context. This one goes into the total.
* **total** = weights + KV cache + the engine's activation estimate; the **GPUs** it fits on
  (:mod:`inferctl.tools.gpu_specs`, NVIDIA datasheet figures) keeping ``--gpu-memory-utilization``
  (vLLM's name, default 0.9) of each, how many would be needed when one is not enough (a lower
  bound: tensor parallelism splits weights and KV, not every activation), and the batch-1
  **decode bound** = memory bandwidth ÷ weight bytes tokens/s (every weight is read once per
  token; with the context's KV read too: ÷ (weights + KV of one full-context sequence)).

Errors are :class:`~tools.plan_model.PlanError` naming the flag (``--context: must be an integer
>= 1, got -5``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from inferctl.tools.gpu_specs import GPUS
from inferctl.tools.plan_draft import FLAG as SPEC_FLAG, DraftError, as_dict, draft_figures, parse_flag
from inferctl.tools.plan_model import UNKNOWN_DTYPE, ModelDims, PlanError, read_model

#: Bits per weight of each ``--precision`` (the notes' params × bits / 8).
PRECISION_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "int8": 8, "int4": 4}
#: Bytes per KV cache element of each ``--kv-cache-dtype`` (vLLM's names).
KV_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
#: The engine's default per-step token budget (``EngineConfig.max_num_batched_tokens``).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
#: Largest ``--context`` (tokens): 1,048,576 (2**20), 8× a 128k-context model's; a model whose
#: own context length is longer is planned at this bound, with a note.
MAX_CONTEXT = 1 << 20
#: Largest ``--concurrency`` (sequences at full context at once).
MAX_CONCURRENCY = 100_000


@dataclass
class GpuFit:
    """One GPU of the table against a plan (bytes, tokens/s)."""

    gpu: str
    memory_bytes: int
    usable_bytes: int
    fits: bool
    gpus_needed: int
    decode_tokens_per_s: float
    decode_tokens_per_s_at_context: float | None
    bandwidth_bytes_per_s: int
    source: str


@dataclass
class Plan:
    """The planner's answer (bytes unless named otherwise; None = cannot be computed from what
    was given, never 0)."""

    model: dict[str, Any]
    precision: str
    kv_cache_dtype: str
    context: int
    concurrency: int
    gpu_memory_utilization: float
    weights_bytes: int
    weights_formula_bytes: int
    weights_stored_bytes: int | None
    kv_bytes_per_token: int | None
    kv_bytes: int | None
    activations: dict[str, int | None]
    total_bytes: int | None
    gpus: list[GpuFit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    draft: dict[str, Any] | None = None     # tools/plan_draft.DraftFigures with --speculative-config

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def activation_figures(d: ModelDims, context: int, concurrency: int, act_bytes: int,
                       max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS) -> dict[str, int | None]:
    """Per-step activation bytes (see the module doc): ``notes_term`` (seq² × heads × hidden ×
    bytes, one sequence), ``unfused_attention_scores`` (2 × concurrency × heads × context² ×
    bytes), ``engine_profile_step`` (what the engine reserves: one ``max_num_batched_tokens``
    prefill) and ``engine_worst_step`` (the larger of a prefill chunk ending at ``context``
    and a decode step of ``concurrency`` sequences at ``context``). None where a dimension is
    missing."""
    out: dict[str, int | None] = {"notes_term": None, "unfused_attention_scores": None,
                                  "engine_profile_step": None, "engine_worst_step": None}
    if d.heads and d.hidden:
        out["notes_term"] = context * context * d.heads * d.hidden * act_bytes
    if d.heads:
        out["unfused_attention_scores"] = 2 * concurrency * d.heads * context * context * act_bytes
    if None in (d.hidden, d.heads, d.kv_heads, d.head_dim, d.intermediate, d.vocab):
        return out
    from inferctl.engine.memory_plan import estimate_step_activation_bytes

    dim = d.heads * d.head_dim     # the engine's estimate takes kv_dim = kv_heads × dim / heads

    def step(tokens: int, logits: int, q_ctx: int, ctx: int) -> int:
        return estimate_step_activation_bytes(tokens, logits, q_ctx, ctx, dim, d.intermediate, d.heads,
                                              d.kv_heads, d.vocab, act_bytes)

    b = max_num_batched_tokens
    chunk = min(b, context * concurrency)
    out["engine_profile_step"] = step(b, 1, b * b, b)
    out["engine_worst_step"] = max(step(chunk, 1, chunk * context, context),
                                   step(concurrency, concurrency, concurrency * context, concurrency * context))
    return out


def compute_plan(d: ModelDims, precision: str = "auto", context: int | None = None, concurrency: int = 1,
                 kv_cache_dtype: str = "auto", gpu_memory_utilization: float = 0.9,
                 max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                 speculative_config: str | dict | None = None) -> Plan:
    """The plan (module doc) for ``d``. ``context`` None = the model's own context length.
    ``speculative_config`` (vLLM's JSON): a draft model's weights, KV pool and step are added
    (tools/plan_draft.py).

    Raises:
        PlanError: unknown precision / KV dtype, a context or concurrency below 1 or above
            :data:`MAX_CONTEXT` / :data:`MAX_CONCURRENCY`, a utilization
            outside (0, 1], no context known, or a bad speculative config / draft (naming the flag).
    """
    try:
        spec = parse_flag(speculative_config)
    except DraftError as exc:
        raise PlanError(SPEC_FLAG, str(exc)) from None
    notes: list[str] = []
    if precision not in ("auto", *PRECISION_BITS):
        raise PlanError("--precision", f"{precision!r} is not one of auto, {', '.join(PRECISION_BITS)}")
    if kv_cache_dtype not in ("auto", *KV_DTYPE_BYTES):
        raise PlanError("--kv-cache-dtype", f"{kv_cache_dtype!r} is not one of auto, {', '.join(KV_DTYPE_BYTES)}")
    ctx = context if context is not None else d.context_length
    if ctx is None:
        raise PlanError("--context", "give the context length in tokens (the model does not say its own)")
    if context is None and isinstance(ctx, int) and ctx > MAX_CONTEXT:
        notes.append(f"the model's context length {ctx:,} is past the planner's bound: planned at "
                     f"{MAX_CONTEXT:,} tokens")
        ctx = MAX_CONTEXT
    for flag, v in (("--context", ctx), ("--concurrency", concurrency),
                    ("--max-num-batched-tokens", max_num_batched_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanError(flag, f"must be an integer >= 1, got {v!r}")
    for flag, v, limit, what in (("--context", ctx, MAX_CONTEXT, "tokens"),
                                 ("--concurrency", concurrency, MAX_CONCURRENCY, "sequences")):
        if v > limit:
            raise PlanError(flag, f"must be at most {limit:,} {what}, got {v:,}")
    if not 0 < gpu_memory_utilization <= 1:
        raise PlanError("--gpu-memory-utilization", f"must be in (0, 1], got {gpu_memory_utilization}")
    prec = precision
    if prec == "auto":
        if d.dtype.startswith(UNKNOWN_DTYPE):
            raise PlanError("--precision", f"the model's config.json gives {d.dtype[len(UNKNOWN_DTYPE):]}, a precision"
                                           " plan does not know (float32, bfloat16, float16): give --precision")
        prec = "stored" if d.dtype == "stored" else d.dtype
    formula = d.params * PRECISION_BITS.get(prec, 16) // 8
    if prec == "stored":
        weights = d.stored_bytes
        formula = d.params * 16 // 8
        notes.append(f"weights as stored in the file ({d.stored_format}); at fp16 they would be "
                     f"{formula:,} bytes")
    else:
        weights = formula
    if prec == "int4" and None not in (d.vocab, d.hidden, d.layers):  # engine/quant_int4.py's layout
        from inferctl.engine.quant import int8_weight_nbytes

        n_tab = 1 if d.tied is not False else 2
        norms = (2 * d.layers + 1) * d.hidden
        tables = n_tab * d.vocab * d.hidden
        eng = ((d.params - norms - tables) * 5 // 8 + n_tab * int8_weight_nbytes(d.vocab, d.hidden)
               + 4 * norms)
        notes.append(f"this engine's --precision int4 holds {eng:,} bytes of weights: every layer linear as "
                     "GGUF Q4_1 blocks (fp16 d and m per 32 weights, 0.625 B/weight; engine/q4_kernels.py), "
                     f"the classifier{'' if n_tab == 1 else ' and embedding'} int8 per row, norms fp32")
    act_bytes = 4 if prec == "fp32" else 2
    kvd = kv_cache_dtype if kv_cache_dtype != "auto" else ("fp32" if prec == "fp32" else "fp16")
    kv_tok = (2 * d.layers * d.kv_heads * d.head_dim * KV_DTYPE_BYTES[kvd]
              if None not in (d.layers, d.kv_heads, d.head_dim) else None)
    kv = kv_tok * ctx * concurrency if kv_tok is not None else None
    if kv_tok is None:
        notes.append("KV cache: no data (needs --layers, --kv-heads and --head-dim, or a --model)")
    if d.context_length and ctx > d.context_length:
        notes.append(f"--context {ctx} is past the model's trained context ({d.context_length})")
    acts = activation_figures(d, ctx, concurrency, act_bytes, max_num_batched_tokens)
    worst = acts["engine_worst_step"]
    try:
        dr = draft_figures(spec, d, PRECISION_BITS.get(prec), KV_DTYPE_BYTES[kvd], kv_tok, ctx, concurrency,
                           act_bytes, notes, read_model=read_model, worst_step=lambda m: activation_figures(
                               m, ctx, concurrency, act_bytes, max_num_batched_tokens)["engine_worst_step"])
    except DraftError as exc:
        raise PlanError(SPEC_FLAG, str(exc)) from None
    d_known = [0] if dr is None else [dr.weights_bytes, dr.kv_bytes]
    if dr is not None and worst is not None and dr.worst_step_bytes is not None:
        worst = max(worst, dr.worst_step_bytes)   # one headroom serves both models (plan_draft)
    total = weights + kv + worst + sum(d_known) if None not in (kv, worst, *d_known) else None
    need = total if total is not None else weights + (kv or 0) + sum(v or 0 for v in d_known)
    if total is None:
        notes.append("total: weights + KV only (the activation estimate needs every dimension)"
                     if kv is not None else "total: weights only")
    fits = []
    for g in GPUS:
        usable = int(g.memory_bytes * gpu_memory_utilization)
        at_ctx = g.bandwidth_bytes_per_s / (weights + kv_tok * ctx) if kv_tok is not None else None
        fits.append(GpuFit(g.name, g.memory_bytes, usable, need <= usable, max(1, -(-need // usable)),
                           g.bandwidth_bytes_per_s / weights, at_ctx, g.bandwidth_bytes_per_s, g.source))
    model = {k: v for k, v in asdict(d).items()}
    return Plan(model, prec, kvd, ctx, concurrency, gpu_memory_utilization, weights, formula,
                d.stored_bytes, kv_tok, kv, acts, total if total is not None else need, fits, notes, as_dict(dr))

