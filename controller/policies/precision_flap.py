"""The precision policy's ping-pong guard: switches per window and relapses per prompt-size class
(docs/policies.md "No ping-pong").

Why it exists: the relapse-doubling hold alone lets a large prompt that comes back after every
rollback make seven switches in ten minutes (holds 60, 120, 240 s: four degrades and three
rollbacks by t = 430 s; the hourly pin only counted degrades and only on the fifth). Three rules
bound it:

* **a cap on switches** (degrades + rollbacks, automatic only) per rolling window
  (``max_switches`` per ``window_seconds``): a rollback is allowed only while it leaves room for
  the degrade a relapse would need (count + 2 <= cap), so the count never exceeds the cap. A
  degrade is never refused (an OOM is a safety matter); an OOM with the window full pins int8.
* **a hold per size class**: a relapse of class C multiplies the hold by
  ``growth ** relapses[C]`` (capped); the rollback waits for the longest hold of the classes seen.
* **a pin after K relapses of one class** (``pin_after``): the same kind of request keeps
  failing in full precision, so int8 stays until an operator unpins.

The size class is the fault's ``prompt_len_bucket`` (the contract's prompt-length buckets, when
the engine reports it), else the order of magnitude of the requested bytes (``bytes:1e8``).
Times are seconds (``time.time()`` scale); pure: ``now`` comes from the caller.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping


def size_class(inputs: Mapping[str, Any]) -> str:
    """``prompt:<bucket>`` from the fault's ``prompt_len_bucket``, else ``bytes:1e<k>`` with k the
    decimal order of magnitude of ``requested_bytes``, else ``unknown``."""
    bucket = inputs.get("prompt_len_bucket")
    if isinstance(bucket, str) and bucket:
        return f"prompt:{bucket}"
    req = inputs.get("requested_bytes")
    if isinstance(req, (int, float)) and not isinstance(req, bool) and req > 0 and math.isfinite(req):
        return f"bytes:1e{int(math.floor(math.log10(req)))}"
    return "unknown"


@dataclass
class FlapGuard:
    """Switch counting and per-class relapses of one engine (settings from ``PrecisionConfig``)."""

    max_switches: int
    window_seconds: float
    pin_after: int
    hold_seconds: float
    growth: float
    max_hold_seconds: float
    switches: deque = field(default_factory=deque)           # times of automatic switches
    relapses: dict[str, int] = field(default_factory=dict)   # size class -> relapses
    last_class: str | None = None
    deferred_since: float | None = None

    def _trim(self, now: float) -> None:
        while self.switches and now - self.switches[0] >= self.window_seconds:
            self.switches.popleft()

    def count(self, now: float) -> int:
        """Automatic switches within the window ending at ``now``."""
        self._trim(now)
        return len(self.switches)

    def record(self, now: float) -> None:
        self._trim(now)
        self.switches.append(now)

    def rollback_room(self, now: float) -> bool:
        """Whether a rollback leaves room for a relapse's degrade within the cap."""
        return self.count(now) + 2 <= self.max_switches

    def class_hold(self, cls: str) -> float:
        return min(self.hold_seconds * self.growth ** self.relapses.get(cls, 0), self.max_hold_seconds)

    def on_degrade(self, now: float, cls: str, relapse: bool) -> tuple[float, str | None]:
        """A degrade of class ``cls`` (``relapse``: within the relapse window of a rollback).
        Returns ``(hold for this class, pin reason or None)``. A non-relapse degrade forgets the
        class history (the request came back long after)."""
        if relapse:
            self.relapses[cls] = self.relapses.get(cls, 0) + 1
        else:
            self.relapses.clear()
        self.last_class = cls
        full = self.count(now) + 1 > self.max_switches
        self.record(now)
        n = self.relapses.get(cls, 0)
        if n >= self.pin_after:
            return self.class_hold(cls), (f"size class {cls} relapsed {n} times after rollbacks (>= "
                                          f"{self.pin_after})")
        if full:
            return self.class_hold(cls), (f"{self.count(now)} automatic switches within "
                                          f"{self.window_seconds:g} s > cap {self.max_switches}")
        return self.class_hold(cls), None

    def longest_hold(self) -> float:
        """The longest hold among the classes with relapses (the base hold without any)."""
        return max([self.class_hold(c) for c in self.relapses] or [self.hold_seconds])

    def reset(self) -> None:
        """An operator unpinned: forget relapses (the window's switches stay counted)."""
        self.relapses.clear()
        self.deferred_since = None

    def state(self, now: float) -> dict[str, Any]:
        return {"switches_in_window": self.count(now), "max_switches_per_window": self.max_switches,
                "switch_window_seconds": self.window_seconds, "class_relapses": dict(self.relapses),
                "class_holds": {c: self.class_hold(c) for c in self.relapses},
                "pin_after_class_relapses": self.pin_after, "last_size_class": self.last_class,
                "rollback_deferred_since": self.deferred_since}
