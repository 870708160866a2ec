"""The controller's ``/metrics`` body: ``prometheus_client.generate_latest``'s exact bytes, made
cheaper for the fleet's labelled gauges and counters.

Why: at 1,024 engines and 256 GPUs the controller registry holds ~19,000 series (1.3 MB);
``generate_latest`` spends ~10 µs per series building a ``Sample`` for each, sorting and escaping
its labels and formatting its value (190–440 ms a render here, target 100 ms; docs/benchmarks.md
"Controller"). Most series are per engine or per GPU, change at most once per tick, and most
values not at all. :class:`FleetExposition` renders each plain labelled ``Gauge``/``Counter``
series from its label values and current value, keeping each series' last line (value and text)
so that an unchanged series costs a dict look-up; every other collector (histograms, custom
collectors, an unlabelled metric, a gauge with ``set_function``) is rendered by
``generate_latest`` itself. Values are read live at every render (never a stale copy).

The format is the Prometheus text format 0.0.4
(https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format): label values
escape ``\\``, ``"`` and newline; values as prometheus-client's ``floatToGoString``. It reads
prometheus-client's per-metric state (``_metrics``, ``_labelnames``, ``_value``); the tests
(tests/unit/test_controller_exposition.py) check the bytes equal ``generate_latest``'s, so a
prometheus-client release that changes those internals fails them rather than the scrape.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from prometheus_client import Counter, Gauge, generate_latest
from prometheus_client import metrics as pc_metrics
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

__all__ = ["FleetExposition"]

#: Lines kept per series before the cache is emptied and rebuilt (series churn bound).
_MAX_CACHED = 1_000_000


class _One:
    """One collector as a registry-like object for ``generate_latest``."""

    def __init__(self, collector: Any) -> None:
        self.collector = collector

    def collect(self) -> Iterable[Any]:
        return self.collector.collect()


def _escape(value: str) -> str:
    """A label value in the text format (backslash, double quote, newline escaped)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _same(a: float, b: float) -> bool:
    """Whether ``a`` and ``b`` print alike: equal with the same sign (0.0 and -0.0 differ), or both NaN."""
    if a == b:
        return bool(a) or math.copysign(1.0, a) == math.copysign(1.0, b)
    return a != a and b != b


class FleetExposition:
    """Renders ``registry`` as ``generate_latest(registry)`` does (same bytes, see the module doc).

    One instance per registry (it keeps each series' last line). Thread-safe for concurrent
    renders (each render reads a copy of each metric's series; the cache's writes are whole
    entries). ``render()`` returns the body (bytes, UTF-8).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._headers: dict[int, str] = {}
        # (id(metric), label values) -> (value, line); an entry is replaced when its value changes
        self._lines: dict[tuple[int, tuple[str, ...]], tuple[float, str]] = {}

    def _collectors(self) -> list[Any] | None:
        """The registry's collectors in registration order (None: not a CollectorRegistry)."""
        names = getattr(self.registry, "_collector_to_names", None)
        lock = getattr(self.registry, "_lock", None)
        if names is None or lock is None:
            return None
        with lock:
            return list(names)

    def render(self) -> bytes:
        """The exposition body (``generate_latest``'s bytes)."""
        collectors = self._collectors()
        if collectors is None:
            return generate_latest(self.registry)
        if len(self._lines) > _MAX_CACHED:
            self._lines = {}
        out: list[str] = []
        for collector in collectors:
            if not self._fast(collector, out):
                out.append(generate_latest(_One(collector)).decode("utf-8"))
        return "".join(out).encode("utf-8")

    def _fast(self, metric: Any, out: list[str]) -> bool:
        """Append ``metric``'s lines to ``out`` when it is a plain labelled Gauge or Counter
        (True); False leaves it to ``generate_latest``."""
        kind = type(metric)
        if kind is Counter:
            if pc_metrics._use_created:
                return False
            suffix = "_total"
        elif kind is Gauge:
            suffix = ""
        else:
            return False
        labelnames = getattr(metric, "_labelnames", None)
        series = getattr(metric, "_metrics", None)
        if not labelnames or series is None:
            return False
        with metric._lock:
            series = list(series.items())
        if any("_child_samples" in child.__dict__ for _, child in series):   # set_function
            return False
        key = id(metric)
        header = self._headers.get(key)
        if header is None:
            name = metric._name + suffix
            doc = metric._documentation.replace("\\", r"\\").replace("\n", r"\n")
            header = self._headers[key] = f"# HELP {name} {doc}\n# TYPE {name} {metric._type}\n"
        out.append(header)
        order = sorted(range(len(labelnames)), key=lambda i: labelnames[i])   # generate_latest sorts labels
        sample = metric._name + suffix
        lines = self._lines
        for values, child in series:
            value = child._value.get()
            ck = (key, values)
            cached = lines.get(ck)
            if cached is not None and _same(cached[0], value):
                out.append(cached[1])
                continue
            labels = ",".join(f'{labelnames[i]}="{_escape(values[i])}"' for i in order)
            line = f"{sample}{{{labels}}} {floatToGoString(value)}\n"
            lines[ck] = (value, line)
            out.append(line)
        return True
