"""AttentionMetadata.build(..., reuse=): a step of the same five field sizes overwrites the previous
step's buffer in place and returns it, with exactly a fresh build's values; any other step (other
sizes, gather-path fields already made, another block size) gets a new object."""

from __future__ import annotations

import torch

from inferctl.engine.attention import AttentionMetadata

FIELDS = ("slot_mapping", "query_start_loc", "seq_lens", "block_tables", "logits_indices")


def _same(a: AttentionMetadata, b: AttentionMetadata) -> None:
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    for f in ("block_size", "num_decodes", "all_decode", "max_context"):
        assert getattr(a, f) == getattr(b, f), f
    assert a._host[:2] == b._host[:2] and a._host[3:] == b._host[3:]


def test_a_decode_step_of_the_same_sizes_is_rewritten_in_place():
    prev = AttentionMetadata.build([([4, 9], 20, 1, False), ([2], 5, 1, False)], 16)
    chunks = [([4, 9], 21, 1, False), ([3], 6, 1, False)]       # next step; the 2nd table changed
    meta = AttentionMetadata.build(chunks, 16, reuse=prev)
    assert meta is prev
    _same(meta, AttentionMetadata.build(chunks, 16))
    assert meta.slot_mapping.tolist() == [9 * 16 + 5, 3 * 16 + 6] and meta.seq_lens.tolist() == [22, 7]


def test_other_sizes_or_a_plain_prepared_step_get_a_new_object():
    prev = AttentionMetadata.build([([4], 14, 1, False)], 16)
    grown = [([4, 5], 16, 1, False)]                    # a second block: another table width
    meta = AttentionMetadata.build(grown, 16, reuse=prev)
    assert meta is not prev
    _same(meta, AttentionMetadata.build(grown, 16))
    assert prev.slot_mapping.tolist() == [4 * 16 + 14]  # the old one is left alone
    meta.prepare_plain(16)                              # gather-path fields made from these values
    again = AttentionMetadata.build([([4, 5], 17, 1, False)], 16, reuse=meta)
    assert again is not meta and meta.slot_mapping.tolist() == [5 * 16]
    other_bs = AttentionMetadata.build([([4, 5, 6], 17, 1, False)], 8, reuse=again)
    assert other_bs is not again and other_bs.block_size == 8


def test_a_prefill_of_the_same_sizes_reuses_and_matches_too():
    prev = AttentionMetadata.build([([1, 2], 0, 20, False)], 16)
    chunks = [([7, 3], 2, 20, False)]
    meta = AttentionMetadata.build(chunks, 16, reuse=prev)
    assert meta is prev
    _same(meta, AttentionMetadata.build(chunks, 16))
    assert not meta.all_decode and meta.num_decodes == 0
