"""PromQL expression builders shared by the dashboards and the rules.

The builders encode three rules that real outages taught (see docs/field-cases.md):

- **Aggregate, then divide** (division by zero in ratios, prometheus #6611): a ratio is
  ``sum(num) / sum(den)``, never an average of per-series ratios, and the denominator is guarded
  with ``> 0`` so that an idle window gives *no data* instead of ``NaN`` or ``+Inf``:
  ``sum(rate(a)) / (sum(rate(b)) > 0)``.
- **No traffic is no data** (no traffic gives NaN, prometheus #6645): ``histogram_quantile``
  over all-zero bucket rates returns ``NaN``; :func:`quantile` keeps only groups whose
  ``_count`` rate is > 0.
- **Gauges aggregate with max/avg/min, never sum** (a summed utilisation or ratio is meaningless),
  and NaN readings are dropped before aggregating (:func:`gauge`).

Every function returns PromQL text; label lists are tuples of label names.
"""

from __future__ import annotations


def by(labels: tuple[str, ...]) -> str:
    """``by (a, b)`` (``by ()`` for the empty tuple: aggregate everything)."""
    return f"by ({', '.join(labels)})"


def selector(name: str, matchers: str = "") -> str:
    """``name{matchers}``; ``matchers`` is the text inside the braces (``job="x", mode="int8"``)."""
    return f"{name}{{{matchers}}}" if matchers else name


def rate_sum(name: str, labels: tuple[str, ...], window: str, matchers: str = "", fn: str = "rate") -> str:
    """``sum by (labels) (rate(name{matchers}[window]))`` — counters only."""
    return f"sum {by(labels)} ({fn}({selector(name, matchers)}[{window}]))"


def gauge(name: str, labels: tuple[str, ...], how: str = "max", matchers: str = "") -> str:
    """``max by (labels) (name{matchers} >= 0)``. Raises ValueError for ``how`` = ``sum``.

    ``>= 0`` drops NaN samples (every comparison with NaN is false) and negative ones: the
    engine exposes "no data" on an unlabelled gauge as NaN (prometheus-client cannot remove
    the sample; e.g. KV waste with no block in use), and no catalog gauge is negative. So an
    invalid reading is no data on the dashboard, never a NaN line or an aggregate poisoned by it.
    """
    if how not in ("max", "min", "avg"):
        raise ValueError(f"how: gauges aggregate with max, min or avg, not {how!r}")
    return f"{how} {by(labels)} ({selector(name, matchers)} >= 0)"


def ratio(numerator: str, denominator: str, zero_fill: bool = False) -> str:
    """``numerator / (denominator > 0)``: no data where the denominator is 0 or absent.

    ``zero_fill=True`` makes an *absent* numerator count as 0 where the denominator has data
    (``(num or den * 0) / (den > 0)``), for counters whose label set appears only on the first
    event (e.g. errors: traffic without errors is a 0 % error rate, not no data). Both sides
    must carry the same labels.
    """
    num = f"({numerator} or {denominator} * 0)" if zero_fill else f"({numerator})"
    return f"{num} / ({denominator} > 0)"


def quantile(q: float, histogram: str, labels: tuple[str, ...], window: str, matchers: str = "") -> str:
    """The ``q`` quantile of a histogram over ``window``, by ``labels``; no data without traffic.

    ``histogram_quantile(q, sum by (labels, le) (rate(h_bucket[w]))) and on (labels)
    (sum by (labels) (rate(h_count[w])) > 0)``. Raises ValueError unless 0 < q < 1.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q: quantile must lie in (0, 1), got {q}")
    buckets = rate_sum(f"{histogram}_bucket", labels + ("le",), window, matchers)
    count = rate_sum(f"{histogram}_count", labels, window, matchers)
    return f"histogram_quantile({q}, {buckets}) and on ({', '.join(labels)}) ({count} > 0)"


def histogram_mean(histogram: str, labels: tuple[str, ...], window: str, matchers: str = "") -> str:
    """Mean observation over ``window``: ``sum(rate(h_sum)) / (sum(rate(h_count)) > 0)``."""
    return ratio(rate_sum(f"{histogram}_sum", labels, window, matchers),
                 rate_sum(f"{histogram}_count", labels, window, matchers))


def window_increase(name: str, labels: tuple[str, ...], window: str, matchers: str = "") -> str:
    """Events counted by a counter within ``window``, by ``labels`` — also for a series *born*
    inside the window.

    A labelled counter whose series is created by its first event (prometheus-client creates
    ``x{engine="a",to="int8"}`` on the first ``inc()``) starts at 1: ``increase()`` over a
    window holding its birth sees 1 → 1 and reports 0, so the first switch, Xid or failed
    reset would be invisible. Here series that existed ``window`` ago use ``increase()``;
    series born since count their current value (every event since birth)::

        sum by (labels) ((increase(x[w]) and x offset w) or (x unless x offset w))

    Caveat: on a Prometheus with an empty database, every counter looks born in its first
    ``window`` (its whole value counts once).
    """
    sel = selector(name, matchers)
    return (f"sum {by(labels)} ((increase({sel}[{window}]) and {sel} offset {window})"
            f" or ({sel} unless {sel} offset {window}))")


def counter_increased(name: str, labels: tuple[str, ...], window: str, matchers: str = "") -> str:
    """At least one event in ``window`` (see :func:`window_increase`); the value is the count."""
    return f"{window_increase(name, labels, window, matchers)} > 0"
