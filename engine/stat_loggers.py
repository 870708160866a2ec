"""PrometheusStatLogger: the engine's ``/metrics`` series, fed by the per-step stats.

The same :class:`~inferctl.engine.stats.IterationStats` and
:class:`~inferctl.engine.stats.SchedulerStats` that feed ``/stats``
(:class:`~inferctl.engine.stats.EngineStats`) feed the catalog of
:mod:`inferctl.engine.metrics` here (vLLM's ``PrometheusStatLogger``): one accounting of the
numbers, two views. The latency histograms (TTFT, ITL, e2e) take only requests that finished
successfully (:data:`~inferctl.engine.stats.SUCCESS_REASONS`); aborts are counted by
``inferctl_engine_requests_total{finish_reason="abort"}`` and, by why the client left, by
``inferctl_engine_request_aborts_total`` (the HTTP layer's count).

Cost (issue 12: at batch 1 a step is a fraction of a millisecond). The numbers that change every
step are plain ``int`` fields the step adds to; the gauges are not touched by the step at all.
Both become Prometheus values when the registry is collected (a scrape, ``get_sample_value``):
the logger's ``registry`` holds one collector (:class:`ScrapeCollector`, prometheus-client's
documented custom-collector protocol, https://prometheus.github.io/client_python/collector/custom/)
that first brings those series up to date — each counter ``inc``'d by what the step added since
the last scrape, each gauge ``set`` from the live :class:`SchedulerStats` — then yields the
catalog's metric objects. So a scrape shows the same values the per-step updates showed, and a
step costs a few integer additions (``LLMEngine._record`` of a decode step, this project's 2-core
host, loaded: 87-112 µs when it set the gauges and counters per step, 7-10 µs now).
Events that happen per request, not per step (finished requests, OOMs, errors, switches,
preemptions, speculative decoding) still update their metric when they happen.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from inferctl.contract.oom import OOM_KINDS
from inferctl.contract.precision import PRECISION_MODES
from inferctl.contract.stats import FINISH_ERROR
from inferctl.engine.metrics import ABORT_REASONS, build_registry
from inferctl.engine.stats import SUCCESS_REASONS, FinishedRequestStats, IterationStats, SchedulerStats

#: Prefix of a request error that is an OOM (``inferctl_engine_request_errors_total{reason="oom"}``).
OOM_ERROR_PREFIX = "out of memory"


#: The per-step counters kept as plain ints between scrapes: field -> (catalog name, labelled by model).
_STEP_COUNTERS: dict[str, tuple[str, bool]] = {
    "steps": ("inferctl_engine_steps_total", False),
    "step_sequences": ("inferctl_engine_step_sequences_total", False),
    "step_real_tokens": ("inferctl_engine_step_real_tokens_total", False),
    "generation_tokens": ("inferctl_engine_generation_tokens_total", True),
    "prompt_tokens": ("inferctl_engine_prompt_tokens_total", True),
    "prefix_cache_queries": ("inferctl_engine_prefix_cache_queries_total", False),
    "prefix_cache_hits": ("inferctl_engine_prefix_cache_hits_total", False),
}


class ScrapeCollector:
    """The one collector of :attr:`PrometheusStatLogger.registry`: :meth:`collect` syncs the
    logger's scrape-time series (:meth:`PrometheusStatLogger.sync`), then yields the catalog's
    metric families from the logger's private registry (same names, help, types and order)."""

    def __init__(self, logger: "PrometheusStatLogger", inner: CollectorRegistry) -> None:
        self._logger = logger
        self._inner = inner

    def collect(self) -> Iterator[Metric]:
        """The engine's metric families, up to date (prometheus-client's collector protocol)."""
        self._logger.sync()
        return self._inner.collect()


