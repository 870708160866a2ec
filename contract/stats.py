"""The engine's ``/stats`` document (engine → controller, JSON): its schema and its words.

The engine builds the document (``LLMEngine.stats()``), the controller's bundled-engine
client reads it (``snapshot_from_stats``); both spell its keys from here. The sections are
:class:`typing.TypedDict` s, so the document stays a plain JSON-ready dict. Every number is
``None`` (JSON ``null``) when there is no data, never 0. The full layout with an example is in
docs/architecture.md ("/stats").
"""

from __future__ import annotations

from typing import Literal, TypedDict

# ---------------------------------------------------------------------------- words
#: Finish reasons of a request (``RequestOutput.finish_reason``, ``requests.by_finish_reason``,
#: the ``finish_reason`` label of ``inferctl_engine_requests_total``).
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_REPETITION = "repetition"
FINISH_ABORT = "abort"
FINISH_ERROR = "error"
FINISH_REASONS: tuple[str, ...] = (FINISH_STOP, FINISH_LENGTH, FINISH_REPETITION, FINISH_ABORT,
                                   FINISH_ERROR)
FinishReason = Literal["stop", "length", "repetition", "abort", "error"]

#: Fault kinds an operator (or a drill) may inject into an engine (``POST /admin/fault``,
#: ``LLMEngine.inject_fault``): ``oom`` makes the next steps' activation reservations raise a
#: real ``torch.OutOfMemoryError``.
FAULT_OOM = "oom"
FAULT_KINDS: tuple[str, ...] = (FAULT_OOM,)

#: Where an OOM came from (``faults.recent[].source``).
SOURCE_BUDGET = "budget"
SOURCE_CUDA = "cuda"
SOURCE_INJECTED = "injected"
FAULT_SOURCES: tuple[str, ...] = (SOURCE_BUDGET, SOURCE_CUDA, SOURCE_INJECTED)

#: What the engine did about an OOM (``faults.recent[].action``), by OOM kind: exhaustion →
#: backoff, fragmentation → empty_cache, impossible → reject.
ACTION_BACKOFF = "backoff"
ACTION_EMPTY_CACHE = "empty_cache"
ACTION_REJECT = "reject"
#: A speculative draft forward ran out of memory: the step ran without drafts (nothing re-queued).
ACTION_SKIP_DRAFTS = "skip_drafts"
FAULT_ACTIONS: tuple[str, ...] = (ACTION_BACKOFF, ACTION_EMPTY_CACHE, ACTION_REJECT, ACTION_SKIP_DRAFTS)

#: ``memory.source``: the simulated caching allocator (CPU) or CUDA's own numbers.
MEMORY_SIMULATED = "simulated"
MEMORY_CUDA = "cuda"

#: Top-level sections, in document order.
SECTIONS: tuple[str, ...] = ("engine", "memory", "kv_cache", "scheduler", "requests", "quality",
                             "faults")

#: ``faults.recent[]`` fields that are byte counts, counts or ratios (finite, >= 0, or None)
#: and those that are words.
FAULT_NUMBER_FIELDS: tuple[str, ...] = ("requested_bytes", "free_bytes", "allocated_bytes",
                                        "reserved_unallocated_bytes", "total_bytes",
                                        "requeued_requests", "fragmentation_ratio",
                                        "failed_requests")
FAULT_STRING_FIELDS: tuple[str, ...] = ("kind", "message", "precision", "source", "action")


# ---------------------------------------------------------------------------- sections
class EngineSection(TypedDict, total=False):
    """``engine``: identity and mode. ``precision``/``requested_precision`` are
    ``inferctl.contract.precision`` modes; ``precision_error`` the last refused switch;
    ``step_thread_alive`` only from the async engine."""

    model: str
    models: list[str]
    device: str
    precision: str
    requested_precision: str
    precision_error: str | None
    kv_cache_dtype: str
    draining: bool
    uptime_seconds: float
    version: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    unfinished_requests: int
    step_thread_alive: bool


class MemorySection(TypedDict):
    """``memory``: bytes against the budget; ``fragmentation_ratio`` = reserved-unallocated /
    reserved (None when nothing is reserved); ``source`` "simulated" or "cuda"."""

    budget_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    free_bytes: int
    reserved_unallocated_bytes: int
    fragmentation_ratio: float | None
    weights_bytes: int
    kv_pool_bytes: int
    activation_bytes: int
    draft_weights_bytes: int      # the speculative draft model's weights (0: no draft model)
    draft_kv_pool_bytes: int      # its KV pool (as many blocks as kv_cache.num_blocks)
    full_weights_bytes: int | None
    int8_weights_bytes: int | None
    source: str


class KvCacheSection(TypedDict):
    """``kv_cache``: the paged pool; ``waste_ratio`` = 1 − tokens stored / (blocks used ×
    block size), None when no block is used."""

    block_size: int
    num_blocks: int
    blocks_used: int
    blocks_free: int
    tokens_stored: int
    waste_ratio: float | None
    usage_ratio: float
    bytes_per_block: int


