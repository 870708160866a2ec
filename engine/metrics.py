"""The engine's metric catalog: the single source of truth for names, types, units and help.

Names follow the Prometheus naming conventions (https://prometheus.io/docs/practices/naming/):
base units, ``_total`` for counters, ``_seconds``, ``_bytes``, ``_ratio`` (0..1). Every engine
series starts ``inferctl_engine_``. Label values are never derived from request content: the
``model`` label only takes names from the served set (unknown names are rejected with 404
before any metric is touched).

The catalog is plain data so that ``dashboards/`` can read it without importing anything else
of the engine.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from inferctl.contract.metrics import MetricSpec
from inferctl.contract.metrics import build_registry as build_metric_registry

#: Latency buckets (seconds). The top finite bucket (600 s) lies above the default request
#: timeout (300 s), so a request that times out is still counted in a finite bucket.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
#: ``inferctl_engine_request_aborts_total`` reasons: the client closed the connection or timed
#: out (to the server the two look the same) before its answer was complete.
ABORT_CLIENT_DISCONNECT = "client_disconnect"
ABORT_REASONS = (ABORT_CLIENT_DISCONNECT,)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
PERPLEXITY_BUCKETS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0, 1000.0)

#: The per-model request latency histograms (seconds, :data:`LATENCY_BUCKETS`): name without the
#: ``inferctl_engine_`` prefix and ``_seconds`` suffix, and help. The first three are vLLM's TTFT, ITL
#: and e2e latency; the last three its request phases (request_queue_time, request_prefill_time,
#: request_decode_time). All count only requests that finished successfully.
REQUEST_LATENCY_HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("time_to_first_token", "Time to first token (TTFT): arrival to the first generated token, of requests that "
                            "finished successfully (stop, length, repetition; aborts and errors excluded)."),
    ("inter_token_latency", "Inter-token latency (ITL) between consecutive generated tokens, of requests that "
                            "finished successfully (aborts and errors excluded)."),
    ("e2e_request_latency", "End-to-end request latency: arrival to the last token, of requests that finished "
                            "successfully (aborts and errors excluded)."),
    ("request_queue_time", "Time a request waited in the waiting queue: arrival to first scheduled (vLLM's "
                           "request_queue_time), of requests that finished successfully."),
    ("request_prefill_time", "Prefill phase of a request: first scheduled to first generated token (vLLM's "
                             "request_prefill_time), of requests that finished successfully."),
    ("request_decode_time", "Decode phase of a request: first to last generated token (vLLM's request_decode_time), "
                            "of requests that finished successfully."),
)


def _request_latency(name: str, help_text: str) -> MetricSpec:
    """The catalog entry of one request latency histogram: ``inferctl_engine_<name>_seconds{model}``."""
    return {"name": f"inferctl_engine_{name}_seconds", "type": "histogram", "unit": "seconds",
            "help": help_text, "labels": ("model",), "buckets": LATENCY_BUCKETS}


ENGINE_METRICS: list[MetricSpec] = [
    # requests
    {"name": "inferctl_engine_requests_total", "type": "counter", "unit": "requests",
     "help": "Finished requests by finish reason (stop, length, repetition, abort, error).",
     "labels": ("model", "finish_reason")},
    {"name": "inferctl_engine_request_errors_total", "type": "counter", "unit": "requests",
     "help": "Requests answered with an error, by reason (invalid_request, oom, overloaded, internal).",
     "labels": ("model", "reason")},
    {"name": "inferctl_engine_request_aborts_total", "type": "counter", "unit": "requests",
     "help": ("Requests abandoned by their client before the answer was complete, by reason "
              "(client_disconnect: the client closed the connection or timed out). Kept out of the latency "
              "histograms."),
     "labels": ("model", "reason")},
    {"name": "inferctl_engine_prompt_tokens_total", "type": "counter", "unit": "tokens",
     "help": "Prompt tokens processed (prefill).", "labels": ("model",)},
    {"name": "inferctl_engine_generation_tokens_total", "type": "counter", "unit": "tokens",
     "help": "Tokens generated (decode).", "labels": ("model",)},
    *(_request_latency(name, text) for name, text in REQUEST_LATENCY_HISTOGRAMS),
    # scheduler and batching
    {"name": "inferctl_engine_core_process_up", "type": "gauge", "unit": "",
     "help": ("With --core-process: 1 when the engine core process answered the last scrape, 0 when it is "
              "dead or did not answer in time (its other series are then absent). No series without "
              "--core-process."),
     "labels": ("model",)},
    {"name": "inferctl_engine_num_requests_running", "type": "gauge", "unit": "requests",
     "help": "Requests in the running queue.", "labels": ()},
    {"name": "inferctl_engine_num_requests_waiting", "type": "gauge", "unit": "requests",
     "help": "Requests in the waiting queue.", "labels": ()},
    {"name": "inferctl_engine_steps_total", "type": "counter", "unit": "steps",
     "help": "Engine steps (model forward passes) run.", "labels": ()},
    {"name": "inferctl_engine_step_sequences_total", "type": "counter", "unit": "sequences",
     "help": "Sum over steps of the sequences in each batch; divided by steps_total it is the effective batch size.",
     "labels": ()},
    {"name": "inferctl_engine_step_real_tokens_total", "type": "counter", "unit": "tokens",
     "help": "Real (non-padding) tokens fed to the model.", "labels": ()},
    {"name": "inferctl_engine_step_padded_tokens_total", "type": "counter", "unit": "tokens",
     "help": "Padding tokens fed to the model (0 for the packed varlen batch).", "labels": ()},
    {"name": "inferctl_engine_preemptions_total", "type": "counter", "unit": "sequences",
     "help": "Sequences preempted (recompute) because KV blocks ran out.", "labels": ()},
    # KV cache
    {"name": "inferctl_engine_kv_cache_blocks", "type": "gauge", "unit": "blocks",
     "help": "KV cache blocks in the pool, by state (used, free).", "labels": ("state",)},
    {"name": "inferctl_engine_kv_cache_usage_ratio", "type": "gauge", "unit": "ratio",
     "help": "Fraction of KV cache blocks in use (0..1).", "labels": ()},
    {"name": "inferctl_engine_kv_cache_waste_ratio", "type": "gauge", "unit": "ratio",
     "help": ("Internal waste of used KV blocks: 1 - tokens stored / (blocks used * block size). "
              "NaN (no data) when no block is used."),
     "labels": ()},
    {"name": "inferctl_engine_prefix_cache_queries_total", "type": "counter", "unit": "tokens",
     "help": ("Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries; requests asking for "
              "prompt logprobs are not looked up)."), "labels": ()},
    {"name": "inferctl_engine_prefix_cache_hits_total", "type": "counter", "unit": "tokens",
     "help": ("Of the looked-up tokens, those found in cached KV blocks (their prefill is skipped); "
              "hits / queries is the prefix cache hit ratio."), "labels": ()},
    # speculative decoding (engine.spec_decode; vLLM's spec_decode_* counters). Exported only by an
    # engine started with --speculative-config; acceptance = accepted / draft tokens.
    {"name": "inferctl_engine_spec_decode_num_drafts_total", "type": "counter", "unit": "drafts",
     "help": "Speculative drafts verified (one per sequence per step that had draft tokens).", "labels": ()},
    {"name": "inferctl_engine_spec_decode_num_draft_tokens_total", "type": "counter", "unit": "tokens",
     "help": "Draft tokens proposed and verified by the target model.", "labels": ()},
    {"name": "inferctl_engine_spec_decode_num_accepted_tokens_total", "type": "counter", "unit": "tokens",
     "help": ("Draft tokens accepted by the target (each saves a target step); divided by draft tokens it is "
              "the acceptance rate."), "labels": ()},
    {"name": "inferctl_engine_spec_decode_num_accepted_tokens_per_pos_total", "type": "counter", "unit": "tokens",
     "help": "Accepted draft tokens by draft position (0 = the first draft token of a step).",
     "labels": ("position",)},
    # memory
    {"name": "inferctl_engine_memory_budget_bytes", "type": "gauge", "unit": "bytes",
     "help": "Device memory budget the engine accounts against.", "labels": ()},
    {"name": "inferctl_engine_memory_allocated_bytes", "type": "gauge", "unit": "bytes",
     "help": "Device memory allocated (live tensors).", "labels": ()},
    {"name": "inferctl_engine_memory_reserved_bytes", "type": "gauge", "unit": "bytes",
     "help": "Device memory reserved by the allocator (allocated + cached but unallocated).", "labels": ()},
    {"name": "inferctl_engine_memory_weights_bytes", "type": "gauge", "unit": "bytes",
     "help": "Device memory held by model weights in the current precision.", "labels": ()},
    {"name": "inferctl_engine_oom_total", "type": "counter", "unit": "faults",
     "help": "Out-of-memory faults survived, by kind (fragmentation, exhaustion, impossible).",
     "labels": ("kind",)},
    # precision
    {"name": "inferctl_engine_precision_mode", "type": "gauge", "unit": "",
     "help": "1 for the engine's current precision mode (full, int8), 0 otherwise.", "labels": ("mode",)},
    {"name": "inferctl_engine_precision_switches_total", "type": "counter", "unit": "switches",
     "help": "Live precision switches, by target mode.", "labels": ("to",)},
    {"name": "inferctl_engine_draining", "type": "gauge", "unit": "",
     "help": "1 while the engine admits no new requests (drain).", "labels": ()},
    # output quality
    {"name": "inferctl_engine_output_repetition_ratio", "type": "histogram", "unit": "ratio",
     "help": "seq-rep-n of each finished output: 1 - distinct n-grams / n-grams (Welleck et al. 2019).",
     "labels": ("model", "n"), "buckets": RATIO_BUCKETS},
    {"name": "inferctl_engine_degenerate_outputs_total", "type": "counter", "unit": "requests",
     "help": ("Finished outputs flagged degenerate (seq-rep-4 above the threshold, or stopped for "
              "repetition), by prompt-length bucket."),
     "labels": ("model", "prompt_len_bucket")},
    {"name": "inferctl_engine_outputs_total", "type": "counter", "unit": "requests",
     "help": "Finished outputs scored for quality, by prompt-length bucket.",
     "labels": ("model", "prompt_len_bucket")},
    {"name": "inferctl_engine_output_perplexity", "type": "histogram", "unit": "",
     "help": "Perplexity of each output's generated tokens: exp(-mean logprob) over finite logprobs.",
     "labels": ("model",), "buckets": PERPLEXITY_BUCKETS},
    {"name": "inferctl_engine_nonfinite_logprobs_total", "type": "counter", "unit": "tokens",
     "help": "Generated-token logprobs that were NaN or infinite, excluded from perplexity.", "labels": ()},
]


def build_registry(registry: CollectorRegistry | None = None) -> tuple[CollectorRegistry, dict]:
    """Create every metric of :data:`ENGINE_METRICS` in ``registry``.

    Returns ``(registry, metrics)`` where ``metrics`` maps the catalog name (with ``_total``)
    to the prometheus-client object (:func:`inferctl.contract.metrics.build_registry`).
    """
    return build_metric_registry(ENGINE_METRICS, registry)
