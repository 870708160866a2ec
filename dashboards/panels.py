"""The six dashboards as data: rows of panels, each panel a list of PromQL targets.

Dashboards (stable uids ``inferctl-<name>``): Service, GPU, Batching, Model health,
Control plane and Router; :func:`dashboard_specs` adds an "Other catalog metrics" row for any catalog
entry no panel charts yet. :mod:`dashboards.build` turns these specs into Grafana JSON.

Queries follow :mod:`dashboards.promql`: gauges aggregate with max/avg/min, never sum;
ratios divide aggregates with a guarded denominator; latency quantiles give no data without
traffic. Windows are Grafana's ``$__rate_interval``. The threshold lines (TTFT budget,
fragmentation restart), the charted latency quantiles and the scrape job names come from
:class:`inferctl.contract.thresholds.Thresholds` (default ``THRESHOLDS``), the config the
alerts and the controller's policies read too.
"""

from __future__ import annotations

from inferctl.contract.precision import FULL
from inferctl.contract.thresholds import THRESHOLDS, Thresholds
from inferctl.dashboards import promql as q
from inferctl.dashboards.catalog import metric_catalog, scraped_label
from inferctl.dashboards.router_panels import router
from inferctl.dashboards.slo import saturated_quantile
from inferctl.dashboards.spec_types import W, DashboardSpec, PanelSpec, T, Target, pct as _pct  # noqa: F401

#: Said by each latency panel: what its saturated-quantile line means (issue 10 item 9).
_SAT = (' A "≥ top bucket" line appears where the judged quantile is only a lower bound (it fell above the '
        "largest finite bucket).")
#: The spread quantile charted next to the mean perplexity (a display choice, not a threshold).
PERPLEXITY_SPREAD_QUANTILE = 0.9


def _quantiles(hist: str, t: Thresholds) -> tuple[Target, ...]:
    """The charted quantiles, plus the judged one again where it is saturated: a line
    "p99 ≥ top bucket" appears only when that quantile fell in the +Inf bucket (its value is
    then the largest finite bound, a lower bound; issue 10 item 9)."""
    plain = tuple(T(q.quantile(v, hist, ("model",), W), f"{_pct(v)} {{{{model}}}}") for v in t.latency_quantiles)
    v = t.latency_quantile
    return plain + (T(saturated_quantile(v, hist, ("model",), W), f"{_pct(v)} ≥ top bucket {{{{model}}}}"),)


