"""BlockManager and Scheduler unit tests: block tables, waste, token budget, chunked prefill,
preemption order, admission (field case F14)."""

from __future__ import annotations

import pytest

from inferctl.engine.block_manager import BlockManager
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.scheduler import AdmissionError, Scheduler
from inferctl.engine.sequence import Sequence, SequenceStatus


def make_seq(rid: str, prompt_len: int, arrival: float, max_tokens: int = 16) -> Sequence:
    return Sequence(rid, list(range(3, 3 + prompt_len)), SamplingParams(max_tokens=max_tokens),
                    max_tokens, arrival, arrival)


def fake_step(out) -> None:
    """What the engine does after a forward: commit the chunks, give finished prefills a token."""
    for seq, n in out.scheduled:
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token(7, -0.1, 0.0)


# ---------------------------------------------------------------------------- block manager
def test_block_manager_tables_slots_and_waste():
    bm = BlockManager(num_blocks=8, block_size=16)
    s = make_seq("a", 20, 0.0)
    assert bm.allocate(s, 20)
    assert s.block_table == [0, 1]
    assert bm.num_used_blocks == 2 and bm.num_free_blocks == 6
    assert bm.tokens_stored == 20
    assert bm.waste_ratio == pytest.approx(1 - 20 / 32)
    assert bm.usage_ratio == pytest.approx(2 / 8)
    assert bm.slot_mapping(s, 14, 18) == [14, 15, 16, 17]
    s.num_computed_tokens = 20
    assert bm.append_slot(s)                      # token 21 still fits in block 1
    assert s.block_table == [0, 1] and bm.tokens_stored == 21
    t = make_seq("b", 100, 1.0)
    assert not bm.can_allocate(t, 100)            # needs 7 blocks, 6 free
    assert not bm.allocate(t, 100)
    assert t.block_table == [] and bm.num_free_blocks == 6   # nothing changed
    assert bm.allocate(t, 96)
    assert bm.num_free_blocks == 0
    assert bm.waste_ratio == pytest.approx(1 - (21 + 96) / (8 * 16))
    bm.free(s)
    assert s.block_table == [] and bm.num_free_blocks == 2 and bm.tokens_stored == 96
    bm.free(t)
    assert bm.num_used_blocks == 0 and bm.waste_ratio is None and bm.tokens_stored == 0
    with pytest.raises(IndexError):
        bm.slot_mapping(s, 0, 1)
    with pytest.raises(ValueError):
        BlockManager(0, 16)


# ---------------------------------------------------------------------------- scheduling
def test_token_budget_chunked_prefill_and_mixed_batches():
    bm = BlockManager(64, 16)
    sch = Scheduler(max_model_len=512, max_num_seqs=8, max_num_batched_tokens=64, block_manager=bm)
    a, b, c = make_seq("a", 50, 0.0), make_seq("b", 40, 1.0), make_seq("c", 30, 2.0)
    for s in (a, b, c):
        sch.add(s)
    out = sch.schedule()
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 50), ("b", 14)]
    assert out.num_prefill_tokens == 64 and out.num_decode_tokens == 0
    fake_step(out)
    out = sch.schedule()
    # a decodes (1 token), b continues its prefill (26), c starts with what is left (37 > 30)
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 1), ("b", 26), ("c", 30)]
    assert out.num_decode_tokens == 1 and out.num_prefill_tokens == 56
    for _ in range(5):
        fake_step(out)
        out = sch.schedule()
        assert sum(n for _, n in out.scheduled) <= 64


def test_max_num_seqs_caps_the_running_queue():
    bm = BlockManager(64, 16)
    sch = Scheduler(512, max_num_seqs=2, max_num_batched_tokens=1000, block_manager=bm)
    for i in range(4):
        sch.add(make_seq(str(i), 10, float(i)))
    out = sch.schedule()
    assert [s.request_id for s, _ in out.scheduled] == ["0", "1"]
    assert sch.num_running == 2 and sch.num_waiting == 2


