"""Prometheus-text engines (vLLM, TGI, llama.cpp): scrape ``/metrics``, map to EngineSnapshot.

Metric names (each flavor's own documentation):

- vLLM (docs/design/metrics.md, vllm/v1/metrics/loggers.py; 0.8 -> 0.10+):
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, KV usage as
  ``vllm:kv_cache_usage_perc`` (new) or ``vllm:gpu_cache_usage_perc`` (old; both are 0..1
  despite the name), ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``, ``vllm:request_success_total{finished_reason}``,
  histograms ``vllm:time_to_first_token_seconds``, ``vllm:e2e_request_latency_seconds``,
  ``vllm:inter_token_latency_seconds`` (old: ``vllm:time_per_output_token_seconds``),
  prefix cache ``vllm:prefix_cache_queries_total``/``vllm:prefix_cache_hits_total`` (old:
  ``vllm:gpu_prefix_cache_queries_total``/``..._hits_total``). V1 labels every series with
  ``engine`` (data-parallel rank) and ``model_name``.
- TGI (https://huggingface.co/docs/text-generation-inference/reference/metrics):
  ``tgi_batch_current_size`` (running), ``tgi_queue_size`` (waiting), ``tgi_request_success``
  (finished), ``tgi_request_duration`` (e2e histogram), ``tgi_request_input_length``/
  ``tgi_request_generated_tokens`` (histograms; their ``_sum`` gives token totals). TGI has no
  KV-usage, TTFT or preemption series: those stay missing.
- llama.cpp server (tools/server/README.md, "GET /metrics"): ``llamacpp:requests_processing``
  (running), ``llamacpp:requests_deferred`` (waiting), ``llamacpp:kv_cache_usage_ratio`` (older
  builds only), ``llamacpp:prompt_tokens_total``, ``llamacpp:tokens_predicted_total``.

Aggregation over ``engine`` label values (vLLM data parallel): counts and counters are summed,
histograms summed bucket-wise, KV usage averaged over the *valid* per-engine samples. A sample
outside its domain (a ratio outside 0..1, a negative count, NaN) is invalid: listed in
``EngineSnapshot.invalid``, counted in ``PromTextEngineClient.invalid_samples_total``, never used.
A metric absent from the scrape leaves its field ``None`` and its name in ``missing``.
"""

from __future__ import annotations

import logging
import math
import sys
from collections import defaultdict
from typing import Any

import httpx

from inferctl.controller.engines.base import EngineClient, describe_error, failed_snapshot
# PromSample and parse_prometheus_text are re-exported (bundled.py and tests import them here).
from inferctl.controller.scrape.promtext import PromSample, family_filter, parse_prometheus_text
from inferctl.controller.scrape.aio import SCRAPE_ERRORS, AsyncPoller
from inferctl.controller.types import EngineSnapshot, engine_snapshot

log = logging.getLogger(__name__)

#: The largest finite float (``0 <= v <= _FLOAT_MAX`` is False for NaN, -v and +inf alike).
_FLOAT_MAX = sys.float_info.max

FLAVORS = ("vllm", "tgi", "llamacpp")

#: Fields a policy may want from any engine; those left ``None`` are listed in ``missing``.
CORE_FIELDS = ("running", "waiting", "kv_usage_ratio", "ttft_histogram", "e2e_histogram",
               "finished_total", "preemptions_total")


class _Index:
    """Samples by name, for lookups by any of several names (old/new)."""

    def __init__(self, samples: list[PromSample]) -> None:
        self.by_name: dict[str, list[PromSample]] = defaultdict(list)
        for s in samples:
            self.by_name[s.name].append(s)

    def first_present(self, *names: str) -> tuple[str | None, list[PromSample]]:
        for n in names:
            if self.by_name.get(n):
                return n, self.by_name[n]
        return None, []


def _engine_of(s: PromSample) -> str:
    return s.labels.get("engine", "0")


def _describe(s: PromSample) -> str:
    lab = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
    return f"{s.name}{{{lab}}} {s.value!r}"