def service(t: Thresholds = THRESHOLDS) -> DashboardSpec:
    e2e, ttft, itl = ("inferctl_engine_e2e_request_latency_seconds", "inferctl_engine_time_to_first_token_seconds",
                      "inferctl_engine_inter_token_latency_seconds")
    finished = q.rate_sum("inferctl_engine_requests_total", ("model",), W)
    errors = q.rate_sum("inferctl_engine_request_errors_total", ("model",), W)
    return DashboardSpec(
        "inferctl-service", "inferctl / Service",
        "What clients see: latency percentiles, throughput, requests and errors (engine /metrics).",
        (
            ("Latency", (
                PanelSpec("End-to-end latency P50 / P90 / P99",
                          "Arrival to last token, of requests that finished successfully (client aborts and errors "
                          "are counted apart). No data when there is no traffic." + _SAT,
                          _quantiles(e2e, t), "s", width=8),
                PanelSpec("Time to first token P50 / P90 / P99", "Arrival to first generated token (TTFT). "
                          f"Red: the {t.ttft_seconds * 1000:g} ms budget." + _SAT,
                          _quantiles(ttft, t), "s", threshold=t.ttft_seconds, width=8),
                PanelSpec("Inter-token latency P50 / P90 / P99",
                          "Time between consecutive generated tokens (ITL)." + _SAT,
                          _quantiles(itl, t), "s", width=8),
                *(PanelSpec(f"Request {phase} time P50 / P90 / P99", what + " (vLLM's request phases; queue + prefill "
                            "+ decode = end-to-end), of requests that finished successfully." + _SAT,
                            _quantiles(f"inferctl_engine_request_{phase}_time_seconds", t), "s", width=8)
                  for phase, what in (("queue", "Arrival to first scheduled: time in the waiting queue"),
                                      ("prefill", "First scheduled to first token: the prompt's prefill"),
                                      ("decode", "First to last token: the decode phase"))),
            )),
            ("Throughput", (
                PanelSpec("Tokens per second", "Generated (decode) and prompt (prefill) tokens per second.", (
                    T(q.rate_sum("inferctl_engine_generation_tokens_total", ("model",), W), "generated {{model}}"),
                    T(q.rate_sum("inferctl_engine_prompt_tokens_total", ("model",), W), "prompt {{model}}"),
                ), "short", width=8),
                PanelSpec("Requests per second", "Finished requests per second by finish reason.", (
                    T(q.rate_sum("inferctl_engine_requests_total", ("model", "finish_reason"), W),
                      "{{finish_reason}} {{model}}"),
                ), "reqps", width=8),
                PanelSpec("Errors per second", "Requests answered with an error, by reason.", (
                    T(q.rate_sum("inferctl_engine_request_errors_total", ("model", "reason"), W),
                      "{{reason}} {{model}}"),
                ), "reqps", width=8),
                PanelSpec("Client aborts per second",
                          "Requests whose client left (disconnected or timed out) before the answer was complete, "
                          "by reason. They are not in the latency panels above nor in the latency alerts.", (
                    T(q.rate_sum("inferctl_engine_request_aborts_total", ("model", "reason"), W),
                      "{{reason}} {{model}}"),
                ), "reqps", width=8),
                PanelSpec("Error ratio",
                          "Errors per finished request: 0 with traffic and no errors, no data without traffic.", (
                    T(q.ratio(errors, finished, zero_fill=True), "{{model}}"),
                ), "percentunit", min=0, width=8),
                PanelSpec("Engines up", "1 when Prometheus scraped the engine target successfully.", (
                    T(f'min by (instance) (up{{job="{t.engine_job}"}})', "{{instance}}"),
                ), "short", kind="stat", width=8),
            )),
        ))


