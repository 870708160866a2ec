"""Automatic prefix caching: the KV block pool with reference counts, block hashes and LRU
eviction (vLLM's automatic prefix caching, v1 ``BlockPool`` / ``KVCacheManager`` design:
https://docs.vllm.ai/en/latest/design/prefix_caching.html).

Every physical block has a reference count (the sequences whose block table holds it). A
*full* block whose K/V are computed gets a hash of ``(parent block's hash, the block's token
ids)``, so a hash names the whole token prefix up to the block's end; the map
``hash → block`` lets a new request reuse the leading full blocks of any earlier request with
the same prefix (its prefill of those tokens is skipped: ``num_computed_tokens`` starts past
them). The last token of a sequence is never taken from the cache: it must be computed to
get the logits of the next token, so at most ``(num_tokens - 1) // block_size`` blocks hit.

Free blocks (reference count 0) live in one queue in eviction order: blocks with no hash
first (they hold nothing reusable), then cached blocks least recently used first. A freed
sequence's blocks go to the queue's end in reverse order, so a prefix's root block is
evicted after its descendants (a descendant is unreachable without its parents anyway).
Taking a block for new tokens pops the queue's head and, when it is cached, evicts it (drops
its hash). A cache hit on a free cached block takes it out of the queue.

Accounting (what ``/stats``, ``/metrics`` and the controller's fragmentation signal read):
a cached block with no reference is **free** (evictable at no cost, as vLLM counts it);
``num_used_blocks`` are the blocks some sequence references. A block shared by ``r``
sequences stores its ``block_size`` tokens once: ``tokens_shared`` is the
``(r - 1) × block_size`` the block manager takes off its per-sequence token sum.

Publishing (vLLM's timing). A block is registered (hashed) when the scheduler allocates the
step that fills it with the sequence's own tokens (never a speculative draft's: only blocks
full of ``token_ids`` are hashed), so a request scheduled later in the same step already
shares it: the attention writes every new K/V of the packed batch into the pool before any
sequence reads it (:mod:`inferctl.engine.attention`). If that step fails (OOM, error), the
sequence is freed with ``num_computed_tokens`` not advanced and
:meth:`PrefixCachePool.unpublish_uncomputed` drops the hashes of the blocks it never
computed, so no unwritten slot stays published. :meth:`PrefixCachePool.reset`
drops every hash (the precision switch: new weights make every cached K/V stale) and bumps
a generation; sequences admitted before it never register their blocks (their K/V mix both
weights). A restart builds a new, empty pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

BlockHash = int


@dataclass
class _SeqCache:
    """Per-sequence caching state: the generation it was admitted in, the hashes of its
    leading blocks registered or hit so far (index i = block i)."""

    generation: int
    hashes: list[BlockHash] = field(default_factory=list)


def hash_block(parent: BlockHash | None, token_ids: tuple[int, ...]) -> BlockHash:
    """Hash of a full block: Python's ``hash`` of ``(parent hash, token ids)`` (ints and tuples
    of ints hash deterministically, no ``PYTHONHASHSEED`` salt). 64-bit; vLLM's default hash is
    the same kind of built-in hash (``sha256`` is its opt-in)."""
    return hash((parent, token_ids))


class PrefixCachePool:
    """The block pool of :class:`~inferctl.engine.block_manager.BlockManager`.

    Args:
        num_blocks: blocks in the pool (>= 1).
        block_size: tokens per block (>= 1).
        enable_caching: False keeps the reference counts and the free queue but never hashes,
            looks up or registers a block (plain paging).

    Raises ``ValueError`` when asked to take more blocks than are free or to release a block
    nobody references.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = bool(enable_caching)
        self.ref = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._seqs: dict[str, _SeqCache] = {}
        self.generation = 0
        self.tokens_shared = 0
        self.queries = 0          # tokens looked up (since the last take_counters)
        self.hits = 0             # of them, tokens found cached
        self.evictions_total = 0

    # -- numbers
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references (cached-but-free ones included: evictable)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a registered hash (in use or free)."""
        return len(self._cached)

    @property
    def num_cached_free_blocks(self) -> int:
        return sum(1 for b in self._free if self._hash[b] is not None)

    def take_counters(self) -> tuple[int, int]:
        """``(queries, hits)`` in tokens since the last call; resets them."""
        out = (self.queries, self.hits)
        self.queries = self.hits = 0
        return out

    # -- taking and releasing blocks
    def take(self, n: int) -> list[int]:
        """``n`` blocks from the head of the free queue (evicting cached ones), ref count 1."""
        if n > len(self._free):
            raise ValueError(f"cannot take {n} blocks: {len(self._free)} are free")
        out = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            h = self._hash[b]
            if h is not None:
                self._hash[b] = None
                if self._cached.get(h) == b:
                    del self._cached[h]
                self.evictions_total += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def _ref(self, b: int) -> None:
        if self.ref[b] == 0:
            del self._free[b]
        else:
            self.tokens_shared += self.block_size
        self.ref[b] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each of ``blocks`` (a sequence's table, in order); blocks that
        reach 0 join the free queue: unhashed ones at the head, cached ones at the tail, the
        table's last block first (so the prefix root is evicted last)."""
        for b in reversed(blocks):
            r = self.ref[b]
            if r <= 0:
                raise ValueError(f"block {b} released with reference count {r}")
            self.ref[b] = r - 1
            if r > 1:
                self.tokens_shared -= self.block_size
                continue
            self._free[b] = None
            if self._hash[b] is None:
                self._free.move_to_end(b, last=False)

    # -- prefix caching
    def _block_hashes(self, token_ids: list[int], start: int, count: int,
                      parent: BlockHash | None) -> Iterator[BlockHash]:
        bs = self.block_size
        for i in range(start, start + count):
            parent = hash_block(parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            yield parent

    def lookup(self, request_id: str, token_ids: list[int]) -> list[int]:
        """Reference and return the longest run of cached leading full blocks of ``token_ids``
        (at most ``(len - 1) // block_size``: the last token is always computed). Counts the
        query (``len(token_ids)`` tokens) and the hit tokens. Starts the sequence's state."""
        st = self._seqs[request_id] = _SeqCache(self.generation)
        if not self.enable_caching:
            return []
        max_blocks = (len(token_ids) - 1) // self.block_size
        hit: list[int] = []
        for h in self._block_hashes(token_ids, 0, max_blocks, None):
            b = self._cached.get(h)
            if b is None:
                break
            hit.append(b)
            st.hashes.append(h)
        for b in hit:
            self._ref(b)
        self.queries += len(token_ids)
        self.hits += len(hit) * self.block_size
        return hit

    def undo_lookup(self, request_id: str, blocks: list[int], num_tokens: int) -> None:
        """Give back what :meth:`lookup` of ``num_tokens`` tokens took when the sequence could
        not be scheduled after all (its counts too: it will be looked up again)."""
        self.release(blocks)
        self._seqs.pop(request_id, None)
        if self.enable_caching:
            self.queries -= num_tokens
            self.hits -= len(blocks) * self.block_size

    def register(self, request_id: str, block_table: list[int], token_ids: list[int],
                 num_tokens: int) -> None:
        """Hash and publish the sequence's blocks that are full of its own tokens once its first
        ``num_tokens`` are computed (at most ``len(token_ids)``: draft tokens never count). A
        hash already published keeps its first block (the duplicate stays private). Nothing
        for a sequence admitted before the last reset."""
        if not self.enable_caching:
            return
        st = self._seqs.get(request_id)
        if st is None:
            st = self._seqs[request_id] = _SeqCache(self.generation)
        if st.generation != self.generation:
            return
        full = min(num_tokens, len(token_ids)) // self.block_size
        full = min(full, len(block_table))
        have = len(st.hashes)
        if full <= have:
            return
        parent = st.hashes[-1] if st.hashes else None
        for i, h in enumerate(self._block_hashes(token_ids, have, full - have, parent), start=have):
            st.hashes.append(h)
            b = block_table[i]
            if h not in self._cached and self._hash[b] is None:
                self._cached[h] = b
                self._hash[b] = h

    def unpublish_uncomputed(self, request_id: str, block_table: list[int], num_computed_tokens: int) -> None:
        """Drop the hashes this sequence published for blocks past ``num_computed_tokens`` (a
        step that failed before computing them)."""
        st = self._seqs.get(request_id)
        if st is None:
            return
        for i in range(num_computed_tokens // self.block_size, min(len(st.hashes), len(block_table))):
            h, b = st.hashes[i], block_table[i]
            if self._cached.get(h) == b:
                del self._cached[h]
                self._hash[b] = None
        del st.hashes[num_computed_tokens // self.block_size:]

    def forget(self, request_id: str) -> None:
        """Drop a freed sequence's state (its blocks stay cached)."""
        self._seqs.pop(request_id, None)

    def reset(self) -> int:
        """Invalidate every cached block (the weights changed); returns how many were cached.
        Blocks in use stay with their sequences, unhashed; those sequences never register."""
        n = len(self._cached)
        for b in self._cached.values():
            self._hash[b] = None
            if self.ref[b] == 0:
                self._free.move_to_end(b, last=False)
        self._cached.clear()
        self.generation += 1
        return n
