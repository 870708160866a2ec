"""The controller process's heap and the cyclic garbage collector.

A full (generation 2) collection walks every container object the process holds. At 1,024
engines that is ~250,000 objects (the engine clients, the metric children, the policies'
state, the imported modules), most of them made once at start and never freed; each tick
replaces ~1,000 snapshots, which is enough new long-lived objects to trigger a full
collection nearly every tick (CPython collects generation 2 once the objects that survived
into it since the last full collection reach 25 % of the ones there: Modules/gcmodule.c,
``long_lived_pending``). Measured with ``bench.controller_tick``'s fleet, 1,024 engines / 256
GPUs, 5 ticks, at load 10: a full collection cost ~260 ms of CPU of a ~1.3 s tick (median);
with the start-up heap frozen, ~90 ms, and the tick's median ~0.9 s.

:func:`freeze_startup_heap` moves every object alive after start-up to the collector's
permanent generation (``gc.freeze``, Python >= 3.7: "move all objects tracked by the garbage
collector into a permanent generation, i.e. ignore them in all the future collections",
https://docs.python.org/3/library/gc.html#gc.freeze). Frozen objects are still freed by
reference counting when dropped; only a reference cycle among them would stay (none is
expected of objects built once at start: the process-wide collection that precedes the
freeze frees those already unreachable).

It also raises the youngest generation's threshold (``gc.set_threshold``,
https://docs.python.org/3/library/gc.html#gc.set_threshold) from CPython's 700 to
:data:`GEN0_THRESHOLD`. A tick at 1,024 engines allocates ~80,000 container objects (parsed
``/stats`` documents, snapshots, histograms, asyncio's per-call objects), nearly all freed by
reference counting within the tick or held until the next one; at 700 that was ~117 young
collections, ~11 middle ones and one full collection per tick, which freed nothing (0 objects
collected per tick: the steady tick makes no reference cycles) and cost ~220 ms of CPU per tick
(collector callbacks, same fake fleet, load ~8). At 50,000: ~65 ms. Objects that die within a
young collection's period are never walked, and the full collections, which follow the middle
ones, come about 70 times less often. Cyclic garbage still goes: at most 50,000 young objects
wait for a collection (a few MB).
"""

from __future__ import annotations

import gc

#: The collector's youngest-generation threshold for the controller process (CPython's default:
#: 700); the two older generations keep their defaults (10, 10). See the module doc.
GEN0_THRESHOLD = 50_000


def freeze_startup_heap() -> int:
    """Collect once, freeze what is alive and set the youngest generation's threshold to
    :data:`GEN0_THRESHOLD` (call when the controller is built, before it starts polling).
    Returns the number of objects frozen (``gc.get_freeze_count()``)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)
    return gc.get_freeze_count()