def gpu(t: Thresholds = THRESHOLDS) -> DashboardSpec:
    g = ("gpu",)
    eng = ("job", "instance")
    mig = ("gpu", "gpu_instance_id", "profile")
    return DashboardSpec(
        "inferctl-gpu", "inferctl / GPU",
        "GPU memory, allocator fragmentation, utilisation, thermals, power and hardware faults.",
        (
            ("Memory", (
                PanelSpec("GPU memory used / reserved / total",
                          "NVML v2 'used' (allocations), 'reserved' (driver), total, per GPU.", (
                    T(q.gauge("inferctl_gpu_memory_used_bytes", g), "used gpu {{gpu}}"),
                    T(q.gauge("inferctl_gpu_memory_reserved_bytes", g), "reserved gpu {{gpu}}"),
                    T(q.gauge("inferctl_gpu_memory_free_bytes", g), "free gpu {{gpu}}"),
                    T(q.gauge("inferctl_gpu_memory_total_bytes", g), "total gpu {{gpu}}"),
                ), "bytes"),
                PanelSpec("GPU memory used ratio", "used / total per GPU (this is NOT fragmentation).", (
                    T(q.ratio(q.gauge("inferctl_gpu_memory_used_bytes", g),
                              q.gauge("inferctl_gpu_memory_total_bytes", g)), "gpu {{gpu}}"),
                ), "percentunit", min=0, max=1),
                PanelSpec("Allocator fragmentation", "Reserved-but-unallocated / reserved bytes (not free memory). "
                          f"Red: {t.fragmentation_ratio * 100:g} %, where the controller drains and restarts "
                          "the engine.", (
                    T(q.gauge("inferctl_fragmentation_ratio", ("engine",)), "controller {{engine}}"),
                    T(q.ratio(f'{q.gauge("inferctl_engine_memory_reserved_bytes", eng)} - '
                              f'{q.gauge("inferctl_engine_memory_allocated_bytes", eng)}',
                              q.gauge("inferctl_engine_memory_reserved_bytes", eng)), "engine {{instance}}"),
                ), "percentunit", threshold=t.fragmentation_ratio, min=0, max=1),
                PanelSpec("Engine memory", "The engine's own accounting: budget, reserved, allocated, weights.", (
                    T(q.gauge("inferctl_engine_memory_budget_bytes", eng), "budget {{instance}}"),
                    T(q.gauge("inferctl_engine_memory_reserved_bytes", eng), "reserved {{instance}}"),
                    T(q.gauge("inferctl_engine_memory_allocated_bytes", eng), "allocated {{instance}}"),
                    T(q.gauge("inferctl_engine_memory_weights_bytes", eng), "weights {{instance}}"),
                ), "bytes"),
                PanelSpec("MIG instance memory",
                          "Used / free / total memory per MIG GPU instance, where the source reports it "
                          "(no data on a GPU without MIG).", (
                    T(q.gauge("inferctl_gpu_mig_memory_used_bytes", mig), "used gpu {{gpu}} gi {{gpu_instance_id}}"),
                    T(q.gauge("inferctl_gpu_mig_memory_free_bytes", mig), "free gpu {{gpu}} gi {{gpu_instance_id}}"),
                    T(q.gauge("inferctl_gpu_mig_memory_total_bytes", mig),
                      "total gpu {{gpu}} gi {{gpu_instance_id}}"),
                ), "bytes", width=24),
            )),
            ("Utilisation and thermals", (
                PanelSpec("Memory-bandwidth utilisation", "DRAM / copy-engine utilisation where the GPU reports it.", (
                    T(q.gauge("inferctl_gpu_memory_bandwidth_utilization_ratio", g), "gpu {{gpu}}"),
                ), "percentunit", min=0, max=1, width=8),
                PanelSpec("SM utilisation", "GPU (SM) utilisation.", (
                    T(q.gauge("inferctl_gpu_utilization_ratio", g), "gpu {{gpu}}"),
                ), "percentunit", min=0, max=1, width=8),
                PanelSpec("Temperature", "GPU core temperature.", (
                    T(q.gauge("inferctl_gpu_temperature_celsius", g), "gpu {{gpu}}"),
                ), "celsius", width=8),
                PanelSpec("Power", "GPU power draw.", (
                    T(q.gauge("inferctl_gpu_power_watts", g), "gpu {{gpu}}"),
                ), "watt", width=8),
            )),
            ("Health", (
                PanelSpec("ECC errors (volatile)", "Volatile ECC error counts by type; any uncorrected error pages.", (
                    T(q.gauge("inferctl_gpu_ecc_errors", ("gpu", "type")), "{{type}} gpu {{gpu}}"),
                ), "short", width=8),
                PanelSpec("Xid events", "Xid events per window by code and the catalogue's action.", (
                    T(q.window_increase("inferctl_gpu_xid_events_total", ("gpu", "xid", "action"), W),
                      "gpu {{gpu}} Xid {{xid}} ({{action}})"),
                ), "short", width=8),
                PanelSpec("GPU telemetry up",
                          "1 when the GPU source's last poll succeeded (NVML, dcgm, replay, sim).", (
                    T(q.gauge("inferctl_gpu_telemetry_up", ("source",), how="min"), "{{source}}"),
                ), "short", kind="state", width=8),
                PanelSpec("GPU healthy / lost", "Hardware policy verdict per GPU; lost means reboot the node.", (
                    T(q.gauge("inferctl_gpu_healthy", g, how="min"), "healthy gpu {{gpu}}"),
                    T(q.gauge("inferctl_gpu_lost", g), "lost gpu {{gpu}}"),
                ), "short", kind="state", width=12),
                PanelSpec("Standing hardware faults",
                          "1 while a GPU carries a standing fault (uncorrectable ECC since driver load, pages "
                          "pending retirement, pending or failed row remap): an OOM there is a hardware fault.", (
                    T(q.gauge("inferctl_gpu_standing_fault", ("gpu", "kind")), "{{kind}} gpu {{gpu}}"),
                ), "short", kind="state", width=12),
                PanelSpec("Correctable ECC errors per second",
                          "Correctable ECC error rate over the storm window: a storm is a warning, never a reset.", (
                    T(q.gauge("inferctl_gpu_ecc_corrected_errors_per_second", g), "gpu {{gpu}}"),
                ), "short", width=24),
            )),
        ))


