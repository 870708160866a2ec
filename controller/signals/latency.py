"""Latency summaries: quantiles of a latency histogram plus plausibility flags.

Data that fails a plausibility check (an impossible ``_sum``, a count mismatch, more
observations than requests; docs/field-cases.md, "impossible TTFT histogram") is flagged and
kept out of SLO decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from inferctl.controller.signals.histograms import (Histogram, InvalidHistogram, Quantile,
                                                    histogram_quantile, monotonic, to_histogram)
from inferctl.controller.signals.validation import validate_nonneg
from inferctl.controller.signals.values import InvalidSampleCounter



@dataclass(frozen=True)
class LatencySummary:
    """Quantiles of a latency histogram with plausibility checks.

    ``quantiles`` maps q → :class:`Quantile` or None (no data). ``flags`` are codes for what
    is wrong (``implausible_zero_sum``, ``mean_outside_buckets``, ``count_mismatch``,
    ``non_monotonic``, ``count_exceeds_requests``, ``invalid``); ``slo_usable`` is False when
    any flag is set or there is no observation: such data stays out of SLO decisions (the
    latency breaker, alerts).
    """

    name: str
    count: float | None
    sum: float | None
    quantiles: dict[float, Quantile | None]
    flags: tuple[str, ...] = ()
    slo_usable: bool = False
    reason: str | None = None

    def p(self, q: float) -> Quantile | None:
        """The quantile for ``q`` (e.g. 0.99), or None."""
        return self.quantiles.get(q)


def latency_summary(hist: Any, quantiles: Iterable[float] = (0.5, 0.9, 0.95, 0.99), *,
                    name: str = "ttft_seconds", finished_total: Any = None, running: Any = None,
                    counter: InvalidSampleCounter | None = None) -> LatencySummary:
    """Quantiles of ``hist`` (document or :class:`Histogram`) plus plausibility flags.

    Checks (each counted in ``counter`` under ``name``): ``_sum`` 0 with observations
    (docs/field-cases.md F03a: every bucket 208 incl. le=0.001 and sum 0 → p50 0.0005 s, flagged); mean outside
    the non-empty buckets' range; ``_count`` ≠ the +Inf bucket; non-monotonic buckets; and,
    when both ``finished_total`` and ``running`` are known (cumulative histograms only),
    observations > finished + running requests (docs/field-cases.md F03b: 8060 > 3918 + 0). ``hist`` None or
    no observations (docs/field-cases.md F04: an empty window) → every quantile None.
    """
    qs = tuple(quantiles)
    empty = {q: None for q in qs}
    if hist is None:
        return LatencySummary(name, None, None, empty, (), False, "no histogram")
    try:
        h = to_histogram(hist)
    except InvalidHistogram as exc:
        if counter is not None:
            counter.record(name, "invalid")
        return LatencySummary(name, None, None, empty, ("invalid",), False, str(exc))
    flags: list[str] = []
    fixed, forced = monotonic(h.buckets)
    if forced:
        flags.append("non_monotonic")
    obs = fixed[-1][1]
    if h.count is not None and abs(h.count - obs) > 1e-9 * max(1.0, obs):
        flags.append("count_mismatch")
    if obs == 0:
        return LatencySummary(name, 0.0, h.sum, empty, tuple(flags), False, "no observations")
    values = {q: histogram_quantile(q, Histogram(tuple(fixed), h.sum, h.count)) for q in qs}
    if h.sum is not None:
        if h.sum == 0:
            flags.append("implausible_zero_sum")
        else:
            mean = h.sum / obs
            lo_i = next(i for i, (_, c) in enumerate(fixed) if c > 0)
            hi_i = next(i for i in range(len(fixed)) if fixed[i][1] >= obs)
            lower = 0.0 if lo_i == 0 else fixed[lo_i - 1][0]
            upper = fixed[hi_i][0]
            tol = 1e-9 * max(1.0, abs(mean))
            if mean < lower - tol or mean > upper + tol:
                flags.append("mean_outside_buckets")
    fin = validate_nonneg(finished_total, f"{name}.finished_total", counter)
    run = validate_nonneg(running, f"{name}.running", counter)
    if fin.value is not None and run.value is not None:   # both known, or no check
        requests = fin.value + run.value
        if obs > requests:
            flags.append("count_exceeds_requests")
    for f in flags:
        if counter is not None:
            counter.record(name, f)
    reason = None
    if flags:
        reason = "kept out of SLO decisions: " + ", ".join(flags)
    return LatencySummary(name, obs, h.sum, values, tuple(flags), not flags, reason)
