"""The metric-spec type and the one registry builder of both metric catalogs.

A catalog (``inferctl.engine.metrics.ENGINE_METRICS``, ``inferctl.controller.metrics.
CONTROLLER_METRICS``) is a list of :class:`MetricSpec` dicts: plain data, so dashboards and
alert generators read it without importing the side that owns it. Names follow the
Prometheus naming conventions (https://prometheus.io/docs/practices/naming/): base units,
``_total`` for counters, ``_seconds``, ``_bytes``, ``_ratio`` (0..1).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NotRequired, TypedDict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

MetricType = Literal["counter", "gauge", "histogram"]


class MetricSpec(TypedDict):
    """One series of a catalog.

    ``name``: the full exposition name (counters end in ``_total``); ``type``: counter,
    gauge or histogram; ``unit``: the base unit in words ("" for a dimensionless flag);
    ``help``: the HELP text; ``labels``: label names, in order; ``buckets``: histogram
    upper bounds (histograms only).
    """

    name: str
    type: MetricType
    unit: str
    help: str
    labels: tuple[str, ...]
    buckets: NotRequired[tuple[float, ...]]


_KINDS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


def base_name(spec: MetricSpec) -> str:
    """The name to give prometheus-client: it appends ``_total`` to counters itself."""
    name = spec["name"]
    if spec["type"] == "counter" and name.endswith("_total"):
        return name[: -len("_total")]
    return name


def build_registry(specs: Iterable[MetricSpec],
                   registry: CollectorRegistry | None = None) -> tuple[CollectorRegistry, dict]:
    """Create every metric of ``specs`` in ``registry`` (a fresh one when ``None``).

    Returns ``(registry, metrics)``: ``metrics`` maps the catalog name (with ``_total``) to the
    prometheus-client object. A fresh registry per engine/controller keeps tests independent.

    Raises:
        KeyError: a spec's ``type`` is not counter, gauge or histogram, or a histogram has no
            ``buckets``.
        ValueError: prometheus-client rejects a name or a duplicate.
    """
    # no ``*_created`` series (one per counter and histogram child: a quarter of the controller's
    # /metrics at 1,024 engines, read by nothing here; prometheus-client's documented switch,
    # https://prometheus.github.io/client_python/instrumentation/#disabling-_created-metrics,
    # process-wide and idempotent: every registry built here is the same)
    disable_created_metrics()
    registry = registry if registry is not None else CollectorRegistry()
    metrics: dict = {}
    for spec in specs:
        cls = _KINDS[spec["type"]]
        kwargs: dict = {"registry": registry, "labelnames": tuple(spec["labels"])}
        if spec["type"] == "histogram":
            kwargs["buckets"] = spec["buckets"]
        metrics[spec["name"]] = cls(base_name(spec), spec["help"], **kwargs)
    return registry, metrics