def batching() -> DashboardSpec:
    eng = ("job", "instance")
    padded = q.rate_sum("inferctl_engine_step_padded_tokens_total", eng, W)
    real = q.rate_sum("inferctl_engine_step_real_tokens_total", eng, W)
    return DashboardSpec(
        "inferctl-batching", "inferctl / Batching",
        "Continuous batching: effective batch size, padding, queues, preemptions and the paged KV cache.",
        (
            ("Batches", (
                PanelSpec("Effective batch size",
                          "Sequences per engine step: step_sequences / steps over the window.", (
                    T(q.ratio(q.rate_sum("inferctl_engine_step_sequences_total", eng, W),
                              q.rate_sum("inferctl_engine_steps_total", eng, W)), "engine {{instance}}"),
                    T(q.gauge("inferctl_effective_batch_size", ("engine",), how="avg"), "controller {{engine}}"),
                ), "short"),
                PanelSpec("Padding ratio", "padded / (real + padded) tokens; 0 for the packed varlen batch.", (
                    T(q.ratio(padded, f"({real} + {padded})"), "engine {{instance}}"),
                    T(q.gauge("inferctl_padding_ratio", ("engine",), how="avg"), "controller {{engine}}"),
                ), "percentunit", min=0, max=1),
                PanelSpec("Queue depth", "Requests waiting and running.", (
                    T(q.gauge("inferctl_engine_num_requests_waiting", eng), "waiting {{instance}}"),
                    T(q.gauge("inferctl_engine_num_requests_running", eng), "running {{instance}}"),
                ), "short"),
                PanelSpec("Preemptions and steps per second",
                          "Sequences preempted (recompute) and engine steps, per second.", (
                    T(q.rate_sum("inferctl_engine_preemptions_total", eng, W), "preemptions {{instance}}"),
                    T(q.rate_sum("inferctl_engine_steps_total", eng, W), "steps {{instance}}"),
                ), "short"),
            )),
            ("KV cache", (
                PanelSpec("KV cache usage", "Fraction of KV blocks in use.", (
                    T(q.gauge("inferctl_engine_kv_cache_usage_ratio", eng), "engine {{instance}}"),
                    T(q.gauge("inferctl_kv_cache_usage_ratio", ("engine",)), "controller {{engine}}"),
                ), "percentunit", min=0, max=1, width=8),
                PanelSpec("KV cache waste",
                          "1 - tokens stored / (blocks used * block size); no data when no block is used.", (
                    T(q.gauge("inferctl_engine_kv_cache_waste_ratio", eng), "engine {{instance}}"),
                    T(q.gauge("inferctl_kv_cache_waste_ratio", ("engine",)), "controller {{engine}}"),
                ), "percentunit", min=0, max=1, width=8),
                PanelSpec("KV cache blocks", "Blocks in the pool by state (cached blocks no request uses count as "
                          "free: they are evicted, least recently used first, when a block is needed).", (
                    T(q.gauge("inferctl_engine_kv_cache_blocks", eng + ("state",)), "{{state}} {{instance}}"),
                ), "short", width=8),
                PanelSpec("Prefix cache hit ratio",
                          "Prompt tokens found in cached KV blocks / prompt tokens looked up (their prefill is "
                          "skipped). No data without lookups (also with --no-enable-prefix-caching).", (
                    T(q.ratio(q.rate_sum("inferctl_engine_prefix_cache_hits_total", eng, W),
                              q.rate_sum("inferctl_engine_prefix_cache_queries_total", eng, W)), "{{instance}}"),
                ), "percentunit", min=0, max=1, width=8),
                PanelSpec("Prefix cache lookups per second", "Prompt tokens looked up and hit, per second.", (
                    T(q.rate_sum("inferctl_engine_prefix_cache_queries_total", eng, W), "queried {{instance}}"),
                    T(q.rate_sum("inferctl_engine_prefix_cache_hits_total", eng, W), "hit {{instance}}"),
                ), "short", width=8),
            )),
        ))


