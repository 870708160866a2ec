"""signals.memory_used_ratio under MiB rounding (F11): parts that add up to a few MiB more than
the total are rounding, not an invalid sample; beyond the tolerance they are inconsistent."""

from __future__ import annotations

import pytest

from inferctl.controller import signals as S
from inferctl.controller.gpu.base import MEMORY_ROUNDING_TOLERANCE_BYTES

MiB = 1024 * 1024


def test_f11_sample_with_free_is_rounding_not_invalid():
    c = S.InvalidSampleCounter()
    # RTX 3060 (F11): total 12288, used 116, free 11806, reserved 368 MiB -> parts sum to 12290
    used = S.memory_used_ratio(116 * MiB, 12288 * MiB, 368 * MiB, free_bytes=11806 * MiB, counter=c)
    both = S.memory_used_ratio(116 * MiB, 12288 * MiB, 368 * MiB, free_bytes=11806 * MiB,
                               count_reserved=True, counter=c)
    assert round(used.value * 100, 2) == 0.94 and not used.invalid
    assert round(both.value * 100, 2) == 3.94 and not both.invalid
    assert used.inputs["accounting_gap_bytes"] == 2 * MiB
    assert c.count("memory_used_ratio") == 0


def test_used_plus_reserved_over_total_within_rounding_reads_full():
    c = S.InvalidSampleCounter()
    # a full GPU whose rounded used + reserved is 2 MiB over its total
    sig = S.memory_used_ratio(11922 * MiB, 12288 * MiB, 368 * MiB, count_reserved=True, counter=c)
    assert sig.value == 1.0 and not sig.invalid
    assert c.count("memory_used_ratio") == 0


def test_beyond_the_tolerance_is_inconsistent_and_counted():
    c = S.InvalidSampleCounter()
    over = 12288 * MiB + MEMORY_ROUNDING_TOLERANCE_BYTES + MiB
    sig = S.memory_used_ratio(over, 12288 * MiB, counter=c)
    assert sig.value is None and sig.invalid and "rounding" in sig.reason
    # parts 82 MiB over the total (116 + 11886 + 368 = 12370) with free given: not rounding
    gap = S.memory_used_ratio(116 * MiB, 12288 * MiB, 368 * MiB, free_bytes=11886 * MiB, counter=c)
    assert gap.value is None and gap.invalid and f"+{82 * MiB} B" in gap.reason
    assert c.count("memory_used_ratio", "inconsistent") == 2


@pytest.mark.parametrize("bad", [-1, float("nan")])
def test_bad_free_is_no_data(bad):
    sig = S.memory_used_ratio(116 * MiB, 12288 * MiB, 368 * MiB, free_bytes=bad)
    assert sig.value is None and "free_bytes" in sig.reason
