"""The value objects every signal function answers with.

A :class:`Signal` carries ``value`` (a float) or ``None`` for no data / an invalid input, with
the ``reason`` in words — never 0 for "missing". Rejected samples are counted in an
:class:`InvalidSampleCounter` that the caller owns and passes in explicitly (the controller
exports it as ``inferctl_invalid_samples_total{signal}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


#: ``Signal``'s "no inputs given" default (a fresh empty dict per signal, as ``default_factory=dict``)
_NO_INPUTS: Any = object()


@dataclass(frozen=True, init=False)
class Signal:
    """One signal value.

    ``value`` is a float, or ``None`` for no data. ``invalid`` is True when the input was
    present but rejected (negative, NaN, ratio > 1, inconsistent); ``reason`` says why the
    value is None, or notes something about a valid value (e.g. a counter reset).
    ``inputs`` are the numbers it was computed from, for events.

    Immutable like any frozen dataclass (assignment raises ``FrozenInstanceError``); its
    ``__init__`` fills the instance dict in one call instead of the generated five
    ``object.__setattr__`` calls: the tick builds ~25 signals per engine (0.96 vs 1.77 us each).
    """

    name: str
    value: float | None
    reason: str | None = None
    invalid: bool = False
    inputs: dict[str, Any] = field(default_factory=dict)

    def __init__(self, name: str, value: float | None, reason: str | None = None, invalid: bool = False,
                 inputs: dict[str, Any] = _NO_INPUTS) -> None:
        object.__setattr__(self, "__dict__", {"name": name, "value": value, "reason": reason, "invalid": invalid,
                                              "inputs": {} if inputs is _NO_INPUTS else inputs})

    @property
    def ok(self) -> bool:
        """True when there is a value."""
        return self.value is not None


class InvalidSampleCounter:
    """Counts rejected samples by ``(signal, reason code)``. One instance per controller,
    passed explicitly to the signal functions; never a global."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def record(self, signal: str, reason: str) -> None:
        """Count one rejected sample of ``signal`` for ``reason`` (a short code such as
        ``negative``, ``nan``, ``above_one``)."""
        key = (str(signal), str(reason))
        self._counts[key] = self._counts.get(key, 0) + 1

    def count(self, signal: str | None = None, reason: str | None = None) -> int:
        """Total rejected samples, optionally for one signal and/or one reason."""
        return sum(n for (s, r), n in self._counts.items()
                   if (signal is None or s == signal) and (reason is None or r == reason))

    def by_signal(self) -> dict[str, int]:
        """``{signal: count}`` — the label set of ``inferctl_invalid_samples_total``."""
        out: dict[str, int] = {}
        for (s, _), n in self._counts.items():
            out[s] = out.get(s, 0) + n
        return out

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{signal: {reason: count}}`` for /status."""
        out: dict[str, dict[str, int]] = {}
        for (s, r), n in sorted(self._counts.items()):
            out.setdefault(s, {})[r] = n
        return out


@dataclass(frozen=True)
class FleetSignal:
    """A fleet-wide value and each member's own value (members keyed by engine name)."""

    fleet: Signal
    members: dict[str, Signal]


def no_data(name: str, reason: str, **inputs: Any) -> Signal:
    """A value-less, valid ``Signal`` ("no data", not counted) with ``reason`` in words."""
    return Signal(name, None, reason, False, dict(inputs))


def invalid_signal(name: str, code: str, reason: str, counter: InvalidSampleCounter | None,
                   **inputs: Any) -> Signal:
    """A value-less ``Signal`` marked invalid, counted in ``counter`` as ``(name, code)``."""
    if counter is not None:
        counter.record(name, code)
    return Signal(name, None, reason, True, dict(inputs))


def first_missing(name: str, inputs: dict[str, Any], *checked: Signal) -> Signal | None:
    """A value-less ``Signal`` named ``name`` that carries the reason and ``invalid`` flag of
    the first of ``checked`` without a value (the inputs already validated), or None when
    every one has a value."""
    for s in checked:
        if s.value is None:
            return Signal(name, None, s.reason, s.invalid, inputs)
    return None