def test_preemption_recomputes_the_most_recently_arrived():
    bm = BlockManager(num_blocks=6, block_size=4)
    sch = Scheduler(512, 8, 1000, bm)
    a, b, c = make_seq("a", 7, 0.0), make_seq("b", 7, 1.0), make_seq("c", 7, 2.0)
    for s in (a, b, c):
        sch.add(s)
    fake_step(sch.schedule())                     # 2 blocks each: the pool is full
    assert bm.num_free_blocks == 0
    out = sch.schedule()                          # every one now holds 8 tokens: fits
    fake_step(out)
    out = sch.schedule()                          # a needs a 3rd block: c (newest) is preempted
    assert [s.request_id for s in out.preempted] == ["c"]
    assert c.status is SequenceStatus.PREEMPTED and c.num_computed_tokens == 0 and c.block_table == []
    assert c.num_preemptions == 1 and sch.preemptions_total == 1
    assert list(sch.waiting) == [c]
    assert [s.request_id for s, _ in out.scheduled] == ["a", "b"]
    for _ in range(8):                            # until a needs a 4th block
        fake_step(out)
        out = sch.schedule()
        if out.preempted:
            break
    assert len(a.block_table) == 4
    assert [s.request_id for s in out.preempted] == ["b"]   # b is now the newest running
    assert list(sch.waiting) == [b, c]            # arrival order kept at the front
    assert [s.request_id for s, _ in out.scheduled] == ["a"]


def test_requeue_after_a_failed_step_keeps_arrival_order():
    bm = BlockManager(32, 16)
    sch = Scheduler(512, 8, 1000, bm)
    seqs = [make_seq(str(i), 10, float(i)) for i in range(3)]
    for s in seqs:
        sch.add(s)
    late = make_seq("late", 10, 9.0)
    out = sch.schedule()
    sch.add(late)
    sch.requeue([s for s, _ in out.scheduled])
    assert list(sch.waiting) == seqs + [late]
    assert bm.num_used_blocks == 0 and sch.num_running == 0
    assert all(s.num_computed_tokens == 0 for s in seqs)


# ---------------------------------------------------------------------------- admission (F14)
def f14_scheduler(max_model_len: int) -> Scheduler:
    return Scheduler(max_model_len, 256, 8192, BlockManager(num_blocks=1000, block_size=16))


def test_f14a_prompt_longer_than_the_context():
    with pytest.raises(AdmissionError) as ei:
        f14_scheduler(16384).check_admission(112946, 10000)
    err = ei.value
    assert err.status == 400 and err.field == "prompt"
    assert "122946 > max_model_len 16384" in err.message


def test_f14b_prompt_plus_max_tokens_rejected_not_clamped():
    with pytest.raises(AdmissionError) as ei:
        f14_scheduler(16384).check_admission(15000, 2000)
    assert ei.value.status == 400 and ei.value.field == "max_tokens"
    assert "15000 + max_tokens 2000 = 17000 > max_model_len 16384" in ei.value.message


@pytest.mark.parametrize("max_tokens", [1, 16])
def test_f14c_prompt_needs_more_blocks_than_the_pool(max_tokens):
    with pytest.raises(AdmissionError) as ei:
        f14_scheduler(32768).check_admission(17000, max_tokens)
    assert ei.value.status == 400 and ei.value.field == "prompt"
    assert "1063 KV blocks of 16 tokens > 1000 blocks" in ei.value.message


def test_admission_counts_whole_request_blocks_and_returns_max_tokens():
    sch = f14_scheduler(32768)
    assert sch.check_admission(15000, 1000) == 1000          # 15999 tokens in cache: 1000 blocks
    with pytest.raises(AdmissionError, match="1001 KV blocks"):
        sch.check_admission(15000, 1002)
    assert sch.check_admission(100, None) == 16000 - 100 + 1  # None: as much as fits
    with pytest.raises(AdmissionError, match="empty"):
        sch.check_admission(0, 5)