class _Builder:
    """Accumulates one scrape's fields, invalid samples and per-engine values."""

    def __init__(self, idx: _Index) -> None:
        self.idx = idx
        self.fields: dict[str, Any] = {}
        self.invalid: list[str] = []
        self.per_engine: dict[str, dict[str, Any]] = defaultdict(dict)

    def _valid(self, s: PromSample, kind: str) -> bool:
        v = s.value
        # finite and >= 0 (and <= 1 for a ratio) in one chained comparison: False for NaN and ±inf
        if 0.0 <= v <= _FLOAT_MAX and (kind != "ratio" or v <= 1.0):
            return True
        self.invalid.append(_describe(s))
        return False

    def count(self, field: str, *names: str, kind: str = "count") -> None:
        """Sum over engines (and other labels) of a gauge/counter; invalid samples skipped."""
        _, samples = self.idx.first_present(*names)
        if not samples:
            return
        total, any_valid = 0.0, False
        per_engine = self.per_engine
        for s in samples:
            per = per_engine[s.labels.get("engine", "0")]       # _engine_of, inline
            v = s.value
            # _valid's plain case inline (a finite number >= 0; <= 1 for a ratio), else _valid
            if (0.0 <= v <= _FLOAT_MAX and (kind != "ratio" or v <= 1.0)) or self._valid(s, kind):
                total += s.value
                any_valid = True
                per[field] = per.get(field, 0.0) + s.value
            else:
                per.setdefault(field, None)
        if any_valid:
            self.fields[field] = total

    def ratio_mean(self, field: str, *names: str) -> None:
        """Mean over engines of a 0..1 gauge, valid samples only (docs/field-cases.md F01)."""
        _, samples = self.idx.first_present(*names)
        if not samples:
            return
        valid = []
        for s in samples:
            per = self.per_engine[_engine_of(s)]
            if self._valid(s, "ratio"):
                valid.append(s.value)
                per[field] = s.value
            else:
                per[field] = None
        if valid:
            self.fields[field] = sum(valid) / len(valid)

    def by_label(self, field: str, label: str, *names: str) -> None:
        """Counter split by ``label`` (e.g. finished_reason) -> {value: sum}."""
        _, samples = self.idx.first_present(*names)
        if not samples:
            return
        out: dict[str, float] = defaultdict(float)
        for s in samples:
            if self._valid(s, "count"):
                out[s.labels.get(label, "")] += s.value
        if out:
            self.fields[field] = dict(out)

    def histogram(self, field: str, *bases: str) -> None:
        """Cumulative histogram summed over engines -> {"buckets": [(le, count)], "sum", "count"}.
        ``sum``/``count`` are None when the scrape lacks them. Buckets that decrease with ``le``
        make the whole histogram invalid."""
        base = next((b for b in bases if self.idx.by_name.get(b + "_bucket")
                     or self.idx.by_name.get(b + "_count")), None)
        if base is None:
            return
        buckets: dict[float, float] = defaultdict(float)
        for s in self.idx.by_name.get(base + "_bucket", []):
            try:
                le = float(s.labels.get("le", "nan"))
            except ValueError:
                le = math.nan
            v = s.value
            if le == le and 0.0 <= v <= _FLOAT_MAX:    # the plain case (le not NaN, value valid) inline
                buckets[le] += v
                continue
            if math.isnan(le) or not self._valid(s, "count"):
                if math.isnan(le):
                    self.invalid.append(_describe(s))
                continue
            buckets[le] += s.value
        ordered = sorted(buckets.items())
        if any(b[1] < a[1] for a, b in zip(ordered, ordered[1:])):
            self.invalid.append(f"{base}_bucket: cumulative counts decrease with le")
            return
        hsum = self._sum_of(base + "_sum")
        hcount = self._sum_of(base + "_count")
        self.fields[field] = {"buckets": ordered, "sum": hsum, "count": hcount, "metric": base}

    def _sum_of(self, name: str) -> float | None:
        samples = self.idx.by_name.get(name, [])
        vals = [s.value for s in samples if self._valid(s, "count")]
        return sum(vals) if vals else None

    def first_label(self, label: str) -> str | None:
        for samples in self.idx.by_name.values():
            for s in samples:
                if label in s.labels:
                    return s.labels[label]
        return None


