"""The controller's metric catalog: the single source of truth for its series.

Names follow the Prometheus naming conventions (https://prometheus.io/docs/practices/naming/).
Every controller series starts ``inferctl_`` (never ``inferctl_engine_``, which is the
engine's). Labels: ``engine`` is the configured engine name (from the config file, never from
a request), ``gpu`` the GPU index as the source reports it, ``uuid`` the GPU UUID.

Plain data, so ``dashboards/`` can read it without importing anything else of the controller.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from inferctl.contract.metrics import MetricSpec
from inferctl.contract.metrics import build_registry as build_metric_registry

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

CONTROLLER_METRICS: list[MetricSpec] = [
    # precision policy
    {"name": "inferctl_precision_mode", "type": "gauge", "unit": "",
     "help": "1 for the precision mode the engine currently serves (full, int8, int4), 0 otherwise.",
     "labels": ("engine", "mode")},
    {"name": "inferctl_precision_switches_total", "type": "counter", "unit": "switches",
     "help": "Precision switches made by the controller, by target mode (int8 = degrade, full = rollback).",
     "labels": ("engine", "to")},
    {"name": "inferctl_precision_pinned", "type": "gauge", "unit": "",
     "help": "1 while the flap guard pins the engine in int8.", "labels": ("engine",)},
    {"name": "inferctl_degraded_seconds", "type": "gauge", "unit": "seconds",
     "help": "Seconds the engine has served in int8 since the last degradation (0 in full precision).",
     "labels": ("engine",)},
    {"name": "inferctl_rollback_hold_seconds", "type": "gauge", "unit": "seconds",
     "help": "Current hold period required before rolling back to full precision (grows after relapses).",
     "labels": ("engine",)},
    {"name": "inferctl_precision_switches_in_window", "type": "gauge", "unit": "switches",
     "help": ("Automatic precision switches (degrades + rollbacks) within the ping-pong window "
              "(contract/thresholds.py precision_switch_window_seconds)."), "labels": ("engine",)},
    {"name": "inferctl_precision_max_switches_per_window", "type": "gauge", "unit": "switches",
     "help": "The cap on automatic precision switches per window (a rollback without room is deferred).",
     "labels": ("engine",)},
    # engines
    {"name": "inferctl_engine_up", "type": "gauge", "unit": "",
     "help": "1 if the controller's last poll of the engine succeeded.", "labels": ("engine",)},
    {"name": "inferctl_engine_restarts_total", "type": "counter", "unit": "restarts",
     "help": "Engine restarts performed by the controller, by reason.", "labels": ("engine", "reason")},
    {"name": "inferctl_engine_drains_total", "type": "counter", "unit": "drains",
     "help": "Engine drains performed by the controller.", "labels": ("engine",)},
    {"name": "inferctl_engine_oom_events_total", "type": "counter", "unit": "faults",
     "help": "OOM faults observed on engines, by kind (fragmentation, exhaustion, impossible, hardware).",
     "labels": ("engine", "kind")},
    # signals
    {"name": "inferctl_fragmentation_ratio", "type": "gauge", "unit": "ratio",
     "help": "Allocator fragmentation: reserved-but-unallocated / reserved bytes (not free memory).",
     "labels": ("engine",)},
    {"name": "inferctl_kv_cache_waste_ratio", "type": "gauge", "unit": "ratio",
     "help": "KV cache internal waste: 1 - tokens stored / (blocks used * block size).", "labels": ("engine",)},
    {"name": "inferctl_kv_cache_usage_ratio", "type": "gauge", "unit": "ratio",
     "help": "KV cache usage reported by the engine (valid samples only).", "labels": ("engine",)},
    {"name": "inferctl_padding_ratio", "type": "gauge", "unit": "ratio",
     "help": "padded / (real + padded) tokens over the last poll window.", "labels": ("engine",)},
    {"name": "inferctl_effective_batch_size", "type": "gauge", "unit": "sequences",
     "help": "Mean sequences per engine step over the last poll window.", "labels": ("engine",)},
    {"name": "inferctl_repetition_ratio", "type": "gauge", "unit": "ratio",
     "help": "Mean seq-rep-4 of recent outputs.", "labels": ("engine",)},
    {"name": "inferctl_degenerate_ratio", "type": "gauge", "unit": "ratio",
     "help": "Fraction of recent outputs flagged degenerate, by prompt-length bucket.",
     "labels": ("engine", "prompt_len_bucket")},
    {"name": "inferctl_perplexity", "type": "gauge", "unit": "",
     "help": "Mean perplexity of recent outputs' generated tokens.", "labels": ("engine",)},
    {"name": "inferctl_ttft_p99_seconds", "type": "gauge", "unit": "seconds",
     "help": ("TTFT p99 over the breaker window, as the controller computes it "
              "(a lower bound while inferctl_ttft_p99_saturated is 1)."),
     "labels": ("engine",)},
    {"name": "inferctl_ttft_p99_saturated", "type": "gauge", "unit": "",
     "help": ("1 when the breaker's TTFT p99 fell in the +Inf bucket: inferctl_ttft_p99_seconds is then only "
              "a lower bound (the largest finite bucket bound); 0 otherwise."),
     "labels": ("engine",)},
    {"name": "inferctl_invalid_samples_total", "type": "counter", "unit": "samples",
     "help": "Samples rejected as invalid (negative, NaN, ratio > 1, inconsistent counters), by signal.",
     "labels": ("signal",)},
    # latency breaker
    {"name": "inferctl_breaker_state", "type": "gauge", "unit": "",
     "help": "1 for the latency breaker's current state (closed, open, half_open), 0 otherwise.",
     "labels": ("engine", "state")},
    {"name": "inferctl_breaker_trips_total", "type": "counter", "unit": "trips",
     "help": "Times the latency breaker opened.", "labels": ("engine",)},
    # GPUs
    {"name": "inferctl_gpu_telemetry_up", "type": "gauge", "unit": "",
     "help": "1 if the GPU source's last poll succeeded.", "labels": ("source",)},
    {"name": "inferctl_gpu_memory_total_bytes", "type": "gauge", "unit": "bytes",
     "help": "GPU framebuffer memory total.", "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_memory_used_bytes", "type": "gauge", "unit": "bytes",
     "help": "GPU memory used by allocations (NVML v2 'used', excluding driver-reserved).", "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_memory_free_bytes", "type": "gauge", "unit": "bytes",
     "help": "GPU memory free.", "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_memory_reserved_bytes", "type": "gauge", "unit": "bytes",
     "help": "GPU memory reserved by the driver/firmware (NVML v2 'reserved').", "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_utilization_ratio", "type": "gauge", "unit": "ratio",
     "help": "GPU (SM) utilization 0..1.", "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_memory_bandwidth_utilization_ratio", "type": "gauge", "unit": "ratio",
     "help": "Memory-bandwidth (copy engine / DRAM) utilization 0..1, where the GPU reports it.",
     "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_temperature_celsius", "type": "gauge", "unit": "celsius",
     "help": "GPU core temperature.", "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_power_watts", "type": "gauge", "unit": "watts",
     "help": "GPU power draw.", "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_ecc_errors", "type": "gauge", "unit": "errors",
     "help": "Volatile ECC error count as the GPU reports it, by type (corrected, uncorrected).",
     "labels": ("gpu", "uuid", "type")},
    {"name": "inferctl_gpu_mig_memory_total_bytes", "type": "gauge", "unit": "bytes",
     "help": "Framebuffer memory of one MIG GPU instance (its own share), where the source reports it.",
     "labels": ("gpu", "uuid", "gpu_instance_id", "profile")},
    {"name": "inferctl_gpu_mig_memory_used_bytes", "type": "gauge", "unit": "bytes",
     "help": "Memory used in one MIG GPU instance, where the source reports it.",
     "labels": ("gpu", "uuid", "gpu_instance_id", "profile")},
    {"name": "inferctl_gpu_mig_memory_free_bytes", "type": "gauge", "unit": "bytes",
     "help": "Memory free in one MIG GPU instance, where the source reports it.",
     "labels": ("gpu", "uuid", "gpu_instance_id", "profile")},
    {"name": "inferctl_gpu_standing_fault", "type": "gauge", "unit": "",
     "help": ("1 while the GPU carries a standing hardware fault (uncorrectable ECC errors since the last "
              "driver load, pages pending retirement, a pending or failed row remap), by kind."),
     "labels": ("gpu", "uuid", "kind")},
    {"name": "inferctl_gpu_ecc_corrected_errors_per_second", "type": "gauge", "unit": "",
     "help": ("Correctable ECC errors per second over the storm window (counter resets handled); "
              "a storm is a warning, never a reset."),
     "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_xid_events_total", "type": "counter", "unit": "events",
     "help": "Xid events after the hardware policy's deduplication, by GPU, Xid code and the catalogue's action.",
     "labels": ("gpu", "xid", "action")},
    {"name": "inferctl_gpu_lost", "type": "gauge", "unit": "",
     "help": "1 if the GPU is lost (fell off the bus / NVML GpuIsLost): isolated, never reset.",
     "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_healthy", "type": "gauge", "unit": "",
     "help": "1 if the hardware policy considers the GPU healthy.", "labels": ("gpu", "uuid")},
    {"name": "inferctl_gpu_resets_total", "type": "counter", "unit": "resets",
     "help": "GPU reset attempts, by outcome (success, failed, refused, dry_run).", "labels": ("gpu", "outcome")},
    # operator pause and maintenance windows
    {"name": "inferctl_automation_paused", "type": "gauge", "unit": "",
     "help": "1 while automatic actions are paused for the scope (all, engine:NAME, gpu:N), by source "
             "(operator, maintenance); decisions are still logged as 'would have acted'.",
     "labels": ("scope", "source")},
    {"name": "inferctl_automation_paused_seconds", "type": "gauge", "unit": "seconds",
     "help": "Seconds the scope has been paused (0 when not paused), by source (operator, maintenance).",
     "labels": ("scope", "source")},
    {"name": "inferctl_automation_would_have_acted_total", "type": "counter", "unit": "actions",
     "help": "Actions decided but not executed because automation was paused, by policy and action.",
     "labels": ("policy", "action")},
    # the control loop itself
    {"name": "inferctl_events_total", "type": "counter", "unit": "events",
     "help": "Events appended to the event log, by kind (Grafana annotations read these).", "labels": ("kind",)},
    {"name": "inferctl_event_log_write_failures_total", "type": "counter", "unit": "failures",
     "help": ("Failed writes to the event log (disk full, read-only file system): the action went on, the "
              "events wait in memory."), "labels": ()},
    {"name": "inferctl_event_log_buffered_events", "type": "gauge", "unit": "events",
     "help": "Events kept in memory because the event log cannot be written now (bounded).", "labels": ()},
    {"name": "inferctl_event_log_dropped_events_total", "type": "counter", "unit": "events",
     "help": "Events lost because the event log's in-memory buffer was full (or still unwritten at exit).",
     "labels": ()},
    {"name": "inferctl_event_log_rows", "type": "gauge", "unit": "rows",
     "help": "Rows in the event log (after retention).", "labels": ()},
    {"name": "inferctl_event_log_bytes", "type": "gauge", "unit": "bytes",
     "help": "Bytes of the event log's pages in use (free pages excluded: SQLite reuses them).", "labels": ()},
    {"name": "inferctl_event_log_retention_deleted_rows_total", "type": "counter", "unit": "rows",
     "help": "Event-log rows deleted by retention, by bound (age, rows, bytes).", "labels": ("reason",)},
    {"name": "inferctl_poll_duration_seconds", "type": "histogram", "unit": "seconds",
     "help": ("Duration of one poll, by poller: gpu, or engines (every engine's polls in one histogram; "
              "per engine: /status last_duration_seconds)."), "labels": ("poller",),
     "buckets": DURATION_BUCKETS},
    {"name": "inferctl_poll_errors_total", "type": "counter", "unit": "errors",
     "help": "Failed polls, by poller (gpu, or engine:NAME).", "labels": ("poller",)},
]


def build_registry(registry: CollectorRegistry | None = None) -> tuple[CollectorRegistry, dict]:
    """Create every metric of :data:`CONTROLLER_METRICS` in ``registry``; returns (registry, by name)
    (:func:`inferctl.contract.metrics.build_registry`)."""
    return build_metric_registry(CONTROLLER_METRICS, registry)
