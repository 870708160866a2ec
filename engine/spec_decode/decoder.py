"""SpecDecoder: speculative decoding inside the engine step (propose → verify → commit).

The engine step with speculation (vLLM's v1 design, one forward of the target per step):

1. **propose** (after the scheduler's choice): every scheduled sequence *in decode* (one new
   token, at least one output token; prefill chunks never speculate) gets up to k draft tokens
   from the proposer, capped so the request can never emit more than ``max_tokens`` (k <=
   tokens left - 1) and the step stays within ``max_num_batched_tokens``. Its KV slots for the
   k extra positions are allocated on top of the scheduler's one; when the pool cannot hold them
   the sequence simply decodes without drafts this step (speculation never preempts). The
   scheduler reserved the k tokens in the step's budget before prefills
   (``Scheduler.num_speculative_tokens``), so a burst of prefills does not starve the drafts.
   A draft forward that runs out of memory (the accountant's reservation, an injected fault or
   CUDA) is an OOM fault like the engine's others: recorded in ``it.ooms`` (action
   ``skip_drafts``; ``empty_cache()`` first for fragmentation), its KV slots given back, and
   the step runs without drafts, so no request is lost or re-queued.
2. **verify**: the runner feeds ``[last token, d_1 … d_k]`` as one chunk over the paged cache
   and returns the k+1 logits rows (all sequences, drafts of different lengths, prefill chunks
   and plain decodes in the same packed batch). :mod:`.rejection` picks the emitted tokens:
   greedy rows exactly as non-speculative decoding, sampled rows by speculative sampling.
3. **commit**: the accepted drafts' KV entries stay (``num_computed_tokens += accepted``); the
   rejected positions' slots are handed back (:meth:`BlockManager.truncate`). The emitted
   tokens are committed one at a time through the engine's own commit (stop token, stop
   strings, max_tokens, repetition stop), so a request that finishes on its second emitted
   token never emits the third; the increments of one request are merged into one output.

Logprobs of emitted tokens come from the target's raw logits at their position (the same
``raw_logprobs`` as without speculation).

Precision. ``int8_self`` drafting pauses while the target itself runs in int8: the draft is
then the same computation as the target, so the k draft forwards cost as much as k target
steps and buy nothing (measured, docs/speculative-decoding.md); it resumes at rollback to
full precision (the draft cache catches up on the tokens it missed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from inferctl.contract.oom import OOM_EXHAUSTION, OOM_FRAGMENTATION, classify_oom
from inferctl.contract.stats import ACTION_SKIP_DRAFTS, SOURCE_CUDA
from inferctl.engine.faults import oom_info_of
from inferctl.engine.oom import ERROR_OOM, classify_error
from inferctl.engine.sampler import SampleResult
from inferctl.engine.sequence import Sequence
from inferctl.engine.spec_decode.config import (METHOD_DRAFT_MODEL, METHOD_INT8_SELF, METHOD_NGRAM,
                                                SpeculativeConfig)
from inferctl.engine.spec_decode.proposers import DraftModelProposer, NgramProposer, build_int8_self_draft
from inferctl.engine.spec_decode.rejection import greedy_accept, rejection_sample, sanitize, target_probs
from inferctl.engine.stats import OomFault

log = logging.getLogger(__name__)

Drafts = dict[str, tuple[list[int], "torch.Tensor | None"]]


@dataclass(slots=True)
class Emitted:
    """What verification emitted for one sequence: tokens, their raw logprobs, top logprobs
    (None when not asked), whether each token's logits row was non-finite, drafts accepted."""

    tokens: list[int]
    logprobs: list[float]
    tops: list[dict[int, float]] | None
    dead: list[bool]
    accepted: int
    num_drafts: int


def _load_draft_model(path: str, target):
    from inferctl.engine.config import ConfigError
    from inferctl.engine.loader import load_model

    try:
        bundle = load_model(path, device=target.device, dtype=target.dtype)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError("speculative_config.model", f"cannot load the draft model: {err}") from None
    if bundle.args.vocab_size != target.args.vocab_size:
        raise ConfigError("speculative_config.model", f"the draft's vocabulary ({bundle.args.vocab_size} tokens) "
                          f"differs from the target's ({target.args.vocab_size}): the two must share a tokenizer")
    return bundle.model


