"""The one interface every policy implements, and its declared, checked transitions.

A policy is a pure state machine (docs/policies.md): it takes ``now`` (seconds, ``time.time()``
scale) and observations from the caller and returns :class:`~inferctl.controller.types.Decision`
objects; it never reads a clock, sleeps or does I/O. The loop talks to every policy through the
same four calls:

* ``observe(now, ...)`` — one poll: an engine policy (:class:`EnginePolicy`) gets the engine's
  snapshot, its GPU's snapshot and whether GPU telemetry is up; a GPU policy
  (:class:`GpuPolicy`) gets the whole GPU reading and the engines' last snapshots.
* ``on_result(now, decision, ok, detail, dry_run)`` — how an action the policy decided went.
* ``state(now)`` — a plain dict for ``/status``.
* ``gauges(now)`` — the policy's Prometheus gauges (:class:`Gauge`), which the exporter sets.

Each policy class declares ``TRANSITIONS``, a mapping ``(state, event) → state``; a state
change it makes must be one of them (:meth:`Policy.check_transition` raises
:class:`TransitionError` otherwise), and docs/policies.md prints these tables
(``inferctl.controller.policies.doc``).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from inferctl.controller.types import Decision, EngineSnapshot, GpuReading, GpuSnapshot


class TransitionError(RuntimeError):
    """A policy made a state change that its ``TRANSITIONS`` table does not declare (a bug in
    the policy, never an input error); the message names the policy, state, event and target."""


@dataclass(frozen=True)
class Gauge:
    """One gauge value a policy exports: metric ``name`` (a ``controller.metrics`` catalog
    entry), ``value`` (None = no data: the series is removed, never set to 0) and the labels
    besides ``engine`` (the exporter adds the engine's name)."""

    name: str
    value: float | None
    labels: Mapping[str, str] = field(default_factory=dict)


class Policy(ABC):
    """What every policy shares: its ``NAME`` (the event source and the ``/status`` key), the
    declared ``TRANSITIONS`` and the counters bumped when a state is entered
    (``COUNTED_ENTRIES``: state value → counter metric, labelled by the decision's target)."""

    NAME: ClassVar[str]
    TRANSITIONS: ClassVar[Mapping[tuple[enum.Enum, str], enum.Enum]]
    COUNTED_ENTRIES: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def check_transition(cls, state: enum.Enum, event: str, to: enum.Enum) -> None:
        """Raise :class:`TransitionError` unless ``(state, event) → to`` is declared."""
        declared = cls.TRANSITIONS.get((state, event))
        if declared is not to:
            raise TransitionError(
                f"{cls.NAME}: transition {state.value} --{event}--> {to.value} is not declared"
                + ("" if declared is None else f" (declared: --{event}--> {declared.value})"))

    @abstractmethod
    def state(self, now: float | None = None) -> dict[str, Any]:
        """A plain dict for ``/status`` (strict JSON data)."""

    def gauges(self, now: float) -> list[Gauge]:
        """The gauges this policy exports now (none by default)."""
        return []

    @abstractmethod
    def on_result(self, now: float, decision: Decision, ok: bool, detail: str = "",
                  dry_run: bool = False) -> list[Decision]:
        """How ``decision``'s action went: ``ok``, the one-line ``detail``, and ``dry_run``
        when the rails only pretended (nothing was done). Returns follow-up decisions."""


class EnginePolicy(Policy):
    """A policy over one engine (precision, fragmentation, latency breaker)."""

    @abstractmethod
    def observe(self, now: float, engine: EngineSnapshot, gpu: GpuSnapshot | None = None,
                telemetry_ok: bool = True) -> list[Decision]:
        """One poll of the engine (``gpu``: its GPU's snapshot, None when unknown;
        ``telemetry_ok``: whether the GPU source answered) → decisions."""

    def record_action_result(self, now: float, action: str, ok: bool,
                             detail: str = "") -> list[Decision]:
        """The engine-policy form of a result (``action`` name); nothing by default."""
        return []

    def on_result(self, now: float, decision: Decision, ok: bool, detail: str = "",
                  dry_run: bool = False) -> list[Decision]:
        return self.record_action_result(now, decision.action or "", ok, detail)


class GpuPolicy(Policy):
    """A policy over every GPU of a reading (hardware health). Its decisions' targets are GPU
    UUIDs (or engine names for the engine actions it asks for)."""

    @abstractmethod
    def observe(self, now: float, reading: GpuReading,
                engines: Mapping[str, EngineSnapshot] | None = None) -> list[Decision]:
        """One GPU poll (``engines``: the engines' last snapshots by name) → decisions."""

    def record_action_result(self, now: float, gpu_uuid: str, action: str, ok: bool,
                             detail: str = "") -> list[Decision]:
        """The GPU-policy form of a result; nothing by default."""
        return []

    def record_dry_run(self, now: float, gpu_uuid: str, action: str,
                       detail: str = "") -> list[Decision]:
        """A decided action that ran as a dry run; nothing by default."""
        return []

    def on_result(self, now: float, decision: Decision, ok: bool, detail: str = "",
                  dry_run: bool = False) -> list[Decision]:
        action = decision.action or ""
        if dry_run:
            return self.record_dry_run(now, decision.target, action, detail)
        return self.record_action_result(now, decision.target, action, ok, detail)


def observe_engine(policy: Any, now: float, snap: EngineSnapshot, gpu: GpuSnapshot | None,
                   telemetry_ok: bool) -> list[Decision]:
    """``policy.observe`` for an engine poll: an :class:`EnginePolicy` gets the GPU and the
    telemetry flag; another object with ``observe(now, snapshot)`` gets the snapshot only."""
    if isinstance(policy, EnginePolicy):
        return policy.observe(now, snap, gpu, telemetry_ok)
    return policy.observe(now, snap)


def observe_gpu(policy: Any, now: float, reading: GpuReading,
                engines: Mapping[str, EngineSnapshot]) -> list[Decision]:
    """``policy.observe`` for a GPU poll: a :class:`GpuPolicy` gets the engines' snapshots too;
    another object with ``observe(now, reading)`` gets the reading only."""
    if isinstance(policy, GpuPolicy):
        return policy.observe(now, reading, engines)
    return policy.observe(now, reading)


def policy_state(policy: Any, now: float) -> Any:
    """``policy.state(now)`` (or ``state()`` for one that takes no time); an exception becomes
    ``{"error": repr}`` so one broken policy never breaks ``/status``."""
    try:
        return policy.state(now)
    except TypeError:
        return policy.state()
    except Exception as exc:
        return {"error": repr(exc)}
