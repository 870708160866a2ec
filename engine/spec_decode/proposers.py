"""Draft proposers: ngram prompt lookup, and a draft model over a KV pool parallel to the target's.

:class:`NgramProposer` (prompt lookup decoding, Saxena 2023; vLLM's ``ngram`` method): for n
from ``prompt_lookup_max`` down to ``prompt_lookup_min``, find the most recent earlier
occurrence of the context's last n tokens and propose the (up to) k tokens that followed it.
No model runs; the draft is deterministic (``q`` is a point mass, see ``rejection``).

:class:`DraftModelProposer` runs a second, smaller (or int8) model autoregressively for k
steps. Choice: its own KV cache, not recompute. The draft pool has exactly the target pool's
``num_blocks`` x ``block_size`` slots (in the draft's own layer/head shape) and is indexed by
the *target's* block tables, so the block manager's allocation, truncation, preemption and
freeing serve both caches; nothing is allocated per request. Per request the proposer
remembers how many positions of the draft cache are valid (``computed``) and the block-table
list they were written through: the target's block table is replaced by a new list whenever
the sequence loses its blocks (preemption, OOM requeue), which resets ``computed`` to 0. Each
proposal first catches the draft cache up on the tokens it has not seen (the prompt after the
target's prefill, accepted tokens), then drafts k tokens; after verification the valid prefix
is ``min(target's computed tokens, positions the draft wrote)``. The catch-up forward feeds at
most ``max_tokens`` tokens (the engine's ``max_num_batched_tokens``, the step the memory plan
profiled): a sequence whose catch-up does not fit is caught up partly and drafts from a later step.

The int8 self-draft (``int8_self``) is a :class:`DraftModelProposer` over a copy of the target
model quantized per output channel (``engine.quant``; ~1/4 of fp32 weight bytes).
Memory: the draft's weights and its pool are sized and accounted by the engine's memory plan
(:func:`inferctl.engine.memory_plan.plan_memory`, tags ``draft_weights``/``draft_kv_cache``);
every draft forward reserves its activations through the accountant first, so a draft step that
does not fit raises ``torch.OutOfMemoryError`` before it runs.
"""

from __future__ import annotations

import numpy as np
import torch

from inferctl.engine.attention import AttentionMetadata, KVCache
from inferctl.engine.memory_plan import ActivationModel
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.sequence import Sequence
from inferctl.engine.spec_decode.rejection import sanitize, target_probs


