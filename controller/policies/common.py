"""Small pieces the policies share: config validation, the per-engine poll start and the hold
clock.

Policies are pure state machines: they take ``now`` (seconds, ``time.time()`` scale) from the
caller, never read a clock, never sleep, never do I/O.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, TypeVar

from inferctl.controller.policies.base import EnginePolicy

T = TypeVar("T")


class PolicyError(ValueError):
    """A request a policy refuses (e.g. unpin when not pinned); the message says why."""


def check_number(name: str, value: Any, *, minimum: float | None = None,
                 maximum: float | None = None, strict_min: bool = False,
                 allow_none: bool = False) -> None:
    """Raise ``ValueError`` naming the config field and its limit when ``value`` is not a
    finite number in range."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: {value!r} must be a finite number")
    if minimum is not None:
        if strict_min and value <= minimum:
            raise ValueError(f"{name}: {value!r} must be > {minimum:g}")
        if not strict_min and value < minimum:
            raise ValueError(f"{name}: {value!r} must be >= {minimum:g}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: {value!r} must be <= {maximum:g}")


def config_from_mapping(cls: type[T], data: Mapping[str, Any] | T | None) -> T:
    """Build the config dataclass ``cls`` from a mapping (e.g. a YAML section); unknown keys
    raise ``ValueError`` naming them; ``enabled`` is ignored. An instance of ``cls`` is returned as is; None gives the
    defaults."""
    if data is None:
        return cls()
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ValueError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    # ``enabled`` (in the YAML sections) is the loop's business: whether to run the policy.
    data = {k: v for k, v in data.items() if k != "enabled"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    return cls(**dict(data))


class PerEnginePolicy(EnginePolicy):
    """What the per-engine policies (breaker, fragmentation, precision) share (besides the
    :class:`~inferctl.controller.policies.base.EnginePolicy` interface): ``engine``, the
    engine's name (given, or bound by the first snapshot); ``_since``, when the current state
    began (the first poll until a transition sets it); ``_last_now``, the latest ``now`` seen
    (seconds). Subclasses set all three in ``__init__``."""

    engine: str | None
    _since: float | None
    _last_now: float | None

    def _start_poll(self, now: float, engine: str) -> None:
        """Begin one poll at ``now`` of the engine named ``engine``: bind the policy to it on
        the first poll, start ``_since`` if unset, record ``_last_now``. Raises ``ValueError``
        for another engine's snapshot."""
        if self.engine is None:
            self.engine = engine
        elif engine != self.engine:
            raise ValueError(f"engine: this policy is for {self.engine!r}, got {engine!r}")
        if self._since is None:
            self._since = now
        self._last_now = now


class HoldClock:
    """How long a condition has held continuously.

    ``update(now, ok)`` starts the clock on the first good sample and stops it on a bad or
    missing one (no data is not a good sample). ``held(now)`` is the seconds since it
    started, or 0.0 when stopped. ``last_reset`` keeps why it last stopped.
    """

    def __init__(self) -> None:
        self.since: float | None = None
        self.last_reset: dict[str, Any] | None = None

    def update(self, now: float, ok: bool, why_not: str | None = None) -> None:
        if ok:
            if self.since is None:
                self.since = now
        else:
            if self.since is not None or why_not is not None:
                self.last_reset = {"time": now, "reason": why_not or "condition not met"}
            self.since = None

    def reset(self, now: float, why: str) -> None:
        self.since = None
        self.last_reset = {"time": now, "reason": why}

    def held(self, now: float) -> float:
        return 0.0 if self.since is None else max(0.0, now - self.since)
