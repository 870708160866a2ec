"""The metric catalog as the generators see it: both sides' lists merged, plus exposed series.

Dashboards and rules may only name series that this module knows. It reads the three catalog
modules (``engine.metrics.ENGINE_METRICS``, ``controller.metrics.CONTROLLER_METRICS`` and
``router.metrics.ROUTER_METRICS``) and nothing else of the engine, the controller or the router.

A catalog entry is a plain dict ``{"name", "type", "unit", "help", "labels", "buckets"?}``
(see ``docs/architecture.md``, "Metric catalogs"). On the wire a histogram ``x`` is the three
series ``x_bucket`` (extra label ``le``), ``x_sum`` and ``x_count``; counters and gauges are
exposed under their own name (prometheus-client also writes ``*_created`` series, which no
expression here uses). Every scraped series also carries the target labels ``job`` and
``instance`` that Prometheus attaches (https://prometheus.io/docs/concepts/jobs_instances/).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from inferctl.contract.thresholds import THRESHOLDS
from inferctl.controller.metrics import CONTROLLER_METRICS
from inferctl.engine.metrics import ENGINE_METRICS
from inferctl.router.metrics import ROUTER_METRICS

#: Labels Prometheus attaches to every scraped series (target labels).
TARGET_LABELS: tuple[str, ...] = ("job", "instance")

#: Series that Prometheus itself synthesises per scrape target and that rules may name
#: (https://prometheus.io/docs/concepts/jobs_instances/#automatically-generated-labels-and-time-series).
SYNTHETIC_SERIES: Mapping[str, tuple[str, ...]] = MappingProxyType({"up": ()})

#: Scrape job names the dashboards, the rules and docs/observability.md agree on (read from
#: :data:`inferctl.contract.thresholds.THRESHOLDS`; defined there, only named here).
ENGINE_JOB = THRESHOLDS.engine_job
CONTROLLER_JOB = THRESHOLDS.controller_job
ROUTER_JOB = THRESHOLDS.router_job

_METRIC_TYPES = ("counter", "gauge", "histogram")


@dataclass(frozen=True)
class Series:
    """One exposed series name: the catalog ``metric`` it belongs to, its ``kind``
    (``counter``, ``gauge``, ``bucket``, ``sum``, ``count`` or ``synthetic``) and the label
    names it may carry (catalog labels + target labels, + ``le`` for buckets)."""

    name: str
    metric: str
    kind: str
    labels: frozenset[str]


def metric_catalog() -> dict[str, dict]:
    """The three catalogs merged by name: ``{name: spec}`` (``spec["side"]``: engine,
    controller or router).

    Raises:
        ValueError: a name appears twice, an entry lacks a field, or its type is not one of
            counter, gauge, histogram (the catalog would be ambiguous to generate from).
    """
    merged: dict[str, dict] = {}
    for side, specs in (("engine", ENGINE_METRICS), ("controller", CONTROLLER_METRICS),
                        ("router", ROUTER_METRICS)):
        for spec in specs:
            for field in ("name", "type", "unit", "help", "labels"):
                if field not in spec:
                    raise ValueError(f"{side} catalog entry {spec!r}: missing field {field!r}")
            if spec["type"] not in _METRIC_TYPES:
                raise ValueError(f"{spec['name']}: type {spec['type']!r} is not one of {_METRIC_TYPES}")
            if spec["name"] in merged:
                raise ValueError(f"{spec['name']}: defined twice in the catalogs")
            merged[spec["name"]] = dict(spec, side=side)
    return merged


def scraped_label(label: str) -> str:
    """The name a catalog label has in Prometheus: a label that collides with a target label
    (``job``, ``instance``) is stored as ``exported_<label>`` under the default
    ``honor_labels: false`` (https://prometheus.io/docs/prometheus/latest/configuration/configuration/#scrape_config)."""
    return f"exported_{label}" if label in TARGET_LABELS else label


def exposed_series(catalog: Mapping[str, dict] | None = None) -> dict[str, Series]:
    """Every series name a scrape of the engine, controller or router can carry, plus ``up``.

    Returns ``{series_name: Series}``; a histogram contributes ``_bucket``, ``_sum``,
    ``_count``.
    """
    catalog = metric_catalog() if catalog is None else catalog
    out: dict[str, Series] = {}
    for name, spec in catalog.items():
        labels = frozenset(scraped_label(lbl) for lbl in spec["labels"]) | frozenset(TARGET_LABELS)
        if spec["type"] == "histogram":
            out[f"{name}_bucket"] = Series(f"{name}_bucket", name, "bucket", labels | {"le"})
            out[f"{name}_sum"] = Series(f"{name}_sum", name, "sum", labels)
            out[f"{name}_count"] = Series(f"{name}_count", name, "count", labels)
        else:
            out[name] = Series(name, name, spec["type"], labels)
    for name, labels in SYNTHETIC_SERIES.items():
        out[name] = Series(name, name, "synthetic", frozenset(labels) | frozenset(TARGET_LABELS))
    return out


def gauge_names(catalog: Mapping[str, dict] | None = None) -> frozenset[str]:
    """Names of the catalog's gauges (which must never be aggregated with ``sum``)."""
    catalog = metric_catalog() if catalog is None else catalog
    return frozenset(n for n, s in catalog.items() if s["type"] == "gauge")