def model_health() -> DashboardSpec:
    m = ("model",)
    buckets = ("model", "prompt_len_bucket")
    return DashboardSpec(
        "inferctl-model-health", "inferctl / Model health",
        "Output quality: repetition (seq-rep-n), degenerate outputs by prompt length, perplexity.",
        (
            ("Quality", (
                PanelSpec("Repetition rate (mean seq-rep-n)",
                          "1 - distinct n-grams / n-grams of each output, averaged (Welleck et al. 2019).", (
                    T(q.histogram_mean("inferctl_engine_output_repetition_ratio", ("model", "n"), W),
                      "seq-rep-{{n}} {{model}}"),
                    T(q.gauge("inferctl_repetition_ratio", ("engine",)), "controller seq-rep-4 {{engine}}"),
                ), "percentunit", min=0, max=1),
                PanelSpec("Degenerate-output rate by prompt length",
                          "Degenerate outputs / scored outputs per prompt-length bucket.", (
                    T(q.ratio(q.rate_sum("inferctl_engine_degenerate_outputs_total", buckets, W),
                              q.rate_sum("inferctl_engine_outputs_total", buckets, W), zero_fill=True),
                      "{{prompt_len_bucket}} {{model}}"),
                    T(q.gauge("inferctl_degenerate_ratio", ("engine", "prompt_len_bucket")),
                      "controller {{prompt_len_bucket}} {{engine}}"),
                ), "percentunit", min=0, max=1),
                PanelSpec("Perplexity", "Mean and P90 perplexity of generated tokens.", (
                    T(q.histogram_mean("inferctl_engine_output_perplexity", m, W), "mean {{model}}"),
                    T(q.quantile(PERPLEXITY_SPREAD_QUANTILE, "inferctl_engine_output_perplexity", m, W),
                      f"{_pct(PERPLEXITY_SPREAD_QUANTILE)} {{{{model}}}}"),
                    T(q.gauge("inferctl_perplexity", ("engine",)), "controller {{engine}}"),
                ), "short"),
                PanelSpec("Scored outputs and non-finite logprobs",
                          "Outputs scored per second by prompt-length bucket; NaN/Inf logprobs per second.", (
                    T(q.rate_sum("inferctl_engine_outputs_total", buckets, W),
                      "outputs {{prompt_len_bucket}} {{model}}"),
                    T(q.rate_sum("inferctl_engine_nonfinite_logprobs_total", ("job", "instance"), W),
                      "non-finite {{instance}}"),
                ), "short"),
            )),
            ("Speculative decoding", _spec_decode_panels()),
        ))