def build_draft(cfg: SpeculativeConfig | None, model):
    """The draft model of ``cfg`` (``int8_self``: the target's int8 copy; ``draft_model``: the
    checkpoint loaded on the target's device and dtype), or None (speculation off, ``ngram``).
    Built before the memory plan, which sizes its weights and KV pool. Raises ConfigError
    (``speculative_config.model``) when a draft model cannot be loaded or does not share the
    target's vocabulary."""
    if cfg is None or cfg.method == METHOD_NGRAM:
        return None
    return build_int8_self_draft(model) if cfg.method == METHOD_INT8_SELF else _load_draft_model(cfg.model, model)


class SpecDecoder:
    """Speculative decoding for one engine.

    Args:
        cfg: the validated :class:`SpeculativeConfig`.
        model: the target ``LlamaModel``.
        block_manager: the engine's block manager (drafts' KV slots are allocated and truncated there).
        sampler: the engine's sampler (greedy verification uses it, so argmax and logprobs are
            computed exactly as without speculation).
        plan: the engine's :class:`~inferctl.engine.memory_plan.MemoryPlan` (the draft's KV pool
            and the accountant its forwards reserve activations in); needed with a draft model.
        draft_model: what :func:`build_draft` returned (None for ``ngram``).
        max_tokens: the engine's ``max_num_batched_tokens`` (the cap of a draft catch-up forward).
    """

    def __init__(self, cfg: SpeculativeConfig, model, block_manager, sampler, plan=None, draft_model=None,
                 max_tokens: int | None = None):
        self.cfg = cfg
        self.k = cfg.num_speculative_tokens
        self.bm = block_manager
        self.sampler = sampler
        self.ngram: NgramProposer | None = None
        self.draft: DraftModelProposer | None = None
        self.accountant = plan.accountant if plan is not None else None
        if cfg.method == METHOD_NGRAM:
            self.ngram = NgramProposer(cfg.prompt_lookup_max, cfg.prompt_lookup_min)
        else:
            if draft_model is None or plan is None or plan.draft_kv_cache is None:
                raise ValueError(f"speculative method {cfg.method!r} needs the draft model and the memory "
                                 "plan's draft KV pool")
            self.draft = DraftModelProposer(draft_model, plan.draft_kv_cache, block_manager.block_size,
                                            self.accountant, max_tokens)
        self.device = torch.device(model.device)
        self._gen = torch.Generator(device=self.device)
        self._gen.seed()
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.k
        self.draft_errors = 0
        self.last_draft_error: str | None = None
        self.draft_ooms = 0
        self.memory = ({} if plan is None else
                       {"draft_weights_bytes": plan.draft_weights_bytes,
                        "draft_kv_pool_bytes": plan.num_kv_blocks * plan.draft_kv_bytes_per_block,
                        "draft_kv_bytes_per_block": plan.draft_kv_bytes_per_block,
                        "draft_profile_activation_bytes": plan.draft_profile_activation_bytes})

    # ------------------------------------------------------------------ state
    def paused_reason(self, precision: str) -> str | None:
        """Why drafting is paused now, or None: int8_self pauses while the target is int8."""
        if self.cfg.method == METHOD_INT8_SELF and precision == "int8":
            return "target_int8"
        return None

    def stats(self, precision: str) -> dict:
        """The ``/stats`` ``spec_decode`` section (counts since start; acceptance None = no data)."""
        return {**self.cfg.to_dict(), "paused": self.paused_reason(precision),
                "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "acceptance_rate": (self.num_accepted_tokens / self.num_draft_tokens
                                    if self.num_draft_tokens else None),
                "accepted_per_position": list(self.accepted_per_pos),
                "draft_errors": self.draft_errors, "last_draft_error": self.last_draft_error,
                "draft_ooms": self.draft_ooms, **self.memory}

    # ------------------------------------------------------------------ 1. propose
    def propose(self, scheduled: list[tuple[Sequence, int]], budget: int, precision: str,
                running: list[Sequence], it=None) -> Drafts | None:
        """Drafts for the decode sequences of ``scheduled`` (see the module docstring), their KV
        slots allocated. ``budget``: batched tokens left this step. None when nothing is drafted.
        A draft forward that runs out of memory is an OOM fault (recorded in ``it.ooms``, see the
        module docstring); one that raises anything else is logged and counted
        (``draft_errors``). Either way the step then runs without drafts (a draft failure never
        fails a request)."""
        if self.paused_reason(precision) is not None or budget < 1:
            return None
        bm = self.bm
        batch: list[tuple[Sequence, int]] = []
        out: Drafts = {}
        for seq, n in scheduled:
            if n != 1 or not seq.output_token_ids or seq.num_tokens - seq.num_computed_tokens != 1:
                continue
            k = min(self.k, seq.max_tokens - len(seq.output_token_ids) - 1, budget)
            if k < 1:
                continue
            if self.ngram is not None:
                d = self.ngram.propose(seq.token_ids, k)
                if d and bm.allocate(seq, 1 + len(d)):
                    out[seq.request_id] = (d, None)
                    budget -= len(d)
            elif bm.allocate(seq, 1 + k):
                batch.append((seq, k))
                budget -= k
            if budget < 1:
                break
        if self.draft is not None:
            if len(self.draft._state) > 2 * len(running) + 64:
                self.draft.forget({s.request_id for s in running})
            if batch:
                try:
                    out = self.draft.propose(batch)
                except Exception as err:   # noqa: BLE001 — a draft failure must not fail requests
                    self._draft_failed(err, batch, precision, it)
                    return None
                for seq, _ in batch:   # caught up partly this step: no drafts, slots given back
                    if seq.request_id not in out:
                        bm.truncate(seq, seq.num_computed_tokens + 1)
        return out or None

    def _draft_failed(self, err: BaseException, batch: list[tuple[Sequence, int]], precision: str, it) -> None:
        for seq, _ in batch:
            self.bm.truncate(seq, seq.num_computed_tokens + 1)
        msg = f"{type(err).__name__}: {err}"
        if classify_error(err, frozenset()) != ERROR_OOM:
            self.draft_errors += 1
            self.last_draft_error = msg
            log.warning("speculative draft failed, decoding without drafts: %s", msg)
            return
        self.draft_ooms += 1
        info = oom_info_of(err)
        kind = classify_oom(info) or OOM_EXHAUSTION
        if kind == OOM_FRAGMENTATION and self.accountant is not None:
            self.accountant.empty_cache()
        log.warning("speculative draft out of memory (%s), decoding without drafts: %s", kind, msg)
        if it is not None:
            it.ooms.append(OomFault(kind, info, info.message or str(err), 0, 0, precision,
                                    getattr(err, "oom_source", SOURCE_CUDA), ACTION_SKIP_DRAFTS))

    # ------------------------------------------------------------------ 2. verify
    def verify(self, rows: list[tuple[Sequence, torch.Tensor]], drafts: Drafts) -> list[tuple[Sequence, Emitted]]:
        """Emitted tokens of each verified sequence. ``rows``: (seq, logits [k+1, V]) from the
        runner, in batch order; ``drafts``: what :meth:`propose` returned."""
        greedy = [(s, lg) for s, lg in rows if s.params.is_greedy]
        result: dict[str, Emitted] = {}
        if greedy:
            result.update(self._verify_greedy(greedy, drafts))
        for seq, lg in rows:
            if not seq.params.is_greedy:
                d, q = drafts[seq.request_id]
                result[seq.request_id] = self._verify_sampled(seq, lg, d, q)
        return [(s, result[s.request_id]) for s, _ in rows]

    @staticmethod
    def _histories(seq: Sequence, d: list[int]) -> list[list[int]]:
        if not seq.params.has_penalties:
            return [seq.token_ids] * (len(d) + 1)
        return [seq.token_ids + d[:j] for j in range(len(d) + 1)]

    def _verify_greedy(self, rows: list[tuple[Sequence, torch.Tensor]], drafts: Drafts) -> dict[str, Emitted]:
        logits = torch.cat([lg for _, lg in rows]) if len(rows) > 1 else rows[0][1]
        params, hists, plens = [], [], []
        for seq, lg in rows:
            d = drafts[seq.request_id][0]
            params += [seq.params] * lg.shape[0]
            hists += self._histories(seq, d)
            plens += [len(seq.prompt_token_ids)] * lg.shape[0]
        sr = self.sampler(logits, params, [None] * len(params), hists, plens)
        dead_rows = set(sr.nonfinite_rows)
        out: dict[str, Emitted] = {}
        r = 0
        for seq, lg in rows:
            d = drafts[seq.request_id][0]
            m = lg.shape[0]
            target = list(sr.token_ids[r:r + m])
            dead = [(r + j) in dead_rows for j in range(m)]
            for j in range(m):
                if dead[j]:
                    target[j] = -1       # no draft matches a non-finite row: it ends the accepted run
            toks, a = greedy_accept(target, d)
            n = len(toks)
            toks[-1] = sr.token_ids[r + n - 1]
            tops = sr.top_logprobs[r:r + n] if sr.top_logprobs is not None else None
            out[seq.request_id] = Emitted(toks, sr.logprobs[r:r + n], tops, dead[:n], a, len(d))
            r += m
        return out

    def _verify_sampled(self, seq: Sequence, logits: torch.Tensor, d: list[int],
                        q: torch.Tensor | None) -> Emitted:
        work, dead_rows = sanitize(logits)
        cut = min(dead_rows) if dead_rows else len(d)
        d_used = d[:cut]
        p = target_probs(work[:cut + 1], seq.params, self._histories(seq, d_used), len(seq.prompt_token_ids))
        gen = seq.generator if seq.generator is not None else self._gen
        toks, a = rejection_sample(p, d_used, None if q is None else q[:cut], gen)
        dead = [False] * len(toks)
        if dead_rows and len(toks) == cut + 1:
            toks[-1], dead[-1] = 0, True
        raw = torch.log_softmax(logits[:len(toks)].float(), dim=-1)
        lps = raw.gather(1, torch.tensor(toks, device=raw.device).unsqueeze(1)).squeeze(1).tolist()
        tops = None
        k = seq.params.logprobs
        if k is not None:
            tops = [{} for _ in toks]
            if k > 0:
                vals, ids = raw.topk(min(k, raw.shape[1]), dim=-1)
                tops = [dict(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]
        return Emitted(toks, [float(x) for x in lps], tops, dead, a, len(d))

    # ------------------------------------------------------------------ 3. commit
    def apply(self, verified: list[tuple[Sequence, Emitted]], it) -> None:
        """Keep the accepted drafts' KV (``num_computed_tokens += accepted``; the engine already
        counted the step's first token), give the rejected slots back, count the step in ``it``."""
        for seq, em in verified:
            seq.num_computed_tokens += em.accepted
            self.bm.truncate(seq, seq.num_computed_tokens)
            if self.draft is not None:
                self.draft.accepted(seq)
            self.num_drafts += 1
            self.num_draft_tokens += em.num_drafts
            self.num_accepted_tokens += em.accepted
            for j in range(em.accepted):
                self.accepted_per_pos[j] += 1
            it.spec_num_drafts += 1
            it.spec_num_draft_tokens += em.num_drafts
            it.spec_num_accepted_tokens += em.accepted
            it.spec_accepted_positions.extend(range(em.accepted))

    @staticmethod
    def commit(verified: list[tuple[Sequence, Emitted]], commit_samples, now: float, it, outputs: list) -> int:
        """Commit the emitted tokens one position at a time through ``commit_samples`` (the
        engine's ``_commit_samples(seqs, SampleResult, now, it, outputs)``), skipping sequences
        that finished on an earlier token; merge each request's outputs into one. Returns the
        number of tokens committed."""
        mine: list = []
        committed = 0
        j = 0
        while True:
            live = [(s, e) for s, e in verified if len(e.tokens) > j and not s.is_finished]
            if not live:
                break
            tops = None
            if any(e.tops is not None for _, e in live):
                tops = [e.tops[j] if e.tops is not None else {} for _, e in live]
            sr = SampleResult([e.tokens[j] for _, e in live], [e.logprobs[j] for _, e in live], tops,
                              [i for i, (_, e) in enumerate(live) if e.dead[j]])
            commit_samples([s for s, _ in live], sr, now, it, mine)
            committed += len(live)
            j += 1
        outputs.extend(merge_outputs(mine))
        return committed


def merge_outputs(outputs: list) -> list:
    """Merge consecutive ``RequestOutput`` increments of the same request (in first-seen order):
    token ids, text, logprobs and top logprobs concatenated; finish state and counts from the
    last; prompt logprobs from the first."""
    merged: dict[str, object] = {}
    for out in outputs:
        first = merged.get(out.request_id)
        if first is None:
            merged[out.request_id] = out
            continue
        first.new_token_ids = first.new_token_ids + out.new_token_ids
        first.new_text += out.new_text
        first.logprobs = first.logprobs + out.logprobs
        if out.top_logprobs is not None:
            first.top_logprobs = (first.top_logprobs or []) + out.top_logprobs
        for name in ("finished", "finish_reason", "completion_tokens", "error", "error_status"):
            setattr(first, name, getattr(out, name))
    return list(merged.values())


def create(cfg: SpeculativeConfig | None, model, block_manager, sampler, plan=None, draft_model=None,
           max_tokens: int | None = None) -> SpecDecoder | None:
    """A :class:`SpecDecoder` for ``cfg``, or None when speculation is off (arguments as
    :class:`SpecDecoder`). Raises ValueError for an unknown method."""
    if cfg is None:
        return None
    if cfg.method not in (METHOD_NGRAM, METHOD_INT8_SELF, METHOD_DRAFT_MODEL):
        raise ValueError(f"unknown speculative method {cfg.method!r}")
    return SpecDecoder(cfg, model, block_manager, sampler, plan, draft_model, max_tokens)
