"""Validation of raw samples and ratios of counts, alone and over a fleet.

A sample is accepted when it is a finite number >= 0 (and <= 1 for a ratio); anything else is
``value=None, invalid=True`` with a counted reason code (``negative``, ``nan``, ``inf``,
``above_one``, ``not_a_number``). Fleet ratios aggregate, then divide (docs/field-cases.md,
"division by zero in ratios"); fleet means use valid samples only (docs/field-cases.md,
"negative KV usage").
"""

from __future__ import annotations

import math
import sys
from typing import Any, Mapping

from inferctl.controller.signals.values import (FleetSignal, InvalidSampleCounter, Signal,
                                                first_missing, invalid_signal, no_data)

#: The largest finite float: ``0 <= x <= _INF_BELOW`` is False for NaN, -x and +inf alike.
_INF_BELOW = sys.float_info.max
#: Integers below this convert to a finite float without an OverflowError.
_INT_FAST = 2 ** 63


def plain_number(v: Any, upper: float | None = None) -> bool:
    """``v`` is a plain float or int that :func:`check_number` accepts (finite, >= 0, <= ``upper``
    when given), decided without building its Signal: the fast path of the controller's per-poll
    readers (GPU fields, the batch window, the exporter's gauges, the bundled ``/stats`` reader)."""
    if type(v) is float:
        return 0.0 <= v <= _INF_BELOW and (upper is None or v <= upper)
    if type(v) is int:
        return 0 <= v < _INT_FAST and (upper is None or v <= upper)
    return False


def check_number(x: Any, name: str, counter: InvalidSampleCounter | None,
                 upper: float | None) -> Signal:
    """Accept ``x`` as a finite number >= 0 and, when ``upper`` is given, <= ``upper``.

    None -> no data (not counted); a bool, a non-number, NaN, ±inf (or an integer beyond float
    range), a negative value or one above ``upper`` -> invalid, counted in ``counter`` under
    ``name`` with the codes ``not_a_number``, ``nan``, ``inf``, ``negative``, ``above_one``.
    """
    if type(x) is float:   # the common case (a parsed JSON or Prometheus number): no conversion
        if 0.0 <= x <= _INF_BELOW and (upper is None or x <= upper):
            return Signal(name, x, None, False, {"raw": x})
    elif type(x) is int:   # a count: exact as a float below 2**53, always finite below 2**63
        if 0 <= x < _INT_FAST:
            v = float(x)
            if upper is None or v <= upper:
                return Signal(name, v, None, False, {"raw": v})
    elif x is None:
        return no_data(name, f"{name}: no data", raw=None)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return invalid_signal(name, "not_a_number", f"{name}: {str(x)[:80]!r} is not a number", counter,
                        raw=repr(x)[:80])
    try:
        v = float(x)
    except OverflowError:   # an integer beyond float range (e.g. a 400-digit JSON number)
        return invalid_signal(name, "inf", f"{name}: an integer of {len(str(abs(x)))} digits rejected"
                        " (not finite)", counter, raw=None)
    if math.isnan(v):
        return invalid_signal(name, "nan", f"{name}: NaN rejected", counter, raw=v)
    if math.isinf(v):
        return invalid_signal(name, "inf", f"{name}: {v} rejected (not finite)", counter, raw=v)
    if v < 0:
        return invalid_signal(name, "negative", f"{name}: {v} rejected (negative, must be >= 0)",
                        counter, raw=v)
    if upper is not None and v > upper:
        return invalid_signal(name, "above_one", f"{name}: {v} rejected (a ratio must be <= {upper:g})",
                        counter, raw=v)
    return Signal(name, v, None, False, {"raw": v})


def validate_ratio(x: Any, name: str = "ratio",
                   counter: InvalidSampleCounter | None = None) -> Signal:
    """Accept ``x`` as a ratio in [0, 1].

    Returns ``Signal(value=float)`` when valid; ``value=None`` with ``invalid=True`` and a
    counted reason (``negative``, ``nan``, ``inf``, ``above_one``, ``not_a_number``) when
    rejected; ``value=None, invalid=False`` when ``x`` is None (no data, not counted).
    docs/field-cases.md F01: ``-0.3875395987328405`` is rejected as ``negative``, never shown as −38.75 %.
    """
    return check_number(x, name, counter, 1.0)


