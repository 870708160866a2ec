"""Signals: pure functions of snapshots (no I/O, no clock, no state but what is passed in).

Every function answers with a :class:`Signal` (or a small value object) whose ``value`` is
``None`` when there is no data or the input was invalid, with the ``reason`` in words — never
0 for "missing". Rejected samples are counted in an :class:`InvalidSampleCounter` that the
caller owns and passes in explicitly (the controller exports it as
``inferctl_invalid_samples_total{signal}``). See docs/signals.md.

One module per family; this package re-exports the public names, so
``from inferctl.controller.signals import X`` works for every one of them:

* :mod:`.values` — ``Signal``, ``FleetSignal``, ``InvalidSampleCounter``.
* :mod:`.validation` — sample validation, ratios of counts, fleet means and ratios.
* :mod:`.memory` — allocator fragmentation, free/used memory, KV-block waste.
* :mod:`.batching` — counter deltas, padding ratio, effective batch size.
* :mod:`.histograms` — cumulative histograms, PromQL-style quantiles, window deltas.
* :mod:`.latency` — latency summaries with plausibility flags.
* :mod:`.quality` — repetition, degeneration diagnosis, perplexity.
* :mod:`.oom` — OOM records and hardware-fault text.
* :mod:`.gpu_snapshot` — impossible GPU snapshot values become no data.
"""

from __future__ import annotations

from inferctl.controller.signals.batching import (batch_window, counter_delta,
                                                  effective_batch_size, padding_ratio)
from inferctl.controller.signals.gpu_snapshot import (ABSOLUTE_ZERO_CELSIUS, GPU_NONNEG_FIELDS,
                                                      GPU_RATIO_FIELDS, GPU_TEMPERATURE_FIELDS,
                                                      clean_gpu_snapshot)
from inferctl.controller.signals.histograms import (Histogram, InvalidHistogram, Quantile,
                                                    histogram_delta, histogram_quantile,
                                                    to_histogram)
from inferctl.controller.signals.latency import LatencySummary, latency_summary
from inferctl.controller.signals.memory import (fragmentation_from_oom, fragmentation_ratio,
                                                free_memory_ratio, kv_waste_ratio,
                                                memory_used_ratio)
from inferctl.controller.signals.oom import (GIB, MIB, OomNumbers, classify_oom, format_bytes,
                                             hardware_fault_evidence, parse_oom_message,
                                             parse_size)
from inferctl.controller.signals.quality import (DEGENERATE_SEQ_REP_THRESHOLD,
                                                 LONG_CONTEXT_TOKENS, PROMPT_LEN_EDGES,
                                                 PROMPT_LEN_LABELS, BucketRate, Diagnosis,
                                                 RepetitionSummary, diagnose_degeneration,
                                                 perplexity_summary, prompt_len_bucket,
                                                 repetition_summary)
from inferctl.controller.signals.validation import (fleet_mean, fleet_ratio, ratio,
                                                    validate_nonneg, validate_ratio)
from inferctl.controller.signals.values import FleetSignal, InvalidSampleCounter, Signal

__all__ = [
    "ABSOLUTE_ZERO_CELSIUS", "BucketRate", "DEGENERATE_SEQ_REP_THRESHOLD", "Diagnosis",
    "FleetSignal", "GIB", "GPU_NONNEG_FIELDS", "GPU_RATIO_FIELDS", "GPU_TEMPERATURE_FIELDS",
    "Histogram", "InvalidHistogram", "InvalidSampleCounter", "LONG_CONTEXT_TOKENS",
    "LatencySummary", "MIB", "OomNumbers", "PROMPT_LEN_EDGES", "PROMPT_LEN_LABELS", "Quantile",
    "RepetitionSummary", "Signal", "batch_window", "classify_oom", "clean_gpu_snapshot",
    "counter_delta", "diagnose_degeneration", "effective_batch_size", "fleet_mean",
    "fleet_ratio", "format_bytes", "fragmentation_from_oom", "fragmentation_ratio",
    "free_memory_ratio", "hardware_fault_evidence", "histogram_delta", "histogram_quantile",
    "kv_waste_ratio", "latency_summary", "memory_used_ratio", "padding_ratio",
    "parse_oom_message", "parse_size", "perplexity_summary", "prompt_len_bucket", "ratio",
    "repetition_summary", "to_histogram", "validate_nonneg", "validate_ratio",
]
