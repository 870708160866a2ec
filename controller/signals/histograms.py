"""Cumulative (Prometheus classic) histograms: reading, quantiles, window deltas.

Quantiles from cumulative histogram buckets exactly as PromQL ``histogram_quantile``
(https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile,
``promql/quantile.go: BucketQuantile``), except that a quantile in the +Inf bucket is reported
as "≥ bound" (``Quantile(at_least=True)``) instead of silently as the bound, and "no
observations" is ``None`` instead of NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import Any


@dataclass(frozen=True)
class Quantile:
    """A quantile estimate in the histogram's unit (seconds for latency).

    ``at_least`` is True when the quantile fell into the +Inf bucket: the true value is only
    known to be ≥ ``value`` (the highest finite bound), and is shown as "≥ 10".
    """

    value: float
    at_least: bool = False

    def exceeds(self, threshold: float) -> bool:
        """Whether the quantile counts as over ``threshold``. A "≥ bound" quantile always
        counts as over: nothing proves it is below (policy, docs/signals.md)."""
        return self.at_least or self.value > threshold

    def __str__(self) -> str:
        return f"≥ {self.value:g}" if self.at_least else f"{self.value:g}"


@dataclass(frozen=True)
class Histogram:
    """A cumulative (Prometheus classic) histogram: ``buckets`` sorted by upper bound ``le``,
    the last one +Inf, counts cumulative; ``sum`` and ``count`` as exposed (either may be None).
    ``notes`` says how it was built (e.g. a counter reset in a window delta)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float | None = None
    count: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def observations(self) -> float:
        """The +Inf bucket's count."""
        return self.buckets[-1][1]


class InvalidHistogram(ValueError):
    """A histogram document that cannot be read; the message names the field."""


def _le(x: Any) -> float:
    if isinstance(x, str):
        s = x.strip().lower()
        if s in ("+inf", "inf", "+infinity", "infinity"):
            return math.inf
        return float(s)
    return float(x)


def to_histogram(doc: Any) -> Histogram:
    """Read ``{"buckets": [(le, cumulative count), ...], "sum": s, "count": c}`` (``le`` a
    number or a string like ``"0.001"``/``"+Inf"``), or a :class:`Histogram`.

    Buckets with the same bound are merged (PromQL ``coalesceBuckets``). Without a +Inf
    bucket, ``count`` stands in for it. Raises :class:`InvalidHistogram` naming the field for
    a missing/empty ``buckets``, a NaN or negative count, a NaN bound, or no +Inf and no count.
    """
    if isinstance(doc, Histogram):
        return doc
    if not isinstance(doc, Mapping):
        raise InvalidHistogram(f"histogram: expected a mapping, got {type(doc).__name__}")
    raw = doc.get("buckets")
    if not raw:
        raise InvalidHistogram("histogram.buckets: missing or empty")
    merged: dict[float, float] = {}
    for i, item in enumerate(raw):
        try:
            le, cnt = item
            le_f, cnt_f = _le(le), float(cnt)
        except (TypeError, ValueError) as exc:
            raise InvalidHistogram(f"histogram.buckets[{i}]: {item!r} is not (le, count)") from exc
        if math.isnan(le_f):
            raise InvalidHistogram(f"histogram.buckets[{i}].le: NaN")
        if math.isnan(cnt_f) or math.isinf(cnt_f) or cnt_f < 0:
            raise InvalidHistogram(f"histogram.buckets[{i}].count: {cnt_f} (must be finite, >= 0)")
        merged[le_f] = merged.get(le_f, 0.0) + cnt_f
    count = doc.get("count")
    hsum = doc.get("sum")
    count_f = None if count is None else float(count)
    sum_f = None if hsum is None else float(hsum)
    if count_f is not None and (math.isnan(count_f) or count_f < 0 or math.isinf(count_f)):
        raise InvalidHistogram(f"histogram.count: {count_f} (must be finite, >= 0)")
    if sum_f is not None and (math.isnan(sum_f) or math.isinf(sum_f)):
        raise InvalidHistogram(f"histogram.sum: {sum_f} (must be finite)")
    if math.inf not in merged:
        if count_f is None:
            raise InvalidHistogram("histogram.buckets: no +Inf bucket and no count")
        merged[math.inf] = count_f
    buckets = tuple(sorted(merged.items()))
    return Histogram(buckets, sum_f, count_f)


