"""Latency breaker: route new requests to a lightweight model while TTFT is too high.

The design (docs/design.md): "a request over 500 ms degrades to a lightweight model". A classic circuit
breaker on TTFT p99 over a sliding window (Prometheus ``histogram_quantile`` over the window's
bucket deltas). Decides only; the loop applies the routing (``route_light``/``route_main``/
``probe``) and records events.

States (one instance per engine)::

    CLOSED ──p99 over the window > threshold, ≥ min_requests──▶ OPEN   (route_light)
    OPEN ──open_seconds elapsed──▶ HALF_OPEN                           (probe)
    HALF_OPEN ──probes' p99 ≤ close threshold, ≥ probe_min_requests──▶ CLOSED (route_main)
    HALF_OPEN ──probes' p99 > close threshold──▶ OPEN                  (route_light)

No data (no histogram, no observation in the window, or a histogram flagged implausible or
inconsistent; docs/field-cases.md: "no traffic turns into NaN", "an impossible TTFT
histogram") changes nothing: the breaker neither opens nor closes.
A "≥ bound" p99 (the quantile fell in the +Inf bucket) counts as over the threshold.
The main model's own TTFT histogram is used when the engine labels them by model
(``EngineSnapshot.ttft_histogram_by_model``); otherwise the engine-wide one, noted in the
decision's inputs as ``histogram_scope: engine``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping

from inferctl.contract.thresholds import THRESHOLDS
from inferctl.controller.policies.base import Gauge
from inferctl.controller.policies.common import PerEnginePolicy, check_number, config_from_mapping
from inferctl.controller.signals import (InvalidHistogram, InvalidSampleCounter, LatencySummary,
                                histogram_delta, latency_summary, to_histogram)
from inferctl.controller.types import Decision, EngineSnapshot, GpuSnapshot

POLICY = "breaker"


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


_B = BreakerState
#: (state, event) → state: every state change of the breaker (docs/policies.md).
TRANSITIONS: Mapping[tuple[BreakerState, str], BreakerState] = {
    (_B.CLOSED, "ttft_over"): _B.OPEN,
    (_B.OPEN, "open_elapsed"): _B.HALF_OPEN,
    (_B.HALF_OPEN, "probes_over"): _B.OPEN,
    (_B.HALF_OPEN, "probes_ok"): _B.CLOSED,
}


@dataclass
class BreakerConfig:
    """``light_model`` (required: the lightweight model the engine serves);
    ``main_model`` (default: the engine's reported model); ``ttft_threshold_seconds`` (0.5,
    ``contract.thresholds.THRESHOLDS.ttft_seconds``); ``close_threshold_seconds`` (default =
    the threshold); ``quantile`` (0.99, ``THRESHOLDS.latency_quantile``);
    ``window_seconds`` (30); ``min_requests`` (20) observations in the window to judge;
    ``open_seconds`` (30) before a probe; ``probe_fraction`` (0.1) of new requests and at most
    ``probe_max_requests`` (20) sent to the main model while half-open;
    ``probe_min_requests`` (5) probe observations needed to decide."""

    light_model: str = ""
    main_model: str | None = None
    ttft_threshold_seconds: float = THRESHOLDS.ttft_seconds
    close_threshold_seconds: float | None = None
    quantile: float = THRESHOLDS.latency_quantile
    window_seconds: float = 30.0
    min_requests: int = 20
    open_seconds: float = 30.0
    probe_fraction: float = 0.1
    probe_max_requests: int = 20
    probe_min_requests: int = 5

    def __post_init__(self) -> None:
        if not isinstance(self.light_model, str) or not self.light_model.strip():
            raise ValueError("light_model: required (the lightweight model the engine serves)")
        if self.main_model is not None and self.main_model == self.light_model:
            raise ValueError("main_model: must differ from light_model")
        check_number("ttft_threshold_seconds", self.ttft_threshold_seconds, minimum=0,
                     strict_min=True)
        check_number("close_threshold_seconds", self.close_threshold_seconds, minimum=0,
                     strict_min=True, allow_none=True)
        check_number("quantile", self.quantile, minimum=0, maximum=1, strict_min=True)
        check_number("window_seconds", self.window_seconds, minimum=0, strict_min=True)
        check_number("min_requests", self.min_requests, minimum=1)
        check_number("open_seconds", self.open_seconds, minimum=0)
        check_number("probe_fraction", self.probe_fraction, minimum=0, maximum=1,
                     strict_min=True)
        check_number("probe_max_requests", self.probe_max_requests, minimum=1)
        check_number("probe_min_requests", self.probe_min_requests, minimum=1)

    @property
    def close_threshold(self) -> float:
        return (self.ttft_threshold_seconds if self.close_threshold_seconds is None
                else self.close_threshold_seconds)


class LatencyBreaker(PerEnginePolicy):
    """The latency breaker for one engine. Pure: ``now`` comes from the caller. Its state
    changes are :data:`TRANSITIONS`; entering OPEN counts a trip
    (``inferctl_breaker_trips_total``)."""

    NAME = POLICY
    TRANSITIONS = TRANSITIONS
    COUNTED_ENTRIES = {BreakerState.OPEN.value: "inferctl_breaker_trips_total"}

    def __init__(self, config: BreakerConfig | Mapping[str, Any], *, engine: str | None = None,
                 counter: InvalidSampleCounter | None = None) -> None:
        self.config = config_from_mapping(BreakerConfig, config)
        self.engine = engine
        self.counter = counter
        self._state = BreakerState.CLOSED
        self._since: float | None = None
        self._history: deque[tuple[float, Any]] = deque()   # (time, Histogram)
        self._opened_at: float | None = None
        self._probe_baseline: Any = None
        self._trips = 0
        self._last: dict[str, Any] | None = None
        self._last_now: float | None = None

    @property
    def current(self) -> BreakerState:
        return self._state

    def observe(self, now: float, engine: EngineSnapshot, gpu: GpuSnapshot | None = None,
                telemetry_ok: bool = True) -> list[Decision]:
        """One poll of the engine → decisions (``route_light``, ``probe``, ``route_main``);
        ``gpu`` and ``telemetry_ok`` are not used. Raises ``ValueError`` for another engine's
        snapshot."""
        self._start_poll(now, engine.name)
        if not engine.ok:
            return []
        main = self.config.main_model or engine.model
        doc, scope = engine.ttft_histogram, "engine"
        if main and main in (engine.ttft_histogram_by_model or {}):
            doc, scope = engine.ttft_histogram_by_model[main], "model"
        if doc is None:
            self._last = {"reason": "no TTFT histogram"}
            return []
        try:
            hist = to_histogram(doc)
        except InvalidHistogram as exc:
            if self.counter is not None:
                self.counter.record("ttft_seconds", "invalid")
            self._last = {"reason": str(exc)}
            return []
        # the cumulative histogram's plausibility (docs/field-cases.md): inconsistent data stays out
        cumulative = latency_summary(
            hist, (self.config.quantile,), name="ttft_seconds",
            finished_total=engine.finished_total if scope == "engine" else None,
            running=engine.running)
        self._history.append((now, hist))
        while len(self._history) > 2 and self._history[1][0] <= now - self.config.window_seconds:
            self._history.popleft()
        common = {"histogram_scope": scope, "main_model": main,
                  "light_model": self.config.light_model, "quantile": self.config.quantile}
        if cumulative.flags:
            self._last = {"reason": cumulative.reason, "flags": list(cumulative.flags)}
            return []
        if self._state is BreakerState.CLOSED:
            return self._closed(now, common)
        if self._state is BreakerState.OPEN:
            return self._open(now, hist, common)
        return self._half_open(now, hist, common)

    # ------------------------------------------------------------------ states
    def _window(self, now: float) -> tuple[LatencySummary | None, float | None]:
        if len(self._history) < 2:
            return None, None
        t0, base = self._history[0]
        t1, cur = self._history[-1]
        delta = histogram_delta(base, cur)
        return (latency_summary(delta, (self.config.quantile,), name="ttft_seconds_window"),
                t1 - t0)

    def _judge(self, summary: LatencySummary | None, min_requests: int) -> tuple[bool | None, dict]:
        """(over?, inputs) — None when there is not enough usable data."""
        if summary is None:
            return None, {"reason": "no window yet (one sample)"}
        q = summary.p(self.config.quantile)
        info = {"observations": summary.count, "flags": list(summary.flags)}
        if q is None or not summary.slo_usable:
            info["reason"] = summary.reason or "no observations in the window"
            return None, info
        if (summary.count or 0) < min_requests:
            info["reason"] = f"{summary.count:g} observations < {min_requests}"
            return None, info
        info.update({"p": q.value, "p_at_least": q.at_least, "p_text": str(q)})
        return q, info

    def _closed(self, now: float, common: dict) -> list[Decision]:
        summary, span = self._window(now)
        q, info = self._judge(summary, self.config.min_requests)
        self._last = info
        if q is None or not q.exceeds(self.config.ttft_threshold_seconds):
            return []
        self._opened_at = now
        self._trips += 1
        inputs = {**common, **info, "window_seconds": span,
                  "threshold_seconds": self.config.ttft_threshold_seconds}
        return [self._transition(
            now, BreakerState.OPEN, "route_light",
            f"TTFT p{self.config.quantile * 100:g} {q} s over the last {span:g} s "
            f"({info['observations']:g} requests) > {self.config.ttft_threshold_seconds:g} s: "
            f"route new requests to the light model {self.config.light_model!r}", inputs,
            "warning", event="ttft_over")]

    def _open(self, now: float, hist: Any, common: dict) -> list[Decision]:
        opened_for = 0.0 if self._opened_at is None else now - self._opened_at
        if opened_for < self.config.open_seconds:
            return []
        self._probe_baseline = hist
        inputs = {**common, "probe_fraction": self.config.probe_fraction,
                  "probe_max_requests": self.config.probe_max_requests,
                  "open_seconds": self.config.open_seconds}
        return [self._transition(
            now, BreakerState.HALF_OPEN, "probe",
            f"open for {opened_for:g} s: probe the main model with "
            f"{self.config.probe_fraction:.0%} of new requests (at most "
            f"{self.config.probe_max_requests})", inputs, event="open_elapsed")]

    def _half_open(self, now: float, hist: Any, common: dict) -> list[Decision]:
        delta = histogram_delta(self._probe_baseline, hist)
        summary = latency_summary(delta, (self.config.quantile,), name="ttft_seconds_probe")
        q, info = self._judge(summary, self.config.probe_min_requests)
        self._last = info
        if q is None:
            return []
        inputs = {**common, **info, "close_threshold_seconds": self.config.close_threshold}
        if q.exceeds(self.config.close_threshold):
            self._opened_at = now
            self._trips += 1
            return [self._transition(
                now, BreakerState.OPEN, "route_light",
                f"probes' TTFT p{self.config.quantile * 100:g} {q} s > "
                f"{self.config.close_threshold:g} s: open again", inputs, "warning",
                event="probes_over")]
        self._history.clear()
        self._history.append((now, hist))
        return [self._transition(
            now, BreakerState.CLOSED, "route_main",
            f"probes' TTFT p{self.config.quantile * 100:g} {q} s <= "
            f"{self.config.close_threshold:g} s over {info['observations']:g} requests: "
            "route back to the main model", inputs, event="probes_ok")]

    # ------------------------------------------------------------------ helpers
    def _transition(self, now: float, to: BreakerState, action: str, reason: str,
                    inputs: dict[str, Any], severity: str = "info", *, event: str) -> Decision:
        """Move to ``to`` on ``event`` (a declared transition, else :class:`TransitionError`)."""
        frm = self._state
        self.check_transition(frm, event, to)
        self._state = to
        self._since = now
        return Decision(POLICY, self.engine or "", action, frm.value, to.value, reason,
                        inputs, severity)

    def gauges(self, now: float) -> list[Gauge]:
        """``inferctl_breaker_state{state}`` (1 for the current state, 0 for the others) and,
        once a window was judged, ``inferctl_ttft_p99_seconds`` (None: the window had no usable
        data) and ``inferctl_ttft_p99_saturated`` (1 when the p99 fell in the +Inf bucket: the
        value is only a lower bound)."""
        out = [Gauge("inferctl_breaker_state", 1.0 if s is self._state else 0.0, {"state": s.value})
               for s in BreakerState]
        last = self._last or {}
        p99 = last.get("p")
        out.append(Gauge("inferctl_ttft_p99_seconds", p99))
        out.append(Gauge("inferctl_ttft_p99_saturated",
                         None if p99 is None else (1.0 if last.get("p_at_least") else 0.0)))
        return out

    def state(self, now: float | None = None) -> dict[str, Any]:
        """A plain dict for ``/status``: state, since, trips, and the last judged window's
        quantile as ``ttft_p99_seconds`` (None when the last window had no usable data) with
        ``ttft_p99_at_least`` True when it is only a lower bound ("≥ bound")."""
        last = self._last or {}
        return {"policy": POLICY, "engine": self.engine, "state": self._state.value,
                "since": self._since, "opened_at": self._opened_at, "trips": self._trips,
                "light_model": self.config.light_model,
                "threshold_seconds": self.config.ttft_threshold_seconds,
                "ttft_p99_seconds": last.get("p"), "ttft_p99_at_least": last.get("p_at_least"),
                "last": self._last}