def validate_nonneg(x: Any, name: str = "value",
                    counter: InvalidSampleCounter | None = None) -> Signal:
    """Accept ``x`` as a finite number ≥ 0 (bytes, counts, seconds); like :func:`validate_ratio`
    without the upper bound."""
    return check_number(x, name, counter, None)


def fleet_mean(samples: Mapping[str, Any], name: str = "ratio",
               counter: InvalidSampleCounter | None = None, *, ratio: bool = True) -> FleetSignal:
    """Mean over the members' *valid* samples (docs/field-cases.md F01: 0.41 and −0.3875 → 0.41).

    ``samples`` maps member name → raw value. Invalid samples are counted and excluded;
    with no valid sample the fleet value is None.
    """
    check = validate_ratio if ratio else validate_nonneg
    members = {k: check(v, name, counter) for k, v in samples.items()}
    valid = {k: s.value for k, s in members.items() if s.value is not None}
    excluded = sorted(k for k, s in members.items() if s.value is None)
    if not valid:
        return FleetSignal(no_data(name, f"{name}: no valid sample in the fleet",
                                    excluded=excluded), members)
    mean = sum(valid.values()) / len(valid)
    return FleetSignal(Signal(name, mean, None, False, {"valid": valid, "excluded": excluded}),
                       members)


def ratio(numerator: Any, denominator: Any, name: str = "ratio",
          counter: InvalidSampleCounter | None = None) -> Signal:
    """``numerator / denominator`` for a ratio of counts; denominator 0 → None ("undefined",
    docs/field-cases.md F05), numerator > denominator → invalid (counted)."""
    num = validate_nonneg(numerator, f"{name}.numerator", counter)
    den = validate_nonneg(denominator, f"{name}.denominator", counter)
    raw = {"numerator": numerator, "denominator": denominator}
    if (missing := first_missing(name, raw, num, den)) is not None:
        return missing
    if den.value == 0:
        return no_data(name, f"{name}: undefined (0 of 0)", numerator=num.value, denominator=0.0)
    if num.value > den.value:
        return invalid_signal(name, "above_one",
                        f"{name}: {num.value:g} of {den.value:g} rejected (numerator > denominator)",
                        counter, numerator=num.value, denominator=den.value)
    return Signal(name, num.value / den.value, None, False,
                  {"numerator": num.value, "denominator": den.value})


def fleet_ratio(parts: Mapping[str, tuple[Any, Any]], name: str = "ratio",
                counter: InvalidSampleCounter | None = None) -> FleetSignal:
    """Aggregate, then divide (docs/field-cases.md F05): fleet = Σ numerators / Σ denominators over members whose
    own pair is valid; each member's own ratio is reported beside it (0 of 0 → None).

    ``parts`` maps member → (numerator, denominator). Engine A 50 of 100 and B 0 of 0 give
    fleet 0.50 and B None — not the mean of 0.5 and 0.
    """
    members = {k: ratio(n, d, name, counter) for k, (n, d) in parts.items()}
    num_sum = 0.0
    den_sum = 0.0
    used: list[str] = []
    for k, s in members.items():
        if s.invalid:
            continue
        n, d = s.inputs.get("numerator"), s.inputs.get("denominator")
        if isinstance(n, float) and isinstance(d, float):
            num_sum += n
            den_sum += d
            used.append(k)
    if den_sum == 0:
        return FleetSignal(no_data(name, f"{name}: undefined for the fleet (0 of 0)",
                                    members=sorted(used)), members)
    return FleetSignal(Signal(name, num_sum / den_sum, None, False,
                              {"numerator": num_sum, "denominator": den_sum,
                               "members": sorted(used)}), members)
