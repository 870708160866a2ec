"""controller/heap.py: the start-up heap is frozen out of the collector's generations, and a
frozen object is still freed by reference counting when dropped. (Speed is a benchmark:
``python -m bench.controller_tick``, ``--no-freeze`` for the comparison.)"""

from __future__ import annotations

import gc
import weakref

from inferctl.controller.heap import GEN0_THRESHOLD, freeze_startup_heap


class _Thing:
    pass


def test_freeze_moves_live_objects_out_and_dropped_ones_are_still_freed():
    thing = _Thing()
    ref = weakref.ref(thing)
    holder = [thing]                 # a tracked container, alive at the freeze
    thresholds = gc.get_threshold()
    try:
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count() > 0
        assert all(holder is not o for o in gc.get_objects())   # out of every generation
        del holder, thing
        assert ref() is None          # reference counting still frees a frozen object
    finally:
        gc.unfreeze()                 # leave the test process's collector as it was
        gc.set_threshold(*thresholds)
    assert gc.get_freeze_count() == 0


def test_the_youngest_generation_threshold_is_raised_and_the_older_ones_kept():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 9)
        freeze_startup_heap()
        assert gc.get_threshold() == (GEN0_THRESHOLD, 7, 9) and GEN0_THRESHOLD > 700
        freeze_startup_heap()                        # a second call changes nothing more
        assert gc.get_threshold() == (GEN0_THRESHOLD, 7, 9)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
