"""PrometheusStatLogger: the engine's ``/metrics`` series, fed by the per-step stats.

The same :class:`~inferctl.engine.stats.IterationStats` and
:class:`~inferctl.engine.stats.SchedulerStats` that feed ``/stats``
(:class:`~inferctl.engine.stats.EngineStats`) feed the catalog of
:mod:`inferctl.engine.metrics` here (vLLM's ``PrometheusStatLogger``): one accounting of the
numbers, two views. The latency histograms (TTFT, ITL, e2e) take only requests that finished
successfully (:data:`~inferctl.engine.stats.SUCCESS_REASONS`); aborts are counted by
``inferctl_engine_requests_total{finish_reason="abort"}`` and, by why the client left, by
``inferctl_engine_request_aborts_total`` (the HTTP layer's count).
"""

from __future__ import annotations

import math

from inferctl.contract.oom import OOM_KINDS
from inferctl.contract.precision import PRECISION_MODES
from inferctl.contract.stats import FINISH_ERROR
from inferctl.engine.metrics import ABORT_REASONS, build_registry
from inferctl.engine.stats import SUCCESS_REASONS, FinishedRequestStats, IterationStats, SchedulerStats

#: Prefix of a request error that is an OOM (``inferctl_engine_request_errors_total{reason="oom"}``).
OOM_ERROR_PREFIX = "out of memory"


class PrometheusStatLogger:
    """Owns a fresh registry with every engine metric (``registry``, ``metrics`` by name).

    Args:
        model_name: the ``model`` label value (the served name).
        budget_bytes: ``inferctl_engine_memory_budget_bytes``.
    """

    def __init__(self, model_name: str, budget_bytes: int):
        self.model_name = model_name
        self.registry, self.metrics = build_registry()
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
        """Count one step's events; set the gauges from ``s`` (when given)."""
        m, name = self.metrics, self.model_name
        if it.num_preempted:
            m["inferctl_engine_preemptions_total"].inc(it.num_preempted)
        for v in it.ttfts:
            self._ttft.observe(v)
        for v in it.itls:
            self._itl.observe(v)
        if it.prefix_cache_queries:
            m["inferctl_engine_prefix_cache_queries_total"].inc(it.prefix_cache_queries)
            m["inferctl_engine_prefix_cache_hits_total"].inc(it.prefix_cache_hits)
        if it.num_prompt_tokens:
            m["inferctl_engine_prompt_tokens_total"].labels(name).inc(it.num_prompt_tokens)
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
        if it.ran_forward:
            m["inferctl_engine_steps_total"].inc()
            m["inferctl_engine_step_sequences_total"].inc(it.batch_size)
            m["inferctl_engine_step_real_tokens_total"].inc(it.real_tokens)
            if it.num_generation_tokens:
                m["inferctl_engine_generation_tokens_total"].labels(name).inc(it.num_generation_tokens)
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
