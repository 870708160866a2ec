"""The dashboard spec types (:class:`DashboardSpec` of rows of :class:`PanelSpec`, each a list of
PromQL :class:`Target`) and the small constructors the dashboard modules share."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Range of every rate()/increase() on the dashboards: Grafana's ``$__rate_interval``
#: (https://grafana.com/docs/grafana/latest/datasources/prometheus/template-variables/).
W = "$__rate_interval"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    """One panel: ``kind`` is ``timeseries``, ``stat`` or ``state`` (state timeline);
    ``unit`` a Grafana unit id (``s``, ``bytes``, ``percentunit``, ``short``, ...);
    ``threshold`` draws a red line/colour from that value."""

    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"
    threshold: float | None = None
    min: float | None = None
    max: float | None = None
    width: int = 12


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    rows: tuple[tuple[str, tuple[PanelSpec, ...]], ...]
    tags: tuple[str, ...] = field(default=("inferctl",))


def T(expr: str, legend: str) -> Target:   # noqa: N802 (short constructor for the tables below)
    return Target(expr, legend)


def pct(quantile: float) -> str:
    """``0.99`` -> ``"p99"`` (legend text)."""
    return f"p{quantile * 100:g}"
