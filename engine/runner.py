"""ModelRunner: turns one scheduled step into model inputs, runs the forward, samples.

Per step: the scheduled ``(sequence, new_tokens)`` pairs become one packed batch (no padding):
``input_ids[T]``, ``positions[T]`` and ``AttentionMetadata`` built from each sequence's
``(block_table, num_computed_tokens, new_tokens, all_logits)``. The step's activations
are reserved through the :class:`~engine.memory.MemoryAccountant` before the forward and
released after (so a step that does not fit raises ``torch.OutOfMemoryError`` before any
state changes). Only sequences whose prefill is complete after this step (the chunk reaches
the last token) are sampled. Tiny models are bound by per-step Python work (docs/performance.md),
so the loop builds plain lists and converts each to a tensor once; on CPU a step of at most
``_MAX_BUFFERED_TOKENS`` tokens (every decode step of a normal batch) copies them into persistent
``input_ids``/``positions`` tensors of its size through their numpy views (~1 µs against ~12 µs
for ``torch.tensor`` plus two slices), reused every step of that size. A decode-only step takes a
shorter path (:meth:`ModelRunner._execute_decode`: the same inputs, metadata, estimate and sampling,
with the sampler's per-sequence lists kept while the running set is unchanged), and every step's
metadata is rewritten in place when its sizes match the last step's (``AttentionMetadata.build``'s
``reuse``). A decode step of the last decode step's running set, each sequence one token further in
the same blocks, skips the build too: :meth:`ModelRunner._advance` writes the slots, context lengths
and inputs that changed into the last step's tensors (issue 12, wave 11).

Prompt logprobs (vLLM semantics). A prefill chunk of a sequence that asked for them and has
prompt tokens left to score is built with ``all_logits=True``: row ``r`` (position ``r``)
holds the distribution of token ``r + 1``, so a chunk over positions ``[c, e)`` scores prompt
tokens ``c + 1 … min(e, P - 1)`` (P = prompt length). The chunk's last row scores the first
token of the *next* chunk (the prompt is known in full); the last prompt row (``P - 1``) is not
a prompt logprob — it is the first generated token's distribution and goes to the sampler.
Each scored row gets ``log_softmax`` (float32), the actual token's logprob and rank (tokens
with logprob >= its own, as vLLM) and the top-k alternatives. The logits rows and their
``log_softmax`` are counted in the step's activation estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from inferctl.engine.attention import AttentionMetadata, KVCache
from inferctl.engine.memory import MemoryAccountant
from inferctl.engine.memory_plan import estimate_step_activation_bytes
from inferctl.engine.sampler import GREEDY_TEMPERATURE_EPS, Sampler, SampleResult, greedy_from_pairs, greedy_sample
from inferctl.engine.sequence import Logprob, PromptLogprobEntry, Sequence

#: Steps of at most this many tokens reuse persistent CPU input tensors (one pair per size).
_MAX_BUFFERED_TOKENS = 64


@dataclass
class StepResult:
    """What one forward produced.

    Attributes:
        sampled: the sequences that got a new token, in batch order.
        sample: the sampler's result for ``sampled`` (row i ↔ sampled[i]); None if none.
        num_tokens: T, tokens fed (all real: the batch is packed, padded tokens = 0).
        activation_bytes: the step's reserved activation estimate.
        prompt_logprobs: ``(sequence, num_cached, entries)`` for each chunk that scored prompt
            tokens: ``entries[j]`` is prompt position ``num_cached + 1 + j`` (see
            :meth:`Sequence.set_prompt_logprobs`).
        verify: ``(sequence, logits [k+1, V])`` of each sequence fed with draft tokens
            (speculative decoding; not in ``sampled``).
    """

    sampled: list[Sequence]
    sample: SampleResult | None
    num_tokens: int
    activation_bytes: int
    prompt_logprobs: list[tuple[Sequence, int, list[PromptLogprobEntry]]] = field(default_factory=list)
    verify: list[tuple[Sequence, torch.Tensor]] = field(default_factory=list)


@dataclass
class _DecodeBatch:
    """The sampler's per-row inputs of a running set (the decode fast path): each sequence's
    params, generator, token list (the same list object, so it grows with the sequence) and
    prompt length, all fixed for a sequence's life; ``plain_greedy``: every row is greedy without
    logprobs or penalties (:func:`greedy_sample` serves it, as the sampler's first branch does)."""

    seqs: list[Sequence]
    params: list
    generators: list
    histories: list[list[int]]
    prompt_lens: list[int]
    plain_greedy: bool

    @classmethod
    def of(cls, seqs: list[Sequence]) -> "_DecodeBatch":
        params = [s.params for s in seqs]
        greedy = all(p.temperature < GREEDY_TEMPERATURE_EPS and p.logprobs is None and not p.has_penalties
                     for p in params)
        return cls(seqs, params, [s.generator for s in seqs], [s.token_ids for s in seqs],
                   [len(s.prompt_token_ids) for s in seqs], greedy)


class ModelRunner:
    """Runs steps of ``model`` over ``kv_cache``.

    Args:
        model: a ``LlamaModel`` (``forward(input_ids, positions, kv_cache, meta)``).
        kv_cache: the paged pool.
        block_size: tokens per block (as the cache).
        accountant: where step activations are reserved.
        sampler: the batched ``Sampler``.
    """

    def __init__(self, model, kv_cache: KVCache, block_size: int, accountant: MemoryAccountant,
                 sampler: Sampler):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.accountant = accountant
        self.sampler = sampler
        self.device = torch.device(model.device)
        a = model.args
        self._dims = dict(dim=a.dim, hidden_dim=a.hidden_dim, n_heads=a.n_heads,
                          n_kv_heads=a.n_kv_heads, vocab_size=a.vocab_size,
                          act_bytes=torch.empty((), dtype=model.dtype).element_size())
        # T -> (input_ids [T], positions [T], their numpy views): filled in place each step (CPU)
        self._input_buffers: dict[int, tuple] = {}
        # the last step's AttentionMetadata, overwritten in place by the next build of its sizes
        self._meta: AttentionMetadata | None = None
        # decode fast path: the running set of the last all-decode step and its sampler inputs
        self._decode: _DecodeBatch | None = None
        self._decode_act: dict[int, tuple[int, int]] = {}   # B -> (base, slope) of the decode estimate
        # in-place advance of the last decode step (CPU): (its metadata, the numpy views of its
        # input_ids/positions, each sequence's block-table list object, each one's cached count)
        self._adv: tuple | None = None
        # the C++ greedy pick (argmax + its log_softmax value) for the fast path, where the kernels run
        ops = getattr(model, "kernel_ops", None)
        self._greedy_ops = ops if ops is not None and hasattr(ops, "greedy_logprobs") else None
        # the model whose forward takes ``greedy_out`` (a LlamaModel with the kernels); a model put in
        # its place later (a test's wrapper) is called without it
        self._greedy_model = model if self._greedy_ops is not None else None
        # B -> (float64 [2B], its numpy view): the fused op's greedy_out in an all-greedy decode step
        self._greedy_bufs: dict[int, tuple[torch.Tensor, Any]] = {}

    def estimate_activation_bytes(self, num_tokens: int, num_logits: int, sum_q_ctx: int,
                                  sum_ctx: int, num_logprob_rows: int = 0) -> int:
        """The accountant's activation estimate for a step of this shape (see
        :func:`inferctl.engine.memory_plan.estimate_step_activation_bytes`)."""
        return estimate_step_activation_bytes(num_tokens, num_logits, sum_q_ctx, sum_ctx,
                                              num_logprob_rows=num_logprob_rows, **self._dims)

    def execute(self, scheduled: list[tuple[Sequence, int]], drafts: dict | None = None) -> StepResult:
        """Run one step. Does not change the sequences (the engine commits the result).

        ``drafts`` (speculative decoding, :mod:`inferctl.engine.spec_decode`): ``{request_id:
        (draft_tokens, q)}`` for decode sequences whose KV slots cover the drafts; each such
        sequence is fed ``[last token, *drafts]`` in one chunk and its k+1 logits rows come back
        in ``StepResult.verify`` instead of being sampled.

        Raises ``torch.OutOfMemoryError`` (budget, injected or CUDA) and whatever the model
        raises; the caller decides what to do with the step's sequences.
        """
        if not drafts:
            res = self._execute_decode(scheduled)
            if res is not None:
                return res
        self._adv = None
        ids: list[int] = []
        positions: list[int] = []
        chunks: list[tuple[list[int], int, int, bool]] = []
        sampled: list[Sequence] = []
        rows: list[int] = []            # the logits row of each sampled sequence
        scored: list[tuple[Sequence, int, int, int]] = []   # (seq, cached, first row, rows)
        sum_q_ctx = sum_ctx = 0
        num_logits = num_scored = 0
        verify: list[tuple[Sequence, int, int]] = []     # (seq, first row, rows): spec decode
        for seq, n in scheduled:
            c = seq.num_computed_tokens
            end = c + n
            d = drafts.get(seq.request_id) if drafts else None
            if d:
                m = len(d[0]) + 1
                ids.append(seq.token_ids[c])
                ids.extend(d[0])
                positions.extend(range(c, c + m))
                chunks.append((seq.block_table, c, m, True))
                verify.append((seq, num_logits, m))
                num_logits += m
                sum_q_ctx += m * (c + m)
                sum_ctx += c + m
                continue
            if n == 1:
                ids.append(seq.token_ids[c])
                positions.append(c)
            else:
                ids.extend(seq.token_ids[c:end])
                positions.extend(range(c, end))
            last_prompt = len(seq.prompt_token_ids) - 1
            all_logits = c < last_prompt and seq.wants_prompt_logprobs
            chunks.append((seq.block_table, c, n, all_logits))
            if all_logits:
                m = min(end, last_prompt) - c    # rows c … c+m-1 score prompt tokens c+1 … c+m
                scored.append((seq, c, num_logits, m))
                num_scored += m
                num_logits += n
            else:
                num_logits += 1
            sum_q_ctx += n * end
            sum_ctx += end
            if end == len(seq.token_ids):
                sampled.append(seq)
                rows.append(num_logits - 1)
        T = len(ids)
        act = self.estimate_activation_bytes(T, num_logits, sum_q_ctx, sum_ctx, num_scored)
        handle = self.accountant.reserve_activations(act)
        try:
            dev = self.device
            meta = self._meta = AttentionMetadata.build(chunks, self.block_size, dev, reuse=self._meta)
            with torch.inference_mode():
                input_ids, input_pos = self._inputs(ids, positions)
                logits = self.model(input_ids, input_pos, self.kv_cache, meta)
                prompt_lps = [(seq, c, self._score_prompt(logits[start:start + m], seq, c))
                              for seq, c, start, m in scored]
                ver = [(seq, logits[start:start + m]) for seq, start, m in verify]
                if not sampled:
                    return StepResult(sampled, None, T, act, prompt_lps, ver)
                if len(rows) != num_logits:
                    logits = logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=dev))
                sample = self.sampler(logits, [s.params for s in sampled],
                                      [s.generator for s in sampled],
                                      [s.token_ids for s in sampled],
                                      [len(s.prompt_token_ids) for s in sampled])
        finally:
            self.accountant.release_activations(handle)
        return StepResult(sampled, sample, T, act, prompt_lps, ver)

    def _execute_decode(self, scheduled: list[tuple[Sequence, int]]) -> StepResult | None:
        """The decode fast path: a step whose every sequence is a decode (one new token, its
        last, so it is sampled and scores no prompt token), else None (the general path runs).

        The same inputs, metadata, activation estimate, forward and sampler as the general path,
        with less Python around them: the sampler's per-sequence lists are kept while the running
        set is unchanged (the same sequences in the same order; rebuilt when one finishes, is
        preempted or aborted, or a new one arrives: its prefill is not a decode step), the
        metadata is rewritten in place (``AttentionMetadata.build(..., reuse=)``), and an all-greedy
        batch without logprobs or penalties goes to :func:`greedy_sample` directly (the sampler's
        own first branch). Measured in docs/performance.md (issue 12, wave 8). With the kernels, such
        a batch hands the model a ``greedy_out`` buffer: when the fused op ran with the output head it
        wrote the pick there (the same values as ``greedy_sample``'s C++ call; wave 10), else the
        buffer keeps its -1 sentinel and :func:`greedy_sample` runs on the logits.
        """
        st = self._decode
        if st is None or len(st.seqs) != len(scheduled) or any(
                seq is not s for (seq, _), s in zip(scheduled, st.seqs)):
            st = None
        B = len(scheduled)
        adv = self._adv
        sum_ctx = 0
        if st is not None and adv is not None and adv[0] is self._meta:
            sum_ctx = self._advance(scheduled, adv)
        if sum_ctx:
            meta = adv[0]
            input_ids, input_pos = self._input_buffers[B][:2]
        else:
            self._adv = None
            ids: list[int] = []
            positions: list[int] = []
            chunks: list[tuple[list[int], int, int, bool]] = []
            for seq, n in scheduled:
                c = seq.num_computed_tokens
                toks = seq.token_ids
                if n != 1 or c + 1 != len(toks):
                    self._decode = None
                    return None
                ids.append(toks[c])
                positions.append(c)
                chunks.append((seq.block_table, c, 1, False))
                sum_ctx += c + 1
            if st is None:
                st = self._decode = _DecodeBatch.of([seq for seq, _ in scheduled])
            meta = None
        # the estimate of a decode step is affine in the summed context (integer arithmetic, so
        # base + slope·Σctx is the estimate exactly); the pair is made once per batch size
        lin = self._decode_act.get(B)
        if lin is None:
            base = self.estimate_activation_bytes(B, B, 0, 0, 0)
            lin = self._decode_act[B] = (base, self.estimate_activation_bytes(B, B, 1, 1, 0) - base)
        act = lin[0] + lin[1] * sum_ctx
        handle = self.accountant.reserve_activations(act)
        try:
            if meta is None:
                meta = self._meta = AttentionMetadata.build(chunks, self.block_size, self.device, reuse=self._meta)
                input_ids, input_pos = self._inputs(ids, positions)
                if meta._np is not None and B in self._input_buffers:
                    bufs = self._input_buffers[B]
                    self._adv = (meta, bufs[2], bufs[3], [s.block_table for s in st.seqs],
                                 list(positions))
            with torch.inference_mode():
                gbuf = None
                if st.plain_greedy and self.model is self._greedy_model:
                    # the fused op writes the greedy pick into this buffer when it runs with the head;
                    # -1 (no token) stays when the step took another path: greedy_sample then
                    gbuf = self._greedy_bufs.get(B)
                    if gbuf is None:
                        t = torch.empty(2 * B, dtype=torch.float64)
                        gbuf = self._greedy_bufs[B] = (t, t.numpy())
                    gbuf[1][0] = -1.0
                    logits = self.model(input_ids, input_pos, self.kv_cache, meta, greedy_out=gbuf[0])
                else:
                    logits = self.model(input_ids, input_pos, self.kv_cache, meta)
                sample = None
                if gbuf is not None and gbuf[1][0] >= 0.0:
                    sample = greedy_from_pairs(gbuf[0].tolist())
                elif st.plain_greedy and logits.dtype == torch.float32:
                    sample = greedy_sample(logits, self._greedy_ops)
                if sample is None:
                    sample = self.sampler(logits, st.params, st.generators, st.histories, st.prompt_lens)
        finally:
            self.accountant.release_activations(handle)
        return StepResult(st.seqs, sample, B, act)

    def _advance(self, scheduled: list[tuple[Sequence, int]], adv: tuple) -> int:
        """The in-place advance of a decode step over the last decode step's running set (the same
        sequences in the same order, each one token further in the same blocks): rewrites the
        metadata's slot and context length of each row, its ``max_context`` and host copy, and the
        persistent ``input_ids``/``positions`` in place (the block tables, ``query_start_loc`` and
        ``logits_indices`` are the same numbers), instead of building them.

        Applies when every row is a decode (one new token, its last) whose cached count is the last
        step's + 1, not at a block boundary (``c % block_size != 0``: the same blocks hold the
        context) and with the same block-table list object (tables grow by appending; a freed or
        preempted sequence gets a new list, and spec decode's in-place truncate runs after a general
        step, which drops ``adv``), and the metadata never made its gather-path fields. Returns the
        step's summed context (> 0), or 0 when it does not apply (the rows written so far are
        rewritten in full by the build that follows).
        """
        meta, ids_np, pos_np, tables, cs = adv
        npv = meta._np
        if meta._plain_ready or npv is None:
            return 0
        bs = self.block_size
        B = len(scheduled)
        lens_at = 2 * B + 1   # the flat buffer: slot_mapping [B], query_start_loc [B+1], seq_lens [B], …
        lens: list[int] = []
        sum_ctx = 0
        for i, (seq, n) in enumerate(scheduled):
            c = seq.num_computed_tokens
            toks = seq.token_ids
            table = seq.block_table
            if n != 1 or c + 1 != len(toks) or c != cs[i] + 1 or c % bs == 0 or table is not tables[i]:
                return 0
            ids_np[i] = toks[c]
            pos_np[i] = c
            npv[i] = table[c // bs] * bs + c % bs
            npv[lens_at + i] = c + 1
            lens.append(c + 1)
            sum_ctx += c + 1
        for i in range(B):
            cs[i] += 1
        h = meta._host
        meta._host = (h[0], lens, h[2], h[3], h[4])
        meta.max_context = max(lens)
        return sum_ctx

    def _inputs(self, ids: list[int], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` and ``positions`` ([T] int64 each) of a step. On CPU a step of at most
        ``_MAX_BUFFERED_TOKENS`` tokens gets its size's persistent pair, filled in place (the model
        reads them within the forward only); otherwise one ``torch.tensor`` conversion."""
        T = len(ids)
        if self.device.type == "cpu" and T <= _MAX_BUFFERED_TOKENS:
            bufs = self._input_buffers.get(T)
            if bufs is None:
                ids_t = torch.empty(T, dtype=torch.long)
                pos_t = torch.empty(T, dtype=torch.long)
                bufs = self._input_buffers[T] = (ids_t, pos_t, ids_t.numpy(), pos_t.numpy())
            bufs[2][:] = ids
            bufs[3][:] = positions
            return bufs[0], bufs[1]
        ids_pos = torch.tensor(ids + positions, dtype=torch.long, device=self.device)   # one conversion
        return ids_pos[:T], ids_pos[T:]

    @staticmethod
    def _score_prompt(logits: torch.Tensor, seq: Sequence, cached: int) -> list[PromptLogprobEntry]:
        """Prompt-logprob entries of positions ``cached + 1 … cached + m`` from ``logits``
        ``[m, V]`` (row j = position ``cached + j``): the actual token's :class:`Logprob`
        (rank = tokens whose logprob is >= its own) and the ``seq.prompt_logprobs_k`` most
        likely tokens (ranks 1…k)."""
        m = logits.shape[0]
        if m == 0:
            return []
        lp = torch.log_softmax(logits.float(), dim=-1)
        target = torch.tensor(seq.token_ids[cached + 1:cached + 1 + m], dtype=torch.long,
                              device=lp.device).unsqueeze(1)
        chosen = lp.gather(1, target)
        ranks = (lp >= chosen).sum(dim=-1).tolist()
        chosen_l = chosen.squeeze(1).tolist()
        target_l = seq.token_ids[cached + 1:cached + 1 + m]
        k = min(seq.prompt_logprobs_k or 0, lp.shape[1])
        if k:
            vals, top_ids = lp.topk(k, dim=-1)
            vals_l, ids_l = vals.tolist(), top_ids.tolist()
        entries: list[PromptLogprobEntry] = []
        for j in range(m):
            entry: PromptLogprobEntry = {target_l[j]: Logprob(chosen_l[j], ranks[j])}
            if k:
                for r, (t, v) in enumerate(zip(ids_l[j], vals_l[j]), start=1):
                    entry.setdefault(t, Logprob(v, r))
            entries.append(entry)
        return entries