def _spec_decode_panels() -> tuple[PanelSpec, ...]:
    """Model health's speculative-decoding row: acceptance (draft and target agree), volume, by position.
    No data on engines started without --speculative-config."""
    eng = ("job", "instance")
    drafted = q.rate_sum("inferctl_engine_spec_decode_num_draft_tokens_total", eng, W)
    accepted = q.rate_sum("inferctl_engine_spec_decode_num_accepted_tokens_total", eng, W)
    drafts = q.rate_sum("inferctl_engine_spec_decode_num_drafts_total", eng, W)
    per_pos = q.rate_sum("inferctl_engine_spec_decode_num_accepted_tokens_per_pos_total", eng + ("position",), W)
    return (
        PanelSpec("Draft acceptance rate",
                  "Accepted / proposed draft tokens. The red line is the InferctlSpecDecodeAcceptanceCollapsed "
                  "threshold: below it draft and target disagree and speculation only costs time.", (
                      T(q.ratio(accepted, drafted), "{{instance}}"),
                  ), "percentunit", threshold=THRESHOLDS.spec_acceptance_min_ratio, min=0, max=1, width=8),
        PanelSpec("Draft and accepted tokens per second",
                  "Draft tokens the target verified, those it accepted, and drafts (sequence-steps with drafts).", (
                      T(drafted, "drafted {{instance}}"),
                      T(accepted, "accepted {{instance}}"),
                      T(drafts, "drafts {{instance}}"),
                  ), "short", width=8),
        PanelSpec("Acceptance by draft position",
                  "Accepted tokens at draft position i / drafts: how often the i-th draft token survives (falls "
                  "with i; drafts shortened near max_tokens count as rejected at the missing positions).", (
                      T(f"({per_pos}) / on (job, instance) group_left () ({drafts} > 0)",
                        "position {{position}} {{instance}}"),
                  ), "percentunit", min=0, max=1, width=8),
    )


