"""ModelRunner: turns one scheduled step into model inputs, runs the forward, samples.

Per step: the scheduled ``(sequence, new_tokens)`` pairs become one packed batch (no padding):
``input_ids[T]``, ``positions[T]`` and ``AttentionMetadata`` built from each sequence's
``(block_table, num_computed_tokens, new_tokens, all_logits=False)``. The step's activations
are reserved through the :class:`~engine.memory.MemoryAccountant` before the forward and
released after (so a step that does not fit raises ``torch.OutOfMemoryError`` before any
state changes). Only sequences whose prefill is complete after this step (the chunk reaches
the last token) are sampled. Tiny models are bound by per-step Python work (PERFORMANCE.md),
so the loop builds plain lists and converts each to a tensor once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata, KVCache
from engine.memory import MemoryAccountant, estimate_step_activation_bytes
from engine.sampler import Sampler, SampleResult
from engine.sequence import Sequence


@dataclass
class StepResult:
    """What one forward produced.

    Attributes:
        sampled: the sequences that got a new token, in batch order.
        sample: the sampler's result for ``sampled`` (row i ↔ sampled[i]); None if none.
        num_tokens: T, tokens fed (all real: the batch is packed, padded tokens = 0).
        activation_bytes: the step's reserved activation estimate.
    """

    sampled: list[Sequence]
    sample: SampleResult | None
    num_tokens: int
    activation_bytes: int


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

    def estimate_activation_bytes(self, num_tokens: int, num_logits: int, sum_q_ctx: int,
                                  sum_ctx: int) -> int:
        """The accountant's activation estimate for a step of this shape (see
        :func:`engine.memory.estimate_step_activation_bytes`)."""
        return estimate_step_activation_bytes(num_tokens, num_logits, sum_q_ctx, sum_ctx,
                                              **self._dims)

    def execute(self, scheduled: list[tuple[Sequence, int]]) -> StepResult:
        """Run one step. Does not change the sequences (the engine commits the result).

        Raises ``torch.OutOfMemoryError`` (budget, injected or CUDA) and whatever the model
        raises; the caller decides what to do with the step's sequences.
        """
        ids: list[int] = []
        positions: list[int] = []
        chunks: list[tuple[list[int], int, int, bool]] = []
        sampled: list[Sequence] = []
        rows: list[int] = []
        sum_q_ctx = sum_ctx = 0
        for row, (seq, n) in enumerate(scheduled):
            c = seq.num_computed_tokens
            end = c + n
            if n == 1:
                ids.append(seq.token_ids[c])
                positions.append(c)
            else:
                ids.extend(seq.token_ids[c:end])
                positions.extend(range(c, end))
            chunks.append((seq.block_table, c, n, False))
            sum_q_ctx += n * end
            sum_ctx += end
            if end == len(seq.token_ids):
                sampled.append(seq)
                rows.append(row)
        T = len(ids)
        act = self.estimate_activation_bytes(T, len(chunks), sum_q_ctx, sum_ctx)
        handle = self.accountant.reserve_activations(act)
        try:
            dev = self.device
            meta = AttentionMetadata.build(chunks, self.block_size, dev)
            with torch.inference_mode():
                logits = self.model(torch.tensor(ids, dtype=torch.long, device=dev),
                                    torch.tensor(positions, dtype=torch.long, device=dev),
                                    self.kv_cache, meta)
                if not sampled:
                    return StepResult(sampled, None, T, act)
                if len(rows) != len(chunks):
                    logits = logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=dev))
                sample = self.sampler(logits, [s.params for s in sampled],
                                      [s.generator for s in sampled],
                                      [s.token_ids for s in sampled],
                                      [len(s.prompt_token_ids) for s in sampled])
        finally:
            self.accountant.release_activations(handle)
        return StepResult(sampled, sample, T, act)
