"""BlockManager: the paged KV cache's free list and per-sequence block tables (vLLM's names).

The pool holds ``num_blocks`` blocks of ``block_size`` token slots. A sequence's
``block_table`` lists its physical blocks in order; token ``i`` of the sequence lives in slot
``block_table[i // block_size] * block_size + i % block_size`` (the slot mapping). Blocks are
handed out from a free list and returned when a sequence finishes or is preempted.

With automatic prefix caching (:mod:`inferctl.engine.prefix_cache`, on by default) blocks
are reference-counted and full blocks are shared between sequences with the same token
prefix; a cached block no sequence references counts as free (evictable), and a shared block's
tokens count once in ``tokens_stored``.

Internal waste (docs/design.md, signals): ``1 − tokens stored / (blocks used × block_size)``, the
unused tail slots of each sequence's last block; ``None`` when no block is used.
"""

from __future__ import annotations

from inferctl.engine.prefix_cache import PrefixCachePool
from inferctl.engine.sequence import Sequence


class BlockManager:
    """Free list and block tables for a pool of ``num_blocks`` × ``block_size`` slots.

    Raises ``ValueError`` for a non-positive pool or block size.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.pool = PrefixCachePool(num_blocks, block_size, enable_prefix_caching)
        self._tokens: dict[str, int] = {}
        self._tokens_total = 0

    # -- numbers
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free_blocks

    @property
    def tokens_stored(self) -> int:
        """Token slots reserved for sequences (their K/V are in the cache after the step); a
        block shared by several sequences counts once."""
        return self._tokens_total - self.pool.tokens_shared

    @property
    def usage_ratio(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def waste_ratio(self) -> float | None:
        return self.kv_ratios(self.num_used_blocks, self.tokens_stored)[1]

    def kv_ratios(self, used: int, tokens_stored: int) -> tuple[float, float | None]:
        """``(usage, waste)`` of a pool with ``used`` blocks holding ``tokens_stored`` tokens:
        ``used / num_blocks`` and ``1 - tokens / (used * block_size)`` (None with no used
        block) — the two ratios of the module docstring, from numbers read earlier (the
        ``/metrics`` gauges compute them at scrape time from the step's snapshot)."""
        waste = None if used == 0 else 1.0 - tokens_stored / (used * self.block_size)
        return used / self.num_blocks, waste

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ceil(num_tokens / block_size)."""
        return -(-num_tokens // self.block_size)

    # -- allocation
    def _new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        return self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether the free list can hold ``num_new_tokens`` more tokens of ``seq``."""
        return self._new_blocks(seq, num_new_tokens) <= self.pool.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give ``seq`` slots for tokens ``[num_computed_tokens, num_computed_tokens + n)``.

        Returns False (and changes nothing) when the free list is too short.
        """
        need = self._new_blocks(seq, num_new_tokens)
        if need > self.pool.num_free_blocks:
            return False
        if need > 0:
            seq.block_table.extend(self.pool.take(need))
        total = seq.num_computed_tokens + num_new_tokens
        self.pool.register(seq.request_id, seq.block_table, seq.token_ids, total)
        old = self._tokens.get(seq.request_id, 0)
        if total > old:
            self._tokens[seq.request_id] = total
            self._tokens_total += total - old
        return True

    def append_slot(self, seq: Sequence) -> bool:
        """One more token (a decode step). Returns False when no block is free."""
        return self.allocate(seq, 1)

    def free(self, seq: Sequence) -> None:
        """Return all of ``seq``'s blocks to the free list and clear its block table (its
        computed full blocks stay cached, evictable)."""
        if seq.block_table:
            self.pool.unpublish_uncomputed(seq.request_id, seq.block_table, seq.num_computed_tokens)
            self.pool.release(seq.block_table)
            seq.block_table = []
        self.pool.forget(seq.request_id)
        self._tokens_total -= self._tokens.pop(seq.request_id, 0)

    def truncate(self, seq: Sequence, num_tokens: int) -> int:
        """Rollback (speculative decoding): keep slots for ``seq``'s first ``num_tokens`` tokens
        and give the blocks past them back (rejected draft tokens' slots). The table list is
        changed in place. Returns the number of blocks given back."""
        keep = self.blocks_needed(max(0, num_tokens))
        extra = seq.block_table[keep:]
        if extra:
            self.pool.release(extra)
            del seq.block_table[keep:]
        old = self._tokens.get(seq.request_id, 0)
        if old > num_tokens:
            self._tokens[seq.request_id] = num_tokens
            self._tokens_total -= old - num_tokens
        return len(extra)

    def allocate_waiting(self, seq: Sequence, budget: int) -> int | None:
        """Admit a waiting sequence: take its cached leading blocks (prefix caching; not for a
        request that wants prompt logprobs, which needs every prompt position's logits), then
        slots for ``min(remaining, budget)`` new tokens. Returns that token count, or None
        (and changes nothing) when the free list is too short."""
        hit: list[int] | None = None
        if not seq.block_table and seq.num_computed_tokens == 0 and not seq.wants_prompt_logprobs:
            hit = self.pool.lookup(seq.request_id, seq.token_ids)
            seq.block_table = list(hit)
            seq.num_computed_tokens = len(hit) * self.block_size
        remaining = seq.num_tokens - seq.num_computed_tokens
        n = min(remaining, budget)
        if self.allocate(seq, n):
            return n
        if hit is not None:
            self.pool.undo_lookup(seq.request_id, hit, seq.num_tokens)
            seq.block_table = []
            seq.num_computed_tokens = 0
        return None

    def reset_prefix_cache(self) -> int:
        """Invalidate every cached block (weights changed); returns how many were cached."""
        return self.pool.reset()

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Flat KV slots of tokens ``[start, end)`` of ``seq``. Raises ``IndexError`` when a
        token has no block."""
        bs, table = self.block_size, seq.block_table
        if end > len(table) * bs:
            raise IndexError(f"token {end - 1} of {seq.request_id!r} has no block "
                             f"({len(table)} blocks of {bs})")
        return [table[i // bs] * bs + i % bs for i in range(start, end)]
