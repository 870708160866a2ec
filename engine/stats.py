"""One accounting of the engine's numbers (vLLM's ``IterationStats`` / ``SchedulerStats``).

Every step (and every abort or refused request outside a step) produces one
:class:`IterationStats`: what happened (batch, tokens, latencies, finished requests, OOMs,
errors, a precision switch). The engine hands it, together with a :class:`SchedulerStats`
snapshot of the live state (queues, KV pool, memory, mode), to its two stat loggers:

* :class:`EngineStats`, the accumulator behind ``/stats`` (counters, latency windows, recent
  requests and faults); :func:`build_stats_document` renders the document
  (:class:`inferctl.contract.stats.StatsDocument`, docs/architecture.md);
* :class:`inferctl.engine.stat_loggers.PrometheusStatLogger`, the ``/metrics`` catalog.

Latency quantiles are computed over the last ``latency_window`` samples with linear
interpolation (numpy's default ``percentile`` method); with no sample they are ``None`` (no
data, never 0).

Latencies (TTFT, ITL, e2e) are those of requests that finished successfully
(:data:`SUCCESS_REASONS`): a request its client abandoned (finish reason ``abort``: the client
disconnected or timed out) or that failed (``error``) is counted apart (``aborted_total``,
``errors_total``) and never enters a latency window or histogram, so a wave of clients giving
up cannot make latency look better or worse than the answers actually served. The engine
adds a request's TTFT and ITLs to :class:`IterationStats` when it finishes, not when its
tokens come.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from itertools import accumulate
from dataclasses import dataclass, field

import numpy as np

from inferctl.contract.oom import OOM_EXHAUSTION, OOM_FRAGMENTATION, OOM_IMPOSSIBLE, OomInfo
from inferctl.contract.stats import (FINISH_ABORT, FINISH_ERROR, FINISH_LENGTH, FINISH_REASONS, FINISH_REPETITION,
                                     FINISH_STOP, LATENCY_HISTOGRAM_KEYS)
from inferctl.engine.metrics import LATENCY_BUCKETS
from inferctl.engine.quality import OutputQuality


#: Finish reasons of a request that was answered: only these feed the latency windows/histograms.
SUCCESS_REASONS: frozenset[str] = frozenset({FINISH_STOP, FINISH_LENGTH, FINISH_REPETITION})


# ---------------------------------------------------------------------------- per step
@dataclass(slots=True)
class FinishedRequestStats:
    """One request that finished (seconds; ``error_reason`` "oom"/"internal" on an error).
    ``queue_time`` = first scheduled − arrival, ``prefill_time`` = first token − first
    scheduled, ``decode_time`` = last token − first token (vLLM's definitions); None when the
    request never reached that point."""

    request_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    ttft: float | None
    e2e: float
    quality: OutputQuality
    precision: str | None
    preemptions: int
    error: str | None
    queue_time: float | None = None
    prefill_time: float | None = None
    decode_time: float | None = None
    x_request_id: str | None = None


def phase_times(seq) -> tuple[float | None, float | None, float | None]:
    """``(queue, prefill, decode)`` seconds of a finished :class:`~inferctl.engine.sequence.Sequence`
    (vLLM's request-phase histograms; None for a phase it never reached)."""
    s, f, last = seq.scheduled_time, seq.first_token_time, seq.last_token_time
    return (None if s is None else s - seq.arrival_time, None if s is None or f is None else f - s,
            None if f is None else last - f)


@dataclass(slots=True)
class OomFault:
    """One OOM the engine survived: its numbers, kind (contract OOM kind), what was done."""

    kind: str
    info: OomInfo
    message: str
    requeued: int
    failed: int
    precision: str
    source: str
    action: str
    request_id: str | None = None     # the request the OOM was blamed on (engine id)
    x_request_id: str | None = None   # its X-Request-Id


@dataclass
class IterationStats:
    """What one step did. ``ran_forward`` is True when a forward completed (only then are the
    step counters and ``last_step`` updated). Token counts are tokens, durations seconds;
    ``ttfts``/``itls`` hold the latencies of the requests that finished successfully in it."""

    ran_forward: bool = False
    batch_size: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    duration: float = 0.0
    num_preempted: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)
    finished: list[FinishedRequestStats] = field(default_factory=list)
    ooms: list[OomFault] = field(default_factory=list)
    step_errors: list[str] = field(default_factory=list)
    hardware_errors: list[str] = field(default_factory=list)
    admission_errors: list[str] = field(default_factory=list)
    precision_switched_to: str | None = None
    # speculative decoding (engine.spec_decode): drafts verified, draft tokens, accepted
    # tokens, and the 0-based position of each accepted draft token
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_positions: list[int] = field(default_factory=list)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """The live state after a step: queues (requests), KV pool (blocks, ratios; waste None
    with no used block), memory (bytes, the cheap numbers: no device query), mode."""

    running: int
    waiting: int
    preemptions_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    kv_usage_ratio: float
    kv_waste_ratio: float | None
    kv_tokens_stored: int
    allocated_bytes: int
    reserved_bytes: int
    weights_bytes: int
    precision: str
    draining: bool
    pending_injected: int


# ---------------------------------------------------------------------------- /stats
#: The keys of the document's ``scheduler.last_step``.
LAST_STEP_KEYS = ("batch_size", "real_tokens", "padded_tokens", "prefill_tokens", "decode_tokens", "duration_seconds")

class LatencyHistogram:
    """A cumulative latency histogram over :data:`~inferctl.engine.metrics.LATENCY_BUCKETS`
    (seconds), the same buckets and the same rule as prometheus-client's ``Histogram.observe``
    (a value goes in the first bucket whose upper bound ``le`` is >= it; above the last, only
    ``+Inf``), so :meth:`to_dict` equals the ``inferctl_engine_*_seconds`` series of ``/metrics``.

    Kept as per-bucket counts (the last slot is ``+Inf``); the document's ``count`` is the sum of
    the buckets, so buckets and count always agree even when read while a step records (``sum``
    may then lag by the sample being added).
    """

    __slots__ = ("_counts", "_sum")

    def __init__(self) -> None:
        self._counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        """Count one sample (seconds)."""
        self._counts[bisect_left(LATENCY_BUCKETS, value)] += 1
        self._sum += value

    def to_dict(self) -> dict:
        """``{"buckets": [cumulative count per finite le], "sum": seconds, "count": samples}``
        (``count`` is the ``+Inf`` bucket; the bounds are the section's ``le``)."""
        cum = list(accumulate(list(self._counts)))
        return {"buckets": cum[:-1], "sum": self._sum, "count": cum[-1]}


def quantiles(samples: deque | list) -> dict:
    """``{"p50", "p90", "p99", "count"}`` of ``samples`` (seconds); quantiles None if empty."""
    if not samples:
        return {"p50": None, "p90": None, "p99": None, "count": 0}
    p50, p90, p99 = np.percentile(np.fromiter(samples, dtype=np.float64), [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "count": len(samples)}


class EngineStats:
    """Cumulative counters and bounded windows behind ``/stats``.

    Args:
        latency_window: samples kept per latency series.
        recent_requests: finished requests kept for ``requests.recent``.
        recent_faults: faults kept for ``faults.recent``.
    """

    def __init__(self, latency_window: int = 4096, recent_requests: int = 64, recent_faults: int = 32):
        self.started = time.monotonic()
        self.steps_total = 0
        self.step_sequences_total = 0
        self.real_tokens_total = 0
        self.padded_tokens_total = 0
        #: (batch_size, real, padded, prefill, decode tokens, duration s) of the last forward;
        #: the document's ``scheduler.last_step`` (:data:`LAST_STEP_KEYS`)
        self.last_step_values: tuple = (0, 0, 0, 0, 0, 0.0)
        self.finished_total = 0
        self.by_finish_reason = {r: 0 for r in FINISH_REASONS}
        self.errors_total = 0
        self.aborted_total = 0
        self.admission_errors_total = 0
        self.prompt_tokens_total = 0
        self.completion_tokens_total = 0
        self.nonfinite_logprobs_total = 0
        self.degenerate_total = 0
        self.step_errors_total = 0
        self.last_step_error: str | None = None
        self.hardware_errors_total = 0
        self.last_hardware_error: str | None = None
        self.ttft: deque[float] = deque(maxlen=latency_window)
        self.itl: deque[float] = deque(maxlen=latency_window)
        self.e2e: deque[float] = deque(maxlen=latency_window)
        #: cumulative since start (the ``/metrics`` histograms' values): ``requests.latency_histograms``
        self.histograms = {key: LatencyHistogram() for key in LATENCY_HISTOGRAM_KEYS}
        self.recent: deque[dict] = deque(maxlen=recent_requests)
        self.oom_total = 0
        self.oom_by_kind = {OOM_FRAGMENTATION: 0, OOM_EXHAUSTION: 0, OOM_IMPOSSIBLE: 0}
        self.faults: deque[dict] = deque(maxlen=recent_faults)
        self.last_oom: dict | None = None
        self._fault_id = 0
        self.prefix_cache_queries_total = 0   # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits_total = 0      # of them, tokens found in cached blocks

    def record(self, scheduler_stats: SchedulerStats | None, it: IterationStats) -> None:
        """Account one step's :class:`IterationStats` (the live state is read at document time).
        A field that is zero or empty is not touched (cheap per step, and a record from another
        thread, e.g. a refused request's, never writes a counter the step is adding to)."""
        if it.ran_forward:
            self.steps_total += 1
            self.step_sequences_total += it.batch_size
            self.real_tokens_total += it.real_tokens
            if it.padded_tokens:
                self.padded_tokens_total += it.padded_tokens
            self.last_step_values = (it.batch_size, it.real_tokens, it.padded_tokens, it.prefill_tokens,
                                     it.decode_tokens, it.duration)
        if it.num_prompt_tokens:
            self.prompt_tokens_total += it.num_prompt_tokens
        if it.prefix_cache_queries:
            self.prefix_cache_queries_total += it.prefix_cache_queries
            self.prefix_cache_hits_total += it.prefix_cache_hits
        if it.ttfts or it.itls or it.finished or it.ooms or it.step_errors or it.hardware_errors \
                or it.admission_errors:
            self._record_events(it)

    def _record_events(self, it: IterationStats) -> None:
        """The per-request events of a step: latency samples, finished requests, faults, errors."""
        self.ttft.extend(it.ttfts)
        self.itl.extend(it.itls)
        for name, values in (("ttft_seconds", it.ttfts), ("itl_seconds", it.itls)):
            hist = self.histograms[name]
            for v in values:
                hist.observe(v)
        for fin in it.finished:
            self._record_finished(fin)
        for fault in it.ooms:
            self._record_fault(fault)
        for msg in it.step_errors:
            self.step_errors_total += 1
            self.last_step_error = msg
        for msg in it.hardware_errors:
            self.hardware_errors_total += 1
            self.last_hardware_error = msg
        if it.admission_errors:
            self.admission_errors_total += len(it.admission_errors)

    @property
    def last_step(self) -> dict:
        """``scheduler.last_step``: the last forward's batch size, tokens and duration (seconds)."""
        return dict(zip(LAST_STEP_KEYS, self.last_step_values))

    def _record_finished(self, fin: FinishedRequestStats) -> None:
        self.finished_total += 1
        reason = fin.finish_reason
        self.by_finish_reason[reason] = self.by_finish_reason.get(reason, 0) + 1
        if reason == FINISH_ERROR:
            self.errors_total += 1
        elif reason == FINISH_ABORT:
            self.aborted_total += 1
        self.completion_tokens_total += fin.completion_tokens
        if reason in SUCCESS_REASONS:
            self.e2e.append(fin.e2e)
            self.histograms["e2e_seconds"].observe(fin.e2e)
        q = fin.quality.to_dict()
        self.recent.append({
            "request_id": fin.request_id, "x_request_id": fin.x_request_id, "prompt_tokens": fin.prompt_tokens,
            "completion_tokens": fin.completion_tokens, "finish_reason": reason,
            "ttft_seconds": fin.ttft, "e2e_seconds": fin.e2e, "precision": fin.precision,
            "preemptions": fin.preemptions, "error": fin.error,
            "seq_rep": q["seq_rep"], "distinct": q["distinct"], "perplexity": q["perplexity"],
            "degenerate": q["degenerate"], "nonfinite_logprobs": q["nonfinite_logprobs"],
            "prompt_len_bucket": q["prompt_len_bucket"]})
        self.nonfinite_logprobs_total += fin.quality.nonfinite_logprobs
        if fin.quality.degenerate:
            self.degenerate_total += 1

    def _record_fault(self, f: OomFault) -> None:
        self._fault_id += 1
        self.oom_total += 1
        self.oom_by_kind[f.kind] = self.oom_by_kind.get(f.kind, 0) + 1
        info = f.info
        entry = {"id": self._fault_id, "time": time.time(), "kind": f.kind,
                 "requested_bytes": info.requested_bytes, "free_bytes": info.free_bytes,
                 "allocated_bytes": info.allocated_bytes,
                 "reserved_unallocated_bytes": info.reserved_unallocated_bytes,
                 "total_bytes": info.total_bytes, "fragmentation_ratio": info.fragmentation_ratio,
                 "message": f.message, "requeued_requests": f.requeued, "failed_requests": f.failed,
                 "precision": f.precision, "source": f.source, "action": f.action,
                 "request_id": f.request_id, "x_request_id": f.x_request_id}
        self.faults.append(entry)
        self.last_oom = entry

    def latency_histograms(self) -> dict:
        """``requests.latency_histograms``: ``{"le": [finite upper bounds, seconds], "ttft_seconds",
        "itl_seconds", "e2e_seconds": {"buckets": [cumulative counts, one per le], "sum", "count"}}``,
        cumulative since start, of requests that finished successfully: the same numbers as the
        ``inferctl_engine_{time_to_first_token,inter_token_latency,e2e_request_latency}_seconds``
        histograms of ``/metrics`` (``count`` is their ``+Inf`` bucket), as arrays, so a controller
        reads them from ``/stats`` without fetching and parsing ``/metrics``. Safe to call from
        another thread while the engine steps."""
        return {"le": list(LATENCY_BUCKETS), **{k: h.to_dict() for k, h in self.histograms.items()}}

    def sections(self, live: SchedulerStats) -> dict:
        """The ``scheduler``, ``requests``, ``quality``, ``faults`` and ``prefix_cache`` sections, with
        the live queue and injected-fault numbers of ``live``.

        ``prefix_cache``: ``queries_total`` (prompt tokens looked up, vLLM's prefix_cache_queries),
        ``hits_total`` (of them, tokens found cached), ``hit_ratio`` = hits / queries (None with no
        query yet, or with prefix caching off: no data, never 0) — the same counts as
        ``inferctl_engine_prefix_cache_{queries,hits}_total``."""
        q, h = self.prefix_cache_queries_total, self.prefix_cache_hits_total
        return {
            "scheduler": {"running": live.running, "waiting": live.waiting,
                          "preemptions_total": live.preemptions_total,
                          "steps_total": self.steps_total,
                          "step_sequences_total": self.step_sequences_total,
                          "real_tokens_total": self.real_tokens_total,
                          "padded_tokens_total": self.padded_tokens_total,
                          "last_step": self.last_step,
                          "step_errors_total": self.step_errors_total,
                          "last_step_error": self.last_step_error},
            "requests": {"finished_total": self.finished_total,
                         "by_finish_reason": dict(self.by_finish_reason),
                         "errors_total": self.errors_total,
                         "aborted_total": self.aborted_total,
                         "admission_errors_total": self.admission_errors_total,
                         "prompt_tokens_total": self.prompt_tokens_total,
                         "completion_tokens_total": self.completion_tokens_total,
                         "ttft_seconds": quantiles(self.ttft),
                         "itl_seconds": quantiles(self.itl),
                         "e2e_seconds": quantiles(self.e2e),
                         "latency_histograms": self.latency_histograms(),
                         "recent": list(self.recent)},
            "quality": {"nonfinite_logprobs_total": self.nonfinite_logprobs_total,
                        "degenerate_total": self.degenerate_total},
            "faults": {"oom_total": self.oom_total, "oom_by_kind": dict(self.oom_by_kind),
                       "last_oom": self.last_oom, "recent": list(self.faults),
                       "hardware_errors_total": self.hardware_errors_total,
                       "last_hardware_error": self.last_hardware_error,
                       "pending_injected": live.pending_injected},
            "prefix_cache": {"queries_total": q, "hits_total": h, "hit_ratio": h / q if q > 0 else None},
        }