class NgramProposer:
    """Prompt-lookup drafts. Raises ValueError for bounds outside 1 <= lo <= hi."""

    def __init__(self, prompt_lookup_max: int, prompt_lookup_min: int):
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{prompt_lookup_min}, {prompt_lookup_max}")
        self.hi = prompt_lookup_max
        self.lo = prompt_lookup_min

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens continuing ``token_ids`` (empty when no n-gram matches)."""
        L = len(token_ids)
        if k < 1 or L < self.lo + 1:
            return []
        arr = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.hi, L - 1), self.lo - 1, -1):
            suffix = arr[L - n:]
            # windows starting at 0 .. L-n-1 (the suffix itself excluded), each followed by a token
            win = np.lib.stride_tricks.sliding_window_view(arr[:L - 1], n)
            hits = np.flatnonzero((win == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return arr[start:start + k].tolist()
        return []


class DraftModelProposer:
    """Drafts from ``model`` (a ``LlamaModel`` with the target's vocabulary) over its own KV pool.

    Args:
        model: the draft model (on the target's device).
        kv_cache: the draft's pool (as many blocks as the target's; allocated by the memory plan).
        block_size: tokens per block (the target's).
        accountant: the engine's :class:`~inferctl.engine.memory.MemoryAccountant`; each draft
            forward reserves its activations there (None: not accounted).
        max_tokens: most tokens one catch-up forward feeds (None: no cap).
    """

    def __init__(self, model, kv_cache: KVCache, block_size: int, accountant=None,
                 max_tokens: int | None = None):
        self.model = model
        self.block_size = block_size
        self.device = torch.device(model.device)
        self.kv_cache = kv_cache
        self.accountant = accountant
        self.acts = ActivationModel.of(model.args, model.dtype)
        self.max_tokens = max_tokens
        self._state: dict[str, tuple[list[int], int]] = {}
        self._shared_gen = torch.Generator(device=self.device)
        self._shared_gen.seed()

    def computed(self, seq: Sequence) -> int:
        """Valid positions of ``seq`` in the draft cache (0 after the target lost its blocks)."""
        st = self._state.get(seq.request_id)
        if st is None or st[0] is not seq.block_table:
            return 0
        return min(st[1], seq.num_computed_tokens)

    def forget(self, keep: set[str]) -> None:
        """Drop the state of every request not in ``keep`` (finished ones)."""
        for rid in [r for r in self._state if r not in keep]:
            del self._state[rid]

    def _forward(self, chunks: list[tuple[Sequence, list[int], int]]) -> torch.Tensor:
        ids: list[int] = []
        pos: list[int] = []
        meta_chunks = []
        sum_q_ctx = sum_ctx = 0
        for seq, toks, start in chunks:
            ids.extend(toks)
            end = start + len(toks)
            pos.extend(range(start, end))
            meta_chunks.append((seq.block_table, start, len(toks), False))
            sum_q_ctx += len(toks) * end
            sum_ctx += end
        acct = self.accountant
        handle = (acct.reserve_activations(self.acts.step_bytes(len(ids), len(chunks), sum_q_ctx, sum_ctx))
                  if acct is not None else 0)
        try:
            dev = self.device
            meta = AttentionMetadata.build(meta_chunks, self.block_size, dev)
            with torch.inference_mode():
                return self.model(torch.tensor(ids, dtype=torch.long, device=dev),
                                  torch.tensor(pos, dtype=torch.long, device=dev), self.kv_cache, meta)
        finally:
            if acct is not None:
                acct.release_activations(handle)

    def _pick(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[torch.Tensor | None]]:
        work, _ = sanitize(logits)
        toks = work.argmax(dim=-1).tolist()
        qs: list[torch.Tensor | None] = [None] * len(seqs)
        for i, seq in enumerate(seqs):
            p: SamplingParams = seq.params
            if p.is_greedy:
                continue
            # the draft distribution q: the request's temperature/top-k/top-p, without penalties
            q = target_probs(work[i:i + 1], p, penalties=False)
            gen = seq.generator if seq.generator is not None else self._shared_gen
            toks[i] = int(torch.multinomial(q[0], 1, generator=gen).item())
            qs[i] = q[0]
        return toks, qs

    def propose(self, batch: list[tuple[Sequence, int]]) -> dict[str, tuple[list[int], torch.Tensor | None]]:
        """Draft ``k`` tokens for each ``(seq, k)`` (each seq in decode: ``num_computed ==
        num_tokens - 1``, its block table already covering ``num_tokens + k - 1`` positions).

        Returns ``{request_id: (drafts, q)}``: q [k, V] the draft distributions of sampled
        requests, None for greedy ones; a sequence whose catch-up did not fit in ``max_tokens``
        is absent (caught up partly). Raises what the draft model raises, and the accountant's
        ``torch.OutOfMemoryError`` when a draft forward's activations do not fit.
        """
        out: dict[str, tuple[list[int], list]] = {}
        if not batch:
            return {}
        chunks = []
        live = []
        cap = self.max_tokens if self.max_tokens is not None else float("inf")
        for seq, k in batch:
            dc = self.computed(seq)
            take = int(min(seq.num_tokens - dc, cap))
            if take < 1:
                continue
            chunks.append((seq, seq.token_ids[dc:dc + take], dc))
            cap -= take
            if dc + take == seq.num_tokens:
                live.append((seq, k))
        if not chunks:
            return {}
        logits = self._forward(chunks)
        for seq, toks, dc in chunks:
            if dc + len(toks) < seq.num_tokens:   # caught up partly: drafts from a later step
                self._state[seq.request_id] = (seq.block_table, dc + len(toks))
        if len(live) < len(chunks):
            ready = {id(s) for s, _ in live}
            rows = [i for i, (s, _, _) in enumerate(chunks) if id(s) in ready]
            logits = logits[rows]
        if not live:
            return {}
        step = 0
        while True:
            toks, qs = self._pick(logits, [s for s, _ in live])
            nxt = []
            for (seq, k), t, q in zip(live, toks, qs):
                d, ql = out.setdefault(seq.request_id, ([], []))
                d.append(t)
                ql.append(q)
                if len(d) < k:
                    nxt.append((seq, k))
            # the draft cache now holds every position the last forward fed
            for seq, _ in live:
                self._state[seq.request_id] = (seq.block_table, seq.num_tokens + step)
            if not nxt:
                break
            step += 1
            live = nxt
            logits = self._forward([(seq, [out[seq.request_id][0][-1]], seq.num_tokens - 1 + step)
                                    for seq, _ in live])
        return {rid: (d, None if ql[0] is None else torch.stack(ql)) for rid, (d, ql) in out.items()}

    def nbytes(self) -> int:
        """Bytes of the draft weights and the draft KV pool."""
        return int(self.model.weight_bytes()) + self.kv_cache.nbytes()

    def accepted(self, seq: Sequence) -> None:
        """After verification: the valid draft positions are those the target kept."""
        st = self._state.get(seq.request_id)
        if st is not None and st[0] is seq.block_table:
            self._state[seq.request_id] = (st[0], min(st[1], seq.num_computed_tokens))


def build_int8_self_draft(model):
    """A copy of ``model`` with every linear quantized to int8 (the ``int8_self`` draft).

    Built from the full-precision weights (``export_weights`` works in either precision), so a
    target that is itself in int8 still gets the same draft. The copy keeps no full-precision
    rollback weights (it never switches back).
    """
    from inferctl.engine.model import LlamaModel

    draft = LlamaModel(model.args, model.export_weights(), device=model.device, dtype=model.dtype)
    draft.set_precision("int8")
    draft._host_backup = {}   # never rolled back: drop the full-precision copy
    return draft
