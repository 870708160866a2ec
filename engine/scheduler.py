"""Scheduler: continuous (iteration-level) batching over a paged KV cache.

Follows vLLM's unified (v1) scheduler: each sequence has ``num_computed_tokens`` and
``num_tokens``; every step gives each scheduled sequence ``min(remaining, budget)`` new tokens,
so prefill chunks and decodes share one batch under ``max_num_batched_tokens``.

Order per step:
1. the running queue (kept sorted by arrival time, FCFS): decodes and unfinished prefill
   chunks. When the free list cannot hold a sequence's new tokens, the most recently arrived
   running sequence is preempted by recompute (blocks freed, ``num_computed_tokens = 0``,
   put at the front of the waiting queue), until the sequence fits or is itself the victim.
   With speculative decoding (``num_speculative_tokens`` = k > 0), once the running queue is
   scheduled, its decodes' draft tokens (k each, at most ``max_tokens - generated - 1``) are
   reserved in the step's budget before the waiting queue's prefills take it (vLLM schedules
   draft tokens with the decode); the engine's proposer finds them in the budget left
   (:mod:`inferctl.engine.spec_decode`). Running sequences' own tokens come first;
2. the waiting queue (FCFS, preempted sequences first), while the token budget, the free list
   and ``max_num_seqs`` allow and no preemption happened in this step (as vLLM does, to avoid
   admitting work that would be preempted next step).

Admission (:meth:`Scheduler.check_admission`) rejects — never clamps — a request that cannot
complete: prompt + max_tokens above ``max_model_len``, or more KV blocks than the whole pool
(docs/field-cases.md, admission). Rejecting keeps ``max_tokens`` meaning what the client asked for; a clamped
request would silently return less than asked.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field

from inferctl.engine.block_manager import BlockManager
from inferctl.engine.sequence import Sequence, SequenceStatus


class AdmissionError(Exception):
    """A request the engine will not take. ``status`` is the HTTP status the server answers
    (400 invalid request, 503 draining), ``field`` the request field at fault (or None)."""

    def __init__(self, status: int, field: str | None, message: str):
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message


@dataclass
class SchedulerOutput:
    """One step's work: ``scheduled`` pairs (sequence, new tokens), in batch order."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


def _arrival(seq: Sequence) -> float:
    return seq.arrival_time


class Scheduler:
    """Waiting and running queues over a :class:`BlockManager`.

    Args:
        max_model_len: longest sequence admitted (tokens).
        max_num_seqs: most sequences in the running queue.
        max_num_batched_tokens: per-step token budget.
        block_manager: the KV pool's free list.
    """

    def __init__(self, max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int,
                 block_manager: BlockManager):
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions_total = 0
        self.num_speculative_tokens = 0   # draft tokens reserved per decode (set by the engine)

    # ------------------------------------------------------------------ admission
    def check_admission(self, prompt_len: int, max_tokens: int | None) -> int:
        """Validate a request's size; return the resolved ``max_tokens``.

        ``max_tokens=None`` means "as many as fit" (max_model_len and the KV pool). Raises :class:`AdmissionError`
        (status 400) naming the numbers: ``prompt P + max_tokens M = S > max_model_len L``, or
        ``... needs B KV blocks of 16 tokens > N blocks in the KV cache``. Policy: reject, not
        clamp (see the module docstring).
        """
        L = self.max_model_len
        if prompt_len < 1:
            raise AdmissionError(400, "prompt", "prompt is empty: at least 1 token is needed")
        if max_tokens is None:
            bm = self.block_manager
            max_tokens = min(L - prompt_len, bm.num_blocks * bm.block_size - prompt_len + 1)
            if max_tokens < 1:
                raise AdmissionError(400, "prompt", f"prompt {prompt_len} tokens leaves no room "
                                     f"to generate: max_model_len is {L}")
        if max_tokens < 1:
            raise AdmissionError(400, "max_tokens", f"max_tokens must be >= 1, got {max_tokens}")
        total = prompt_len + max_tokens
        if total > L:
            fld = "prompt" if prompt_len >= L else "max_tokens"
            raise AdmissionError(400, fld, f"prompt {prompt_len} + max_tokens {max_tokens} = {total} "
                                 f"> max_model_len {L} tokens")
        bm = self.block_manager
        prompt_blocks = bm.blocks_needed(prompt_len)
        if prompt_blocks > bm.num_blocks:
            raise AdmissionError(400, "prompt", f"prompt {prompt_len} tokens needs {prompt_blocks} "
                                 f"KV blocks of {bm.block_size} tokens > {bm.num_blocks} blocks "
                                 "in the KV cache")
        # the last generated token is never fed back, so the cache holds total - 1 tokens
        total_blocks = bm.blocks_needed(total - 1)
        if total_blocks > bm.num_blocks:
            raise AdmissionError(400, "max_tokens", f"prompt {prompt_len} + max_tokens {max_tokens} "
                                 f"needs {total_blocks} KV blocks of {bm.block_size} tokens > "
                                 f"{bm.num_blocks} blocks in the KV cache")
        return max_tokens

    def add(self, seq: Sequence) -> None:
        """Queue an admitted sequence (FCFS)."""
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    # ------------------------------------------------------------------ scheduling
    def schedule(self) -> SchedulerOutput:
        """Choose this step's sequences and token counts and reserve their KV slots."""
        out = SchedulerOutput()
        scheduled = out.scheduled
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        running = self.running
        prefill = decode = drafts = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            remaining = seq.num_tokens - seq.num_computed_tokens
            if remaining <= 0:
                i += 1
                continue
            n = remaining if remaining < budget else budget
            ok = bm.allocate(seq, n)
            while not ok:
                victim = running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
                ok = bm.allocate(seq, n)
            if not ok:
                break
            scheduled.append((seq, n))
            budget -= n
            if remaining == 1 and seq.output_token_ids:
                decode += 1
                drafts += max(0, min(self.num_speculative_tokens, seq.max_tokens - len(seq.output_token_ids) - 1))
            else:
                prefill += n
            i += 1

        budget -= min(budget, drafts)   # the decodes' draft tokens, before the waiting prefills
        if not out.preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < self.max_num_seqs:
                seq = waiting[0]
                n = bm.allocate_waiting(seq, budget)   # prefix-cache hits skip their prefill
                if n is None:
                    break
                waiting.popleft()
                seq.status = SequenceStatus.RUNNING
                if seq.scheduled_time is None:
                    seq.scheduled_time = time.monotonic()
                if running and running[-1].arrival_time > seq.arrival_time:
                    bisect.insort(running, seq, key=_arrival)
                else:
                    running.append(seq)
                scheduled.append((seq, n))
                budget -= n
                prefill += n
        out.num_prefill_tokens = prefill
        out.num_decode_tokens = decode
        return out

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        seq.num_preemptions += 1
        self.preemptions_total += 1
        self.waiting.appendleft(seq)

    # ------------------------------------------------------------------ changes between steps
    def requeue(self, seqs: list[Sequence]) -> None:
        """Put ``seqs`` back at the front of the waiting queue, arrival order kept, with their
        blocks freed (recompute). Used when a step fails (OOM)."""
        for seq in seqs:
            if seq in self.running:
                self.running.remove(seq)
            self.block_manager.free(seq)
            seq.reset_for_recompute()
        for seq in sorted(seqs, key=_arrival, reverse=True):
            if seq not in self.waiting:
                self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished sequence from whichever queue holds it and free its blocks."""
        try:
            self.running.remove(seq)
        except ValueError:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.block_manager.free(seq)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)