class PrometheusStatLogger:
    """Owns a fresh registry with every engine metric (``registry``, ``metrics`` by name).

    Args:
        model_name: the ``model`` label value (the served name).
        budget_bytes: ``inferctl_engine_memory_budget_bytes``.
        live: called at each scrape (any thread, never blocking on a step) for the live
            :class:`SchedulerStats` the gauges are set from; None = the last snapshot handed to
            :meth:`record` (gauges unset until one comes).

    ``metrics`` are the catalog's prometheus-client objects; code outside the engine may update
    them directly (the HTTP layer's error and abort counters). Read values through ``registry``
    (``generate_latest``, ``get_sample_value``): the per-step series are only brought up to date
    when it is collected.
    """

    def __init__(self, model_name: str, budget_bytes: int,
                 live: Callable[[], SchedulerStats | None] | None = None):
        self.model_name = model_name
        inner, self.metrics = build_registry()
        self.registry = CollectorRegistry()
        self.registry.register(ScrapeCollector(self, inner))
        self._live = live
        self._snapshot: SchedulerStats | None = None
        self._sync_lock = threading.Lock()
        # per-step counts (stepping thread) and what of them the metrics already hold (scrape)
        self.counts = dict.fromkeys(_STEP_COUNTERS, 0)
        self._exported = dict.fromkeys(_STEP_COUNTERS, 0)
        m = self.metrics
        self._ttft = m["inferctl_engine_time_to_first_token_seconds"].labels(model_name)
        self._itl = m["inferctl_engine_inter_token_latency_seconds"].labels(model_name)
        m["inferctl_engine_memory_budget_bytes"].set(budget_bytes)
        for phase in ("queue", "prefill", "decode"):   # exported empty from the start
            m[f"inferctl_engine_request_{phase}_time_seconds"].labels(model_name)
        for kind in OOM_KINDS:
            m["inferctl_engine_oom_total"].labels(kind)
        for reason in ABORT_REASONS:    # exported at 0 from the start: rate() has data before the first abort
            m["inferctl_engine_request_aborts_total"].labels(model_name, reason)

    def record(self, s: SchedulerStats | None, it: IterationStats) -> None:
        """Count one step's events; ``s`` (when given) is the snapshot the gauges show at the
        next scrape when the logger has no ``live`` source."""
        if s is not None:
            self._snapshot = s
        c = self.counts
        if it.ran_forward:
            c["steps"] += 1
            c["step_sequences"] += it.batch_size
            c["step_real_tokens"] += it.real_tokens
            if it.num_generation_tokens:
                c["generation_tokens"] += it.num_generation_tokens
        if it.num_prompt_tokens:
            c["prompt_tokens"] += it.num_prompt_tokens
        if it.prefix_cache_queries:
            c["prefix_cache_queries"] += it.prefix_cache_queries
            c["prefix_cache_hits"] += it.prefix_cache_hits
        if it.num_preempted:
            self.metrics["inferctl_engine_preemptions_total"].inc(it.num_preempted)
        if it.ttfts or it.itls or it.finished or it.ooms or it.admission_errors or it.spec_num_drafts \
                or it.precision_switched_to is not None:
            self._events(it)

    def _events(self, it: IterationStats) -> None:
        """The per-request events of a step (latency samples, finished requests, faults)."""
        m, name = self.metrics, self.model_name
        for v in it.ttfts:
            self._ttft.observe(v)
        for v in it.itls:
            self._itl.observe(v)
        if it.spec_num_drafts:
            m["inferctl_engine_spec_decode_num_drafts_total"].inc(it.spec_num_drafts)
            m["inferctl_engine_spec_decode_num_draft_tokens_total"].inc(it.spec_num_draft_tokens)
            m["inferctl_engine_spec_decode_num_accepted_tokens_total"].inc(it.spec_num_accepted_tokens)
            for pos in it.spec_accepted_positions:
                m["inferctl_engine_spec_decode_num_accepted_tokens_per_pos_total"].labels(str(pos)).inc()
        for fin in it.finished:
            self._finished(fin)
        for fault in it.ooms:
            m["inferctl_engine_oom_total"].labels(fault.kind).inc()
        for reason in it.admission_errors:
            m["inferctl_engine_request_errors_total"].labels(name, reason).inc()
        if it.precision_switched_to is not None:
            m["inferctl_engine_precision_switches_total"].labels(it.precision_switched_to).inc()

    def sync(self) -> None:
        """Bring the scrape-time series up to date: each per-step counter gains what the steps
        added since the last sync (a labelled series appears with its first count, as when it
        was incremented per step), the gauges are set from the live state. Thread-safe (called
        by every collect)."""
        with self._sync_lock:
            m, counts, done = self.metrics, self.counts, self._exported
            for key, (metric, labelled) in _STEP_COUNTERS.items():
                delta = counts[key] - done[key]
                if delta:
                    (m[metric].labels(self.model_name) if labelled else m[metric]).inc(delta)
                    done[key] += delta
            s = self._live() if self._live is not None else self._snapshot
            if s is not None:
                self.set_gauges(s)

    def _finished(self, fin: FinishedRequestStats) -> None:
        m, name = self.metrics, self.model_name
        m["inferctl_engine_requests_total"].labels(name, fin.finish_reason).inc()
        if fin.finish_reason in SUCCESS_REASONS:   # aborted/failed requests are not latency samples
            m["inferctl_engine_e2e_request_latency_seconds"].labels(name).observe(fin.e2e)
            for metric, v in (("queue", fin.queue_time), ("prefill", fin.prefill_time), ("decode", fin.decode_time)):
                if v is not None:
                    m[f"inferctl_engine_request_{metric}_time_seconds"].labels(name).observe(v)
        q = fin.quality
        if fin.completion_tokens:   # an output with no token has no quality to score
            bucket = q.prompt_len_bucket
            m["inferctl_engine_outputs_total"].labels(name, bucket).inc()
            if q.degenerate:
                m["inferctl_engine_degenerate_outputs_total"].labels(name, bucket).inc()
            for n, v in q.seq_rep.items():
                if v is not None:
                    m["inferctl_engine_output_repetition_ratio"].labels(name, n).observe(v)
            if q.perplexity is not None:
                m["inferctl_engine_output_perplexity"].labels(name).observe(q.perplexity)
            if q.nonfinite_logprobs:
                m["inferctl_engine_nonfinite_logprobs_total"].inc(q.nonfinite_logprobs)
        if fin.finish_reason == FINISH_ERROR:
            reason = "oom" if (fin.error or "").startswith(OOM_ERROR_PREFIX) else "internal"
            m["inferctl_engine_request_errors_total"].labels(name, reason).inc()

    def set_gauges(self, s: SchedulerStats) -> None:
        """Queues, KV pool, memory, precision and drain gauges from a snapshot."""
        m = self.metrics
        m["inferctl_engine_num_requests_running"].set(s.running)
        m["inferctl_engine_num_requests_waiting"].set(s.waiting)
        m["inferctl_engine_kv_cache_blocks"].labels("used").set(s.kv_blocks_used)
        m["inferctl_engine_kv_cache_blocks"].labels("free").set(s.kv_blocks_free)
        m["inferctl_engine_kv_cache_usage_ratio"].set(s.kv_usage_ratio)
        w = s.kv_waste_ratio
        m["inferctl_engine_kv_cache_waste_ratio"].set(math.nan if w is None else w)   # NaN: no data
        m["inferctl_engine_memory_allocated_bytes"].set(s.allocated_bytes)
        m["inferctl_engine_memory_reserved_bytes"].set(s.reserved_bytes)
        m["inferctl_engine_memory_weights_bytes"].set(s.weights_bytes)
        for mode in PRECISION_MODES:
            m["inferctl_engine_precision_mode"].labels(mode).set(1 if s.precision == mode else 0)
        m["inferctl_engine_draining"].set(1 if s.draining else 0)