def monotonic(buckets: Sequence[tuple[float, float]]) -> tuple[list[tuple[float, float]], bool]:
    """PromQL ``ensureMonotonic``: a cumulative count lower than the one before is raised to
    it. Returns the fixed buckets and whether anything was fixed."""
    out: list[tuple[float, float]] = []
    running = 0.0
    forced = False
    for le, cnt in buckets:
        if cnt < running:
            forced = True
            cnt = running
        running = cnt
        out.append((le, cnt))
    return out, forced


def histogram_quantile(q: float, buckets: Any) -> Quantile | None:
    """The ``q``-quantile of a cumulative histogram, as PromQL ``histogram_quantile``.

    ``buckets`` is a histogram document (see :func:`to_histogram`), a :class:`Histogram`, or
    a sequence of ``(le, cumulative count)``. Linear interpolation inside the bucket where
    rank = q × observations falls; the lowest bucket interpolates from 0 (or returns its
    bound if that is ≤ 0). Differences from Prometheus: a quantile in the +Inf bucket gives
    ``Quantile(second-highest bound, at_least=True)`` ("≥ bound"); no observations, a
    missing +Inf bucket or fewer than 2 buckets give ``None`` (Prometheus: NaN).
    Raises ``ValueError`` for q outside [0, 1] or NaN (a caller's bug, not data).
    """
    if q is None or isinstance(q, bool) or not isinstance(q, (int, float)) or math.isnan(q) \
            or not 0.0 <= q <= 1.0:
        raise ValueError(f"q: {q!r} must be a number in [0, 1]")
    try:
        if isinstance(buckets, (Mapping, Histogram)):
            hist = to_histogram(buckets)
        else:
            hist = to_histogram({"buckets": list(buckets)})
    except InvalidHistogram:
        return None
    bks, _ = monotonic(hist.buckets)
    if len(bks) < 2 or not math.isinf(bks[-1][0]):
        return None
    observations = bks[-1][1]
    if observations == 0:
        return None
    rank = q * observations
    b = next((i for i in range(len(bks) - 1) if bks[i][1] >= rank), len(bks) - 1)
    if b == len(bks) - 1:
        return Quantile(bks[-2][0], at_least=True)
    if b == 0 and bks[0][0] <= 0:
        return Quantile(bks[0][0])
    start, end, count = 0.0, bks[b][0], bks[b][1]
    if b > 0:
        start = bks[b - 1][0]
        count -= bks[b - 1][1]
        rank -= bks[b - 1][1]
    if count == 0:  # rank 0 (q = 0) on an empty bucket: Prometheus gives NaN; the bucket's start
        return Quantile(start)
    return Quantile(start + (end - start) * (rank / count))


def histogram_delta(prev: Any, curr: Any) -> Histogram | None:
    """The observations between two scrapes of one cumulative histogram (curr − prev).

    A reset (the count or any bucket went down, or the bucket layout changed) means the
    process restarted: the current histogram is the delta (Prometheus ``rate()`` semantics),
    noted in ``notes``. ``prev`` None → None (no window). Raises :class:`InvalidHistogram`
    for a malformed document.
    """
    if prev is None or curr is None:
        return None
    p, c = to_histogram(prev), to_histogram(curr)
    if [le for le, _ in p.buckets] != [le for le, _ in c.buckets]:
        return Histogram(c.buckets, c.sum, c.count, c.notes + ("bucket layout changed: "
                                                               "taken as a reset",))
    went_down = any(cc < pc for (_, pc), (_, cc) in zip(p.buckets, c.buckets)) or (
        p.count is not None and c.count is not None and c.count < p.count)
    if went_down:
        return Histogram(c.buckets, c.sum, c.count, c.notes + ("counter reset: the current "
                                                               "histogram is the window",))
    buckets = tuple((le, cc - pc) for (le, pc), (_, cc) in zip(p.buckets, c.buckets))
    dsum = None if p.sum is None or c.sum is None else c.sum - p.sum
    dcount = None if p.count is None or c.count is None else c.count - p.count
    return Histogram(buckets, dsum, dcount)