def control_plane(t: Thresholds = THRESHOLDS) -> DashboardSpec:
    e = ("engine",)
    return DashboardSpec(
        "inferctl-control-plane", "inferctl / Control plane",
        "What the controller decided and did: precision, switches, rollbacks, restarts, resets, breaker.",
        (
            ("Precision", (
                PanelSpec("Precision mode",
                          "1 for the mode each engine serves (controller's view and the engine's own).", (
                    T(q.gauge("inferctl_precision_mode", ("engine", "mode")), "{{engine}} {{mode}}"),
                    T(q.gauge("inferctl_engine_precision_mode", ("instance", "mode")), "engine {{instance}} {{mode}}"),
                ), "short", kind="state", width=24),
                PanelSpec("Precision switches",
                          "Switches per window by target mode (int8 = degrade, full = rollback).", (
                    T(q.window_increase("inferctl_precision_switches_total", ("engine", "to"), W),
                      "to {{to}} {{engine}}"),
                    T(q.window_increase("inferctl_engine_precision_switches_total", ("instance", "to"), W),
                      "engine to {{to}} {{instance}}"),
                ), "short", width=8),
                PanelSpec("Rollbacks", "Rollbacks to full precision per window.", (
                    T(q.window_increase("inferctl_precision_switches_total", e, W, matchers=f'to="{FULL}"'),
                      "{{engine}}"),
                ), "short", width=8),
                PanelSpec("Degraded time and rollback hold",
                          "Seconds in int8 since the degradation; the hold required before rollback; flap-guard pin.", (
                    T(q.gauge("inferctl_degraded_seconds", e), "degraded {{engine}}"),
                    T(q.gauge("inferctl_rollback_hold_seconds", e), "hold {{engine}}"),
                    T(q.gauge("inferctl_precision_pinned", e), "pinned {{engine}}"),
                ), "s", width=8),
                PanelSpec("Switches in window and cap",
                          "Automatic precision switches within the ping-pong window, and the cap per window "
                          "(at the cap a rollback is deferred).", (
                    T(q.gauge("inferctl_precision_switches_in_window", e), "switches {{engine}}"),
                    T(q.gauge("inferctl_precision_max_switches_per_window", e), "cap {{engine}}"),
                ), "short", width=24),
            )),
            ("Actions", (
                PanelSpec("Engine restarts and drains", "Restarts by reason and drains, per window.", (
                    T(q.window_increase("inferctl_engine_restarts_total", ("engine", "reason"), W),
                      "restart {{reason}} {{engine}}"),
                    T(q.window_increase("inferctl_engine_drains_total", e, W), "drain {{engine}}"),
                ), "short", width=8),
                PanelSpec("GPU resets",
                          "GPU reset attempts by outcome (success, failed, refused, dry_run), per window.", (
                    T(q.window_increase("inferctl_gpu_resets_total", ("gpu", "outcome"), W), "{{outcome}} gpu {{gpu}}"),
                ), "short", width=8),
                PanelSpec("Engines draining", "1 while an engine admits no new requests (drain before restart).", (
                    T(q.gauge("inferctl_engine_draining", ("instance",)), "{{instance}}"),
                ), "short", kind="state", width=24),
                PanelSpec("OOM faults", "Out-of-memory faults per window, by kind (controller's and engine's count).", (
                    T(q.window_increase("inferctl_engine_oom_events_total", ("engine", "kind"), W),
                      "{{kind}} {{engine}}"),
                    T(q.window_increase("inferctl_engine_oom_total", ("instance", "kind"), W),
                      "engine {{kind}} {{instance}}"),
                ), "short", width=8),
            )),
            ("Latency breaker", (
                PanelSpec("Breaker state", "1 for the latency breaker's state (closed, open, half_open).", (
                    T(q.gauge("inferctl_breaker_state", ("engine", "state")), "{{engine}} {{state}}"),
                ), "short", kind="state", width=12),
                PanelSpec("Breaker trips and TTFT P99",
                          "Trips per window; TTFT P99 over the breaker window (controller); saturated = 1 when "
                          "that P99 is only a lower bound (it fell in the top bucket).", (
                    T(q.window_increase("inferctl_breaker_trips_total", e, W), "trips {{engine}}"),
                    T(q.gauge("inferctl_ttft_p99_seconds", e), "ttft p99 {{engine}}"),
                    T(q.gauge("inferctl_ttft_p99_saturated", e), "p99 saturated {{engine}}"),
                ), "short", width=12),
            )),
            ("Controller", (
                PanelSpec("Controller and engines up",
                          "Prometheus' scrape of the controller; the controller's poll of each engine.", (
                    T(f'min by (instance) (up{{job="{t.controller_job}"}})', "controller {{instance}}"),
                    T(q.gauge("inferctl_engine_up", e, how="min"), "engine {{engine}}"),
                ), "short", kind="state", width=24),
                PanelSpec("Events per second", "Event-log appends by kind.", (
                    T(q.rate_sum("inferctl_events_total", ("kind",), W), "{{kind}}"),
                ), "short", width=8),
                PanelSpec("Poll duration P99 and errors",
                          ("P99 duration of one poll by poller (gpu; engines: every engine's polls in one "
                           "histogram), and failed polls per second by poller (gpu, or engine:NAME)."), (
                    T(q.quantile(t.latency_quantile, "inferctl_poll_duration_seconds", ("poller",), W),
                      f"{_pct(t.latency_quantile)} {{{{poller}}}}"),
                    T(q.rate_sum("inferctl_poll_errors_total", ("poller",), W), "errors/s {{poller}}"),
                ), "s", width=8),
                PanelSpec("Invalid samples", "Samples rejected as invalid per second, by signal.", (
                    T(q.rate_sum("inferctl_invalid_samples_total", ("signal",), W), "{{signal}}"),
                ), "short", width=8),
            )),
            ("Automation", (
                PanelSpec("Automation paused",
                          "1 while automatic actions are paused, by scope (all, engine:NAME, gpu:N) and source "
                          "(operator, maintenance).", (
                    T(q.gauge("inferctl_automation_paused", ("scope", "source")), "{{scope}} {{source}}"),
                ), "short", kind="state", width=8),
                PanelSpec("Paused for", "Seconds each scope has been paused.", (
                    T(q.gauge("inferctl_automation_paused_seconds", ("scope", "source")), "{{scope}} {{source}}"),
                ), "s", width=8),
                PanelSpec("Would have acted", "Actions decided but not executed while paused, per window.", (
                    T(q.window_increase("inferctl_automation_would_have_acted_total", ("policy", "action"), W),
                      "{{action}} ({{policy}})"),
                ), "short", width=8),
            )),
            ("Event log", (
                PanelSpec("Event-log write failures and drops",
                          "Failed writes per second (the action went on; the events wait in memory) and events "
                          "lost per second (buffer full or unwritten at exit).", (
                    T(q.rate_sum("inferctl_event_log_write_failures_total", ("instance",), W),
                      "write failures {{instance}}"),
                    T(q.rate_sum("inferctl_event_log_dropped_events_total", ("instance",), W),
                      "dropped {{instance}}"),
                ), "short", width=8),
                PanelSpec("Events waiting in memory", "Events buffered because the log cannot be written now.", (
                    T(q.gauge("inferctl_event_log_buffered_events", ("instance",)), "{{instance}}"),
                ), "short", width=8),
                PanelSpec("Event-log size and retention",
                          "Rows and bytes in the log after retention; rows deleted per window by bound.", (
                    T(q.gauge("inferctl_event_log_rows", ("instance",)), "rows {{instance}}"),
                    T(q.gauge("inferctl_event_log_bytes", ("instance",)), "bytes {{instance}}"),
                    T(q.window_increase("inferctl_event_log_retention_deleted_rows_total", ("reason",), W),
                      "deleted ({{reason}})"),
                ), "short", width=8),
            )),
        ))


