"""The prefix-cache block pool and its use by the block manager: hashes, reference counts,
LRU eviction, the last-token rule, invalidation, and the usage/waste accounting."""

from __future__ import annotations

import pytest

from inferctl.engine.block_manager import BlockManager
from inferctl.engine.prefix_cache import hash_block
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.sequence import Sequence

BS = 4


def seq(rid: str, ids: list[int]) -> Sequence:
    return Sequence(rid, ids, SamplingParams(max_tokens=4), 4, 0.0, 0.0)


def run_prefill(bm: BlockManager, s: Sequence) -> int:
    """Admit ``s`` and pretend its whole prompt was computed; returns the tokens scheduled.
    The blocks are published when the sequence next allocates (here: 0 more tokens), as in
    the engine's next step."""
    n = bm.allocate_waiting(s, 10_000)
    assert n is not None
    s.num_computed_tokens += n
    assert bm.allocate(s, 0)
    return n


def test_hash_chains_the_parent():
    a = hash_block(None, (1, 2, 3, 4))
    assert hash_block(a, (5, 6, 7, 8)) != hash_block(None, (5, 6, 7, 8))
    assert hash_block(None, (1, 2, 3, 4)) == a


def test_a_request_in_the_same_step_shares_blocks_being_computed():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = seq("a", list(range(1, 10)))
    assert bm.allocate_waiting(a, 10_000) == 9       # publishes its 2 full blocks for this step
    b = seq("b", list(range(1, 10)))
    assert bm.allocate_waiting(b, 10_000) == 1       # same step: reads them after a writes them
    assert b.block_table[:2] == a.block_table[:2]


def test_a_failed_step_unpublishes_what_it_did_not_compute():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = seq("a", list(range(1, 14)))
    assert bm.allocate_waiting(a, 6) == 6             # chunk of 6: block 0 full → published
    a.num_computed_tokens = 6
    assert bm.allocate(a, 7)                          # next chunk publishes blocks 1 and 2 ...
    assert bm.pool.num_cached_blocks == 3
    bm.free(a)                                        # ... but that step failed (requeue/error)
    a.reset_for_recompute()
    assert bm.pool.num_cached_blocks == 1             # only the computed block 0 stays
    assert run_prefill(bm, seq("b", list(range(1, 14)))) == 9


def test_draft_tokens_are_never_hashed():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = seq("a", list(range(1, 6)))                   # 5 tokens: block 0 full, block 1 has 1
    run_prefill(bm, a)
    assert bm.allocate(a, 4)                          # slots for 1 real + 3 draft tokens
    assert bm.pool.num_cached_blocks == 1             # block 1 is not full of real tokens


def test_second_request_shares_full_prefix_blocks_and_skips_their_prefill():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = seq("a", list(range(1, 11)))          # 10 tokens: 2 full blocks + 2
    assert run_prefill(bm, a) == 10
    b = seq("b", list(range(1, 9)) + [50, 51, 52])   # same first 8 tokens
    assert run_prefill(bm, b) == 3            # 8 tokens from the cache
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert bm.pool.ref[a.block_table[0]] == 2
    assert bm.pool.take_counters() == (21, 8)
    # a shared block counts once: 10 + 11 tokens minus the 8 shared
    assert bm.num_used_blocks == 4
    assert bm.tokens_stored == 13
    assert bm.waste_ratio == pytest.approx(1 - 13 / 16)


def test_the_last_token_is_never_taken_from_the_cache():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = seq("a", list(range(1, 9)))           # exactly 2 full blocks
    run_prefill(bm, a)
    bm.free(a)
    b = seq("b", list(range(1, 9)))
    assert run_prefill(bm, b) == 4            # block 2 recomputed (holds the last token)
    assert b.num_computed_tokens == 8


def test_no_caching_without_the_flag_and_for_prompt_logprobs():
    bm = BlockManager(16, BS)
    a = seq("a", list(range(1, 10)))
    run_prefill(bm, a)
    bm.free(a)
    assert run_prefill(bm, seq("b", list(range(1, 10)))) == 9
    assert bm.pool.take_counters() == (0, 0)
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    run_prefill(bm, a := seq("a", list(range(1, 10))))
    p = Sequence("p", list(range(1, 10)), SamplingParams(max_tokens=4, prompt_logprobs=1), 4, 0.0, 0.0,
                 prompt_logprobs_k=1)
    assert run_prefill(bm, p) == 9


