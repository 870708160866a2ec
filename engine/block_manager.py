"""BlockManager: the paged KV cache's free list and per-sequence block tables (vLLM's names).

The pool holds ``num_blocks`` blocks of ``block_size`` token slots. A sequence's
``block_table`` lists its physical blocks in order; token ``i`` of the sequence lives in slot
``block_table[i // block_size] * block_size + i % block_size`` (the slot mapping). Blocks are
handed out from a free list and returned when a sequence finishes or is preempted.

Internal waste (docs/design.md, signals): ``1 − tokens stored / (blocks used × block_size)``, the
unused tail slots of each sequence's last block; ``None`` when no block is used.
"""

from __future__ import annotations

from inferctl.engine.sequence import Sequence


class BlockManager:
    """Free list and block tables for a pool of ``num_blocks`` × ``block_size`` slots.

    Raises ``ValueError`` for a non-positive pool or block size.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # pop() from the end hands out block 0 first
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tokens: dict[str, int] = {}
        self._tokens_total = 0

    # -- numbers
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def tokens_stored(self) -> int:
        """Token slots reserved for sequences (their K/V are in the cache after the step)."""
        return self._tokens_total

    @property
    def usage_ratio(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def waste_ratio(self) -> float | None:
        used = self.num_used_blocks
        if used == 0:
            return None
        return 1.0 - self._tokens_total / (used * self.block_size)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ceil(num_tokens / block_size)."""
        return -(-num_tokens // self.block_size)

    # -- allocation
    def _new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        return self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether the free list can hold ``num_new_tokens`` more tokens of ``seq``."""
        return self._new_blocks(seq, num_new_tokens) <= len(self._free)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give ``seq`` slots for tokens ``[num_computed_tokens, num_computed_tokens + n)``.

        Returns False (and changes nothing) when the free list is too short.
        """
        need = self._new_blocks(seq, num_new_tokens)
        if need > len(self._free):
            return False
        if need > 0:
            free = self._free
            seq.block_table.extend(free[-need:][::-1])
            del free[-need:]
        total = seq.num_computed_tokens + num_new_tokens
        old = self._tokens.get(seq.request_id, 0)
        if total > old:
            self._tokens[seq.request_id] = total
            self._tokens_total += total - old
        return True

    def append_slot(self, seq: Sequence) -> bool:
        """One more token (a decode step). Returns False when no block is free."""
        return self.allocate(seq, 1)

    def free(self, seq: Sequence) -> None:
        """Return all of ``seq``'s blocks to the free list and clear its block table."""
        if seq.block_table:
            self._free.extend(reversed(seq.block_table))
            seq.block_table = []
        self._tokens_total -= self._tokens.pop(seq.request_id, 0)

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Flat KV slots of tokens ``[start, end)`` of ``seq``. Raises ``IndexError`` when a
        token has no block."""
        bs, table = self.block_size, seq.block_table
        if end > len(table) * bs:
            raise IndexError(f"token {end - 1} of {seq.request_id!r} has no block "
                             f"({len(table)} blocks of {bs})")
        return [table[i // bs] * bs + i % bs for i in range(start, end)]