class LastStep(TypedDict):
    """``scheduler.last_step``: the last step's batch (tokens; seconds)."""

    batch_size: int
    real_tokens: int
    padded_tokens: int
    prefill_tokens: int
    decode_tokens: int
    duration_seconds: float


class SchedulerSection(TypedDict):
    """``scheduler``: queues (live) and step counters (cumulative)."""

    running: int
    waiting: int
    preemptions_total: int
    steps_total: int
    step_sequences_total: int
    real_tokens_total: int
    padded_tokens_total: int
    last_step: LastStep
    step_errors_total: int
    last_step_error: str | None


class LatencyQuantiles(TypedDict):
    """Seconds over the last ``latency_window`` samples; quantiles None with no sample."""

    p50: float | None
    p90: float | None
    p99: float | None
    count: int


class RecentRequest(TypedDict):
    """``requests.recent[]``: one finished request. ``seq_rep`` {"1".."4"}, ``distinct``
    {"1","2"} (inferctl.contract.quality); ``precision`` "mixed" after a switch mid-request;
    the quality fields are None for an output with no token. ``request_id`` is the engine's
    id (``cmpl-…``), ``x_request_id`` the HTTP request's ``X-Request-Id`` (None: not over HTTP)."""

    request_id: str
    x_request_id: str | None
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    ttft_seconds: float | None
    e2e_seconds: float | None
    precision: str | None
    preemptions: int
    error: str | None
    seq_rep: dict[str, float | None] | None
    distinct: dict[str, float | None] | None
    perplexity: float | None
    degenerate: bool | None
    nonfinite_logprobs: int | None
    prompt_len_bucket: str | None


#: ``requests.latency_histograms``'s histograms (seconds), by key.
LATENCY_HISTOGRAM_KEYS: tuple[str, ...] = ("ttft_seconds", "itl_seconds", "e2e_seconds")


class LatencyHistogramCounts(TypedDict):
    """One cumulative histogram: ``buckets[i]`` = samples <= ``le[i]`` (seconds), ``count`` =
    all samples (the ``+Inf`` bucket), ``sum`` in seconds."""

    buckets: list[int]
    sum: float
    count: int


class LatencyHistograms(TypedDict):
    """``requests.latency_histograms``: the ``/metrics`` latency histograms (TTFT, ITL, e2e;
    cumulative since start, successful requests only) as arrays over shared bounds ``le``."""

    le: list[float]
    ttft_seconds: LatencyHistogramCounts
    itl_seconds: LatencyHistogramCounts
    e2e_seconds: LatencyHistogramCounts


class RequestsSection(TypedDict):
    """``requests``: finished-request counters, latency windows and the recent ones."""

    finished_total: int
    by_finish_reason: dict[str, int]
    errors_total: int
    aborted_total: int
    admission_errors_total: int
    prompt_tokens_total: int
    completion_tokens_total: int
    ttft_seconds: LatencyQuantiles
    itl_seconds: LatencyQuantiles
    e2e_seconds: LatencyQuantiles
    latency_histograms: LatencyHistograms
    recent: list[RecentRequest]


class QualitySection(TypedDict):
    """``quality``: output-quality counters."""

    nonfinite_logprobs_total: int
    degenerate_total: int


class FaultRecord(TypedDict):
    """``faults.recent[]``: one OOM survived (bytes; ``kind`` an
    ``inferctl.contract.oom`` OOM kind; ``source`` and ``action`` the words above)."""

    id: int
    time: float
    kind: str
    requested_bytes: int | None
    free_bytes: int | None
    allocated_bytes: int | None
    reserved_unallocated_bytes: int | None
    total_bytes: int | None
    fragmentation_ratio: float | None
    message: str
    requeued_requests: int
    failed_requests: int
    precision: str
    source: str
    action: str
    request_id: str | None      # the engine id of the request the OOM was blamed on
    x_request_id: str | None    # that request's X-Request-Id (None: not over HTTP)


class FaultsSection(TypedDict):
    """``faults``: OOMs survived (by kind), hardware errors, pending injected faults."""

    oom_total: int
    oom_by_kind: dict[str, int]
    last_oom: FaultRecord | None
    recent: list[FaultRecord]
    hardware_errors_total: int
    last_hardware_error: str | None
    pending_injected: int


class PrefixCacheSection(TypedDict):
    """``prefix_cache``: prompt tokens looked up in the prefix cache and, of them, found cached
    (vLLM's prefix_cache_queries / prefix_cache_hits); ``hit_ratio`` = hits / queries, None before
    any lookup or with prefix caching off."""

    queries_total: int
    hits_total: int
    hit_ratio: float | None


class StatsDocument(TypedDict):
    """The whole ``/stats`` document of one engine (the server may add ``routes``)."""

    engine: EngineSection
    memory: MemorySection
    kv_cache: KvCacheSection
    scheduler: SchedulerSection
    requests: RequestsSection
    quality: QualitySection
    faults: FaultsSection
    prefix_cache: PrefixCacheSection