def histogram_from_samples(samples: list[PromSample], base: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The cumulative histogram ``base`` (``_bucket``/``_sum``/``_count``) summed over all label
    sets in ``samples`` -> ``({"buckets", "sum", "count", "metric"} or None, invalid samples)``."""
    b = _Builder(_Index(samples))
    b.histogram("h", base)
    return b.fields.get("h"), b.invalid


def _hist_sum(b: _Builder, field: str, base: str) -> None:
    vals = [s.value for s in b.idx.by_name.get(base + "_sum", []) if b._valid(s, "count")]
    if vals:
        b.fields[field] = sum(vals)


def map_vllm(idx: _Index) -> _Builder:
    """vLLM's series (0.8 -> 0.10+, old and new names; see the module note) -> snapshot fields."""
    b = _Builder(idx)
    b.count("running", "vllm:num_requests_running")
    b.count("waiting", "vllm:num_requests_waiting")
    b.ratio_mean("kv_usage_ratio", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    b.count("preemptions_total", "vllm:num_preemptions_total", "vllm:num_preemptions")
    b.count("prompt_tokens_total", "vllm:prompt_tokens_total")
    b.count("generation_tokens_total", "vllm:generation_tokens_total")
    b.count("prefix_cache_queries_total", "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_queries_total")
    b.count("prefix_cache_hits_total", "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
    b.count("finished_total", "vllm:request_success_total")
    b.by_label("by_finish_reason", "finished_reason", "vllm:request_success_total")
    b.histogram("ttft_histogram", "vllm:time_to_first_token_seconds")
    b.histogram("e2e_histogram", "vllm:e2e_request_latency_seconds")
    b.histogram("itl_histogram", "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
    b.fields["model"] = b.first_label("model_name")
    return b


def map_tgi(idx: _Index) -> _Builder:
    """TGI's series -> snapshot fields (no KV usage, TTFT or preemptions: they stay missing)."""
    b = _Builder(idx)
    b.count("running", "tgi_batch_current_size")
    b.count("waiting", "tgi_queue_size")
    b.count("finished_total", "tgi_request_success_total", "tgi_request_success")
    b.histogram("e2e_histogram", "tgi_request_duration")
    _hist_sum(b, "prompt_tokens_total", "tgi_request_input_length")
    _hist_sum(b, "generation_tokens_total", "tgi_request_generated_tokens")
    return b


def map_llamacpp(idx: _Index) -> _Builder:
    """llama.cpp server's series -> snapshot fields."""
    b = _Builder(idx)
    b.count("running", "llamacpp:requests_processing")
    b.count("waiting", "llamacpp:requests_deferred")
    b.ratio_mean("kv_usage_ratio", "llamacpp:kv_cache_usage_ratio")
    b.count("prompt_tokens_total", "llamacpp:prompt_tokens_total")
    b.count("generation_tokens_total", "llamacpp:tokens_predicted_total")
    return b


_MAPPERS = {"vllm": map_vllm, "tgi": map_tgi, "llamacpp": map_llamacpp}


class _NameRecorder(dict):
    """An empty ``_Index.by_name`` that records every name a mapper looks up."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return default

    def __getitem__(self, key: str) -> list:
        self.asked.add(key)
        return []


def names_read(mapper: Any) -> frozenset[str]:
    """The sample names ``mapper`` (``map_vllm``...) reads, found by running it on an empty
    scrape that records its look-ups (so the list cannot drift from the mapper), as a
    :func:`~inferctl.controller.scrape.promtext.family_filter`."""
    idx = _Index([])
    idx.by_name = _NameRecorder()
    mapper(idx)
    return family_filter(idx.by_name.asked)


#: Per flavor, the sample names its mapper reads: the rest of a scrape is skipped unparsed.
_KEEP = {flavor: names_read(mapper) for flavor, mapper in _MAPPERS.items()}


def snapshot_from_metrics_text(text: str, *, name: str, flavor: str, now: float = 0.0) -> EngineSnapshot:
    """Map one ``/metrics`` text to an :class:`EngineSnapshot` (``kind`` = flavor).

    Raises ``ValueError`` naming ``flavor`` when it is not one of vllm, tgi, llamacpp.
    Only the series the flavor's mapper reads are parsed (:data:`_KEEP`); unparseable lines are
    listed in ``invalid`` (prefixed ``unparsed:``); the rest still count.
    """
    if flavor not in _MAPPERS:
        raise ValueError(f"flavor {flavor!r} is not one of {', '.join(FLAVORS)}")
    samples, bad = parse_prometheus_text(text, keep=_KEEP[flavor])
    b = _MAPPERS[flavor](_Index(samples))
    snap = engine_snapshot(name, flavor, True, now)
    d = snap.__dict__     # the mapper's fields are snapshot fields: one update, not a setattr each
    d.update(b.fields)
    for k in ("running", "waiting"):
        v = d[k]
        if v is not None:
            d[k] = int(round(v))
    if flavor == "vllm":  # the builder's own per-engine dicts (nothing else holds them): no copies
        d["per_engine"] = dict(sorted(b.per_engine.items()))
    d["invalid"] = b.invalid + [f"unparsed: {line}" for line in bad] if bad else b.invalid
    d["missing"] = [f for f in CORE_FIELDS if d[f] is None]
    return snap


class PromTextEngineClient(EngineClient):
    """Polls an engine's Prometheus ``/metrics`` (vLLM, TGI, llama.cpp).

    ``base_url``: e.g. ``http://10.0.0.5:8000``; ``metrics_path`` defaults to ``/metrics``.
    ``timeout_s`` bounds the whole request (keep it below the poll interval). ``transport``
    lets tests inject an ``httpx`` transport. Admin calls are not available on these engines
    (:class:`~controller.engines.base.EngineAdminError` with status 501).
    """

    def __init__(self, name: str, base_url: str, flavor: str = "vllm", *, timeout_s: float = 2.0,
                 metrics_path: str = "/metrics", headers: dict[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"flavor {flavor!r} is not one of {', '.join(FLAVORS)}")
        super().__init__(name, base_url, timeout_s=timeout_s, headers=headers, transport=transport)
        self.kind = flavor
        self.metrics_path = metrics_path
        self.invalid_samples_total = 0
        self._last_invalid: list[str] = []

    def poll(self, now: float) -> EngineSnapshot:
        try:
            resp = self._request("GET", self.metrics_path)
        except httpx.HTTPError as exc:
            return failed_snapshot(self, now, f"GET {self.metrics_path}: {describe_error(exc, self.timeout_s)}")
        return self._metrics_snapshot(resp.status_code, resp.text, now)

    async def poll_async(self, poller: AsyncPoller, now: float) -> EngineSnapshot:
        """:meth:`poll` on the shared loop and connection pool. Never raises."""
        try:
            status, body = await poller.get(self.base_url + self.metrics_path, deadline_s=self.timeout_s,
                                            headers=self._headers)
        except SCRAPE_ERRORS as exc:
            return failed_snapshot(self, now, f"GET {self.metrics_path}: {describe_error(exc, self.timeout_s)}")
        if status != 200:
            return failed_snapshot(self, now, f"GET {self.metrics_path}: HTTP {status}")
        return await poller.offload(len(body), self._metrics_snapshot, status, body.decode("utf-8", "replace"), now)

    def _metrics_snapshot(self, status: int, text: str, now: float) -> EngineSnapshot:
        """``GET /metrics``'s answer -> a snapshot (a failed one for a non-200 or a parser bug)."""
        if status != 200:
            return failed_snapshot(self, now, f"GET {self.metrics_path}: HTTP {status}")
        try:
            snap = snapshot_from_metrics_text(text, name=self.name, flavor=self.kind, now=now)
        except Exception as exc:  # a parser bug must not stop polling
            log.exception("engine %s: could not map /metrics", self.name)
            return failed_snapshot(self, now, f"/metrics not understood: {exc}")
        if snap.invalid:
            self.invalid_samples_total += len(snap.invalid)
            # once per change, not once per poll: an engine that keeps exporting the same bad
            # series would otherwise write a warning every second (the count is still kept)
            level = logging.WARNING if snap.invalid != self._last_invalid else logging.DEBUG
            log.log(level, "engine %s: %d invalid sample(s) ignored: %s", self.name, len(snap.invalid),
                    "; ".join(snap.invalid[:3]))
        self._last_invalid = list(snap.invalid)
        return snap