def test_free_keeps_blocks_cached_and_counts_them_free():
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    a = seq("a", list(range(1, 10)))
    run_prefill(bm, a)
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 8 and bm.num_used_blocks == 0 and bm.waste_ratio is None
    assert bm.pool.num_cached_blocks == 2 and bm.pool.num_cached_free_blocks == 2
    assert all(bm.pool.ref[b] == 0 for b in table)


def test_eviction_is_least_recently_used_and_unhashed_blocks_go_first():
    bm = BlockManager(6, BS, enable_prefix_caching=True)
    pool = bm.pool
    old = seq("old", [1, 2, 3, 4, 9])         # block 0 cached, block 1 partial
    run_prefill(bm, old)
    bm.free(old)
    new = seq("new", [5, 6, 7, 8, 9])
    run_prefill(bm, new)
    bm.free(new)
    # free queue: the unhashed blocks first, then old's cached block, then new's
    order = list(pool._free)
    assert [pool._hash[b] is not None for b in order] == [False] * 4 + [True, True]
    # 5 blocks: the 4 unhashed ones, then the least recently used cached block (old's)
    taker = seq("t", [20] * 17)
    run_prefill(bm, taker)
    assert pool.evictions_total == 1
    bm.free(taker)
    assert run_prefill(bm, seq("n2", [5, 6, 7, 8, 30])) == 1    # new's block survived
    assert run_prefill(bm, seq("o2", [1, 2, 3, 4, 30])) == 5    # old's was evicted


def test_a_hit_refreshes_recency():
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    for rid, first in (("x", 1), ("y", 2)):
        s = seq(rid, [first] * 4 + [0])
        run_prefill(bm, s)
        bm.free(s)
    hit = seq("x2", [1] * 4 + [7])            # x's block is used again: now y's is the oldest
    assert run_prefill(bm, hit) == 1
    bm.free(hit)
    big = seq("big", [9] * 9)                 # 3 blocks: 2 unhashed, then y's (LRU)
    run_prefill(bm, big)
    assert bm.pool.evictions_total == 1
    bm.free(big)
    assert run_prefill(bm, seq("x3", [1] * 4 + [5])) == 1
    assert run_prefill(bm, seq("y3", [2] * 4 + [5])) == 5


def test_reference_counts_after_finish_and_preemption():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a, b = seq("a", list(range(1, 10))), seq("b", list(range(1, 10)))
    run_prefill(bm, a)
    run_prefill(bm, b)
    shared = a.block_table[0]
    assert bm.pool.ref[shared] == 2
    bm.free(b)                                # finish, abort and preemption all free this way
    b.reset_for_recompute()
    assert bm.pool.ref[shared] == 1 and b.block_table == []
    bm.free(a)
    assert bm.pool.ref[shared] == 0 and bm.num_used_blocks == 0
    assert bm.tokens_stored == 0


def test_failed_admission_changes_nothing():
    bm = BlockManager(3, BS, enable_prefix_caching=True)
    a = seq("a", [1, 2, 3, 4, 5])
    run_prefill(bm, a)                        # 2 blocks in use, 1 free
    bm.pool.take_counters()
    big = seq("big", [1, 2, 3, 4] + [8] * 10)   # hits 1 block, needs 3 more
    assert bm.allocate_waiting(big, 10_000) is None
    assert big.block_table == [] and big.num_computed_tokens == 0
    assert bm.pool.ref[a.block_table[0]] == 1
    assert bm.pool.take_counters() == (0, 0)


def test_reset_invalidates_everything_and_old_sequences_never_register():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = seq("a", list(range(1, 10)))
    run_prefill(bm, a)
    running = seq("r", list(range(20, 30)))
    run_prefill(bm, running)
    bm.free(a)
    assert bm.reset_prefix_cache() == 4
    assert bm.pool.num_cached_blocks == 0
    bm.free(running)                          # admitted before the reset: not published
    assert bm.pool.num_cached_blocks == 0
    assert run_prefill(bm, seq("a2", list(range(1, 10)))) == 9