def dashboard_specs(thresholds: Thresholds = THRESHOLDS) -> list[DashboardSpec]:
    """The six dashboards, with an "Other catalog metrics" row for any catalog entry no panel
    charts yet (so a metric added to a catalog shows up after ``inferctl dashboards build``)."""
    t = thresholds
    specs = [service(t), gpu(t), batching(), model_health(), control_plane(t), router(t)]
    return _with_uncharted(specs, t)


def _uncharted_panel(name: str, spec: dict, t: Thresholds) -> PanelSpec:
    labels = tuple(scraped_label(lbl) for lbl in spec["labels"])
    legend = " ".join(f"{{{{{lbl}}}}}" for lbl in labels) or "{{instance}}"
    if spec["type"] == "gauge":
        target = T(q.gauge(name, ("instance",) + labels), legend)
    elif spec["type"] == "counter":
        target = T(q.rate_sum(name, ("instance",) + labels, W), legend)
    else:
        target = T(q.quantile(t.latency_quantile, name, labels or ("instance",), W),
                   f"{_pct(t.latency_quantile)} {legend}")
    return PanelSpec(name, spec["help"], (target,), "short", width=8)


def _charted_metrics(specs: list[DashboardSpec]) -> set[str]:
    from inferctl.dashboards.promql_lint import analyze   # local: keeps the import graph one-way
    names: set[str] = set()
    for d in specs:
        for _row, panels in d.rows:
            for p in panels:
                for t in p.targets:
                    names |= {s.name for s in analyze(t.expr).selectors if s.name}
    return names


def _with_uncharted(specs: list[DashboardSpec], t: Thresholds) -> list[DashboardSpec]:
    catalog = metric_catalog()
    charted = _charted_metrics(specs)
    series_of = {n: ({f"{n}_bucket", f"{n}_sum", f"{n}_count"} if s["type"] == "histogram" else {n})
                 for n, s in catalog.items()}
    missing = [n for n in catalog if not (series_of[n] & charted)]
    out = []
    for d in specs:
        side = {"inferctl-service": "engine", "inferctl-control-plane": "controller",
                "inferctl-router": "router"}.get(d.uid)
        extra = tuple(_uncharted_panel(n, catalog[n], t) for n in missing if catalog[n]["side"] == side)
        rows = d.rows + (("Other catalog metrics", extra),)
        out.append(DashboardSpec(d.uid, d.title, d.description, rows, d.tags) if extra else d)
    return out


