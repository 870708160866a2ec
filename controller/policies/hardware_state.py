"""The standing hardware state of a GPU and its error counters, as pure functions.

A GPU's fault is judged from what it carries now, not only from counts that grow
(docs/policies.md "Hardware: standing faults"):

* **standing faults** (:func:`standing_faults`): uncorrectable (double-bit) ECC errors since the
  last driver load (the volatile count > 0), uncorrectable errors on record (the aggregate,
  lifetime count > 0), pages pending retirement, a pending row remap, a failed row remap.
  NVIDIA: pending retirements and row remaps take effect at the next GPU reset or driver
  reload; a failed remap needs service (NVIDIA "Dynamic Page Retirement" and "GPU Memory Error
  Management" docs). All of them make an OOM on that GPU a hardware fault; all but the
  aggregate count also make the GPU unfit for routing (``blocking``): an aggregate count is
  history already repaired by retirement/remapping.
* **counters** (:func:`counter_increase`): ECC counts are counters; volatile ones reset to 0
  on a driver reload or GPU reset. A decrease is a reset, never negative errors: the increase
  since the reset is the new value (Prometheus ``increase()`` semantics,
  https://prometheus.io/docs/prometheus/latest/querying/functions/#increase).
* **correctable-error rate** (:class:`CounterRate`): errors per second over a window, for the
  correctable-error storm warning (never critical, never a reset).

Counts are ints (errors), times seconds (``time.time()`` scale). ``None`` is "no data".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: Standing-fault kinds, in the order they are reported.
STANDING_KINDS = ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate", "retired_pages_pending",
                  "row_remap_pending", "row_remap_failure")
#: The kinds that make a GPU unfit for routing (all but history on record).
BLOCKING_KINDS = frozenset(STANDING_KINDS) - {"ecc_uncorrected_aggregate"}


def _count(v: Any) -> int | None:
    """A non-negative integer count, or None (no data, a bool, negative, not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v == float("inf"):
        return None
    return int(v)


def standing_faults(snap: Any) -> dict[str, str]:
    """The standing faults of a ``GpuSnapshot`` (kind → words), in :data:`STANDING_KINDS`
    order; empty for a clean GPU or one whose fields are all no data."""
    out: dict[str, str] = {}
    vol = _count(getattr(snap, "ecc_uncorrected", None))
    agg = _count(getattr(snap, "ecc_uncorrected_aggregate", None))
    if vol:
        out["ecc_uncorrected_volatile"] = f"{vol} uncorrectable ECC error(s) since the last driver load"
    if agg:
        out["ecc_uncorrected_aggregate"] = f"{agg} uncorrectable ECC error(s) on record (aggregate)"
    if getattr(snap, "retired_pages_pending", None) is True:
        out["retired_pages_pending"] = "pages pending retirement (applied at the next reset)"
    if getattr(snap, "remapped_rows_pending", None) is True:
        out["row_remap_pending"] = "row remapping pending (applied at the next reset)"
    if getattr(snap, "remapped_rows_failure", None) is True:
        out["row_remap_failure"] = "row remapping failed: the GPU needs service"
    return out


def blocking(faults: dict[str, str]) -> dict[str, str]:
    """The standing faults that make a GPU unfit for routing (:data:`BLOCKING_KINDS`)."""
    return {k: v for k, v in faults.items() if k in BLOCKING_KINDS}


def counter_increase(prev: int | None, cur: int | None) -> tuple[int | None, bool]:
    """``(increase, reset)`` of a counter from ``prev`` to ``cur``: ``cur - prev``; after a
    decrease (a reset) the increase is ``cur`` and ``reset`` is True. ``(None, False)`` when
    either is no data."""
    p, c = _count(prev), _count(cur)
    if p is None or c is None:
        return None, False
    if c < p:
        return c, True
    return c - p, False


@dataclass
class CounterRate:
    """Increase per second of a counter over the last ``window_seconds`` (resets handled).

    ``update(now, value)`` adds a sample and returns the rate (errors/s) once the samples span
    at least half the window, else None (too little history is no data)."""

    window_seconds: float
    _last: int | None = None
    _events: deque = field(default_factory=deque)     # (time, increase)
    _first: float | None = None

    def update(self, now: float, value: Any) -> float | None:
        cur = _count(value)
        if cur is None:
            return None
        inc, _reset = counter_increase(self._last, cur)
        if self._first is None:
            self._first = now
        self._last = cur
        if inc:
            self._events.append((now, inc))
        while self._events and now - self._events[0][0] > self.window_seconds:
            self._events.popleft()
        span = min(now - self._first, self.window_seconds)
        if span < self.window_seconds / 2 or span <= 0:
            return None
        return sum(n for _, n in self._events) / span


def storm_change(rate: float, storming: bool, threshold: float,
                 window_seconds: float) -> tuple[bool, str, str] | None:
    """A correctable-error storm starting or ending: ``(storming, severity, words)``, or None
    when nothing changes. A storm is a ``warning`` with its rate, never critical (corrected
    errors are corrected in hardware; a high rate is a service hint, not an outage)."""
    if rate >= threshold and not storming:
        return True, "warning", (f"correctable ECC error storm: {rate:.3g} errors/s over {window_seconds:g} s "
                                 f"(>= {threshold:g}/s); corrected in hardware: no action, plan service if "
                                 "it persists")
    if rate < threshold and storming:
        return False, "info", f"correctable ECC errors back to {rate:.3g} errors/s"
    return None
