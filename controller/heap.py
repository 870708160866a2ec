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
:data:`GEN0_THRESHOLD`. The threshold counts tracked objects allocated less those freed; a tick
at 1,024 engines builds tens of thousands of container objects (parsed ``/stats`` documents,
snapshots, histograms, asyncio's per-call objects) that reference counting frees within the
tick or at the next one. At 700 that meant ~117 young, ~11 middle and one full collection per
tick, which freed nothing (0 objects collected: the steady tick makes no reference cycles) and
cost ~220 ms of CPU per tick (collector callbacks, ``bench.controller_tick``'s fleet, load ~8);
at 50,000, ~1.6 young collections a tick remained (~70 ms); at 200,000, none in 10 ticks. Cyclic
garbage is still collected: once 200,000 more objects are alive than freed since the last
collection (tens of MB at worst), the collector runs as before.
"""

from __future__ import annotations

import gc

#: The collector's youngest-generation threshold for the controller process (CPython's default:
#: 700); the two older generations keep their defaults (10, 10). See the module doc.
GEN0_THRESHOLD = 200_000


def freeze_startup_heap() -> int:
    """Collect once, freeze what is alive and set the youngest generation's threshold to
    :data:`GEN0_THRESHOLD` (call when the controller is built, before it starts polling).
    Returns the number of objects frozen (``gc.get_freeze_count()``)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)
    return gc.get_freeze_count()
