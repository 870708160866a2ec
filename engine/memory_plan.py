"""The engine's memory plan: how much the budget holds (weights, KV pool, activations).

:func:`estimate_step_activation_bytes` estimates one step's activation peak;
:func:`plan_memory` sizes the budget and the KV pool the way vLLM's profile step does
(``gpu_memory_utilization`` on CUDA, ``--memory-budget`` or the worst step on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferctl.contract.units import format_size
from inferctl.engine.attention import KVCache
from inferctl.engine.config import ConfigError
from inferctl.engine.memory import MemoryAccountant

def estimate_step_activation_bytes(num_tokens: int, num_logits: int, sum_q_ctx: int, sum_ctx: int,
                                   dim: int, hidden_dim: int, n_heads: int, n_kv_heads: int,
                                   vocab_size: int, act_bytes: int, num_logprob_rows: int = 0) -> int:
    """Peak activation bytes of one forward step (one layer's temporaries live at a time).

    ``act_bytes × [T·(4·dim + 2·kv_dim + 3·hidden)      hidden states x, h, q, out; k, v; MLP
                   + 2·heads·Σ qᵢ·ctxᵢ                  attention scores and probabilities
                   + 2·kv_dim·Σ ctxᵢ]                    K/V gathered from the paged cache
      + 4·N·vocab                                        float32 logits
      + 4·R·vocab``                                      float32 log_softmax of prompt-logprob rows
    with T the step's tokens, qᵢ the new tokens and ctxᵢ the context (cached + new) of
    sequence i, kv_dim = n_kv_heads·dim/n_heads, N the logits rows (one per sequence, or
    every new token of a chunk that computes prompt logprobs) and R the rows whose
    ``log_softmax`` is taken for prompt logprobs (live together with the logits). Monotone in
    T, N, R, qᵢ and ctxᵢ. An engineering estimate of the eager PyTorch forward (not a
    measured profile).
    """
    kv_dim = n_kv_heads * (dim // n_heads)
    per_token = 4 * dim + 2 * kv_dim + 3 * hidden_dim
    elems = num_tokens * per_token + 2 * n_heads * sum_q_ctx + 2 * kv_dim * sum_ctx
    return int(act_bytes * elems + 4 * (num_logits + num_logprob_rows) * vocab_size)


@dataclass(frozen=True)
class ActivationModel:
    """The model dimensions :func:`estimate_step_activation_bytes` needs, bound once.

    ``act_bytes`` is the element size of the model's activation dtype (bytes).
    """

    dim: int
    hidden_dim: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    act_bytes: int

    @classmethod
    def of(cls, args, dtype: torch.dtype) -> ActivationModel:
        """From a model's ``ModelArgs`` and its dtype."""
        return cls(args.dim, args.hidden_dim, args.n_heads, args.n_kv_heads, args.vocab_size,
                   torch.empty((), dtype=dtype).element_size())

    def step_bytes(self, num_tokens: int, num_logits: int, sum_q_ctx: int, sum_ctx: int,
                   num_logprob_rows: int = 0) -> int:
        """:func:`estimate_step_activation_bytes` for this model (bytes)."""
        return estimate_step_activation_bytes(
            num_tokens, num_logits, sum_q_ctx, sum_ctx, self.dim, self.hidden_dim, self.n_heads,
            self.n_kv_heads, self.vocab_size, self.act_bytes, num_logprob_rows)

    def share_of(self, seq, n: int) -> int:
        """Activation bytes that ``n`` new tokens of ``seq`` add to a step (the runner's
        all-logits chunk for a prompt-logprobs prefill counts its logits rows). Used to blame
        one request for an OOM (the largest share)."""
        c = seq.num_computed_tokens
        ctx = c + n
        last_prompt = len(seq.prompt_token_ids) - 1
        if c < last_prompt and seq.wants_prompt_logprobs:
            return self.step_bytes(n, n, n * ctx, ctx, num_logprob_rows=min(ctx, last_prompt) - c)
        return self.step_bytes(n, 1, n * ctx, ctx)


@dataclass
class MemoryPlan:
    """What :func:`plan_memory` set up: the accountant (weights and KV pool accounted), the
    KV cache, the pool size and the numbers behind it (bytes). With a speculative draft model
    also its KV pool (``draft_kv_cache``, ``num_kv_blocks`` blocks of
    ``draft_kv_bytes_per_block``), its weights and its profiled step (tags ``draft_weights``,
    ``draft_kv_cache``); None / 0 without one."""

    accountant: MemoryAccountant
    kv_cache: KVCache
    num_kv_blocks: int
    kv_bytes_per_block: int
    profile_activation_bytes: int
    weights_handle: int
    kv_handle: int
    draft_kv_cache: KVCache | None = None
    draft_kv_bytes_per_block: int = 0
    draft_weights_bytes: int = 0
    draft_profile_activation_bytes: int = 0


#: The simulated allocator rounds each allocation up to 512 bytes; four of them of slack.
_ROUNDING_SLACK = 4 * 512


def host_available_bytes() -> int | None:
    """Bytes a new allocation in this process can take now on the host (CPU): ``MemAvailable``
    of ``/proc/meminfo``, lowered to what the cgroup v2 limit leaves (``memory.max`` minus
    ``memory.current`` less its page cache, ``memory.stat`` ``file``) in a container; the
    physical memory where there is no ``/proc/meminfo``;
    None when nothing says. An upper bound for the CPU KV pool: ``torch.zeros`` touches every
    page, so a pool past it either fails to allocate or wakes the OOM killer."""
    import os

    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        avail = None
    if avail is None:
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
            current = int(f.read().strip())
        cache = 0             # the page cache is reclaimed before the cgroup's OOM killer runs
        with open("/sys/fs/cgroup/memory.stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("file "):
                    cache = int(line.split()[1])
                    break
        if limit.isdigit():
            avail = min(avail, max(0, int(limit) - max(0, current - cache)))
    except (OSError, ValueError, IndexError):
        pass
    return avail


def _is_allocation_failure(err: RuntimeError) -> bool:
    """A failed allocation: CUDA's ``torch.OutOfMemoryError``, or the CPU allocator's
    ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory")."""
    text = str(err)
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text


def start_weights_bytes(model, precision: str | None) -> int | None:
    """The weight bytes to plan the budget with when an engine starts ``model`` in ``precision``
    ("full", "int8", "int4"; None = as loaded), for :func:`plan_memory`'s ``weights_bytes``.

    Only the start-only mode "int4" differs from the loaded weights: its KV pool is planned beside
    ``model.weight_bytes_by_mode()["int4"]``, not the fp32 weights it drops. "int8" is planned
    from the full weights, which a switch back to full needs again. None = ``weight_bytes()``.
    Raises ValueError for an unknown precision.
    """
    if precision not in (None, "full", "int8", "int4"):
        raise ValueError(f"precision must be 'full', 'int8' or 'int4', got {precision!r}")
    if precision != "int4" or getattr(model, "precision", "full") == "int4":
        return None
    return int(model.weight_bytes_by_mode()["int4"])


def apply_start_precision(engine, precision: str | None) -> None:
    """Switch a just-built engine (no stepping thread yet: the command applies at once) to its
    start ``precision`` (None or the current one: nothing). Raises ConfigError (field
    ``precision``) when "int4" could not be applied: its plan has no room for the fp32 weights."""
    if precision is None or precision == engine.precision:
        return
    try:
        engine.request_precision(precision)
    except torch.OutOfMemoryError as err:   # int4 refused: re-accounting the full weights overflowed its plan
        engine._precision_error = str(err)
    if precision == "int4" != engine.precision:
        raise ConfigError("precision", f"int4 could not be applied: {engine._precision_error}")


def plan_memory(model, args, cfg, device: torch.device, acts: ActivationModel, draft=None,
                weights_bytes: int | None = None) -> MemoryPlan:
    """Size the budget and the KV pool, allocate both through a new accountant.

    The activation headroom kept free is the estimate of vLLM's profile step: one prefill of
    ``max_num_batched_tokens`` tokens. Steps at longer contexts may need more; they then run
    out of budget through the accountant (the OOM path, by design). On CPU without an
    explicit budget, the budget covers the worst step instead: B tokens at full context, every
    row's logits and their ``log_softmax`` (a prompt-logprobs prefill).

    Speculative decoding with a draft model (``draft``: ``int8_self`` or ``draft_model``): the
    draft keeps its own KV pool with as many blocks as the target's (the two share block tables,
    docs/speculative-decoding.md), so each block costs ``bpb + draft_bpb`` and the pool shrinks to
    ``(budget - weights - draft weights - headroom) // (bpb + draft_bpb)`` blocks (the int8
    self-draft's pool is the target's twin: half as many blocks). The draft's forwards run before
    the target's, never at the same time, so one activation headroom serves both:
    ``max(profile, draft profile)``, the draft's profile being a ``max_num_batched_tokens``
    step of the draft model (its catch-up forwards are chunked to that many tokens).

    Args:
        model: the loaded model (``weight_bytes()``, ``dtype``); args: its ``ModelArgs``;
        cfg: the resolved ``EngineConfig``; device: where the engine runs; draft: the draft
            model (``args``, ``dtype``, ``weight_bytes()``) or None; weights_bytes: the weights
            to plan for when the engine starts in another precision than the model is loaded in
            (a start-only mode: ``--precision int4`` plans from
            ``LlamaModel.weight_bytes_by_mode()["int4"]``, not the fp32 weights it will drop);
            None = ``model.weight_bytes()``.

    Raises:
        ConfigError: the budget cannot hold the weights, one KV block and the profile step, or
            the device cannot hold the pool: on CPU a pool larger than
            :func:`host_available_bytes`, or an allocation that fails (the message gives the
            numbers; field ``num_kv_blocks`` when it was given, else ``memory_budget_bytes``).
    """
    kv_int8 = cfg.kv_cache_dtype == "int8"
    bpb = KVCache.bytes_per_block(args.n_layers, cfg.block_size, args.n_kv_heads, args.head_dim,
                                  model.dtype, kv_int8)
    weights = model.weight_bytes() if weights_bytes is None else int(weights_bytes)
    B, S, L = cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_model_len
    profile = acts.step_bytes(B, 1, B * B, B)
    d_bpb = d_weights = d_profile = d_worst = 0
    if draft is not None:
        da = draft.args
        d_bpb = KVCache.bytes_per_block(da.n_layers, cfg.block_size, da.n_kv_heads, da.head_dim,
                                        draft.dtype, kv_int8)
        d_weights = draft.weight_bytes()
        d_acts = ActivationModel.of(da, draft.dtype)
        d_profile = d_acts.step_bytes(B, 1, B * B, B)
        d_worst = d_acts.step_bytes(B, min(S, B), B * L, min(S, B) * L)
    headroom = max(profile, d_profile)
    per_block = bpb + d_bpb
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        budget = cfg.memory_budget_bytes or int(cfg.gpu_memory_utilization * total)
        in_use = torch.cuda.memory_allocated(device)   # both models' weights are loaded already
        num_blocks = (cfg.num_kv_blocks if cfg.num_kv_blocks is not None
                      else (budget - in_use - headroom) // per_block)
    elif cfg.memory_budget_bytes is None:
        num_blocks = cfg.num_kv_blocks or max(1, min(S * -(-L // cfg.block_size),
                                                     cfg.cpu_kv_cache_bytes // per_block))
        worst = acts.step_bytes(B, B, B * L, min(S, B) * L, num_logprob_rows=B)
        budget = (weights + d_weights + num_blocks * per_block + max(worst, d_worst, headroom)
                  + _ROUNDING_SLACK)
    else:
        budget = cfg.memory_budget_bytes
        num_blocks = (cfg.num_kv_blocks if cfg.num_kv_blocks is not None
                      else (budget - weights - d_weights - headroom - _ROUNDING_SLACK) // per_block)
    if num_blocks < 1:
        draft_text = (f", the speculative draft's weights take {format_size(d_weights)} and its KV "
                      f"pool {format_size(d_bpb)} per block" if draft is not None else "")
        raise ConfigError("memory_budget_bytes", (
            f"budget {format_size(budget)} leaves no room for one KV block "
            f"({format_size(bpb)}): weights take {format_size(weights)}{draft_text} and a "
            f"{B}-token step needs {format_size(headroom)} of activations; raise the budget "
            "or lower max_num_batched_tokens (--max-num-batched-tokens)"))
    # the flag to blame for a pool too large: --num-kv-blocks when given, else the budget it came from
    pool_field = "num_kv_blocks" if cfg.num_kv_blocks is not None else "memory_budget_bytes"
    if device.type == "cpu":
        avail = host_available_bytes()
        if avail is not None and num_blocks * per_block > avail:
            raise ConfigError(pool_field, (
                f"{num_blocks} KV blocks ({format_size(num_blocks * per_block)}, {format_size(per_block)} "
                f"each) do not fit in the {format_size(avail)} this host has available: at most "
                f"{avail // per_block} blocks would (before weights and activations)"))
    accountant = MemoryAccountant(budget, device)
    try:
        weights_handle = accountant.allocate(weights, "weights")
        kv_handle = accountant.allocate(num_blocks * bpb, "kv_cache")
        if draft is not None:
            accountant.allocate(d_weights, "draft_weights")
            accountant.allocate(num_blocks * d_bpb, "draft_kv_cache")
    except torch.OutOfMemoryError as err:
        raise ConfigError(pool_field, (
            f"budget {format_size(budget)} cannot hold the weights ({format_size(weights + d_weights)}) "
            f"and {num_blocks} KV blocks ({format_size(num_blocks * per_block)})")) from err
    try:
        kv_cache = KVCache.allocate(args.n_layers, num_blocks, cfg.block_size, args.n_kv_heads,
                                    args.head_dim, model.dtype, device, kv_int8=kv_int8)
        draft_kv = None if draft is None else KVCache.allocate(
            draft.args.n_layers, num_blocks, cfg.block_size, draft.args.n_kv_heads, draft.args.head_dim,
            draft.dtype, device, kv_int8=kv_int8)
    except RuntimeError as err:   # the device itself could not hold it (CUDA OOM, the CPU allocator)
        if not _is_allocation_failure(err):
            raise
        raise ConfigError("num_kv_blocks", (
            f"{num_blocks} KV blocks ({format_size(num_blocks * per_block)}) do not fit on "
            f"{device}: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}")) from err
    return MemoryPlan(accountant, kv_cache, num_blocks, bpb, profile, weights_handle, kv_handle,
                      draft_kv, d_bpb, d_weights, d_profile)
