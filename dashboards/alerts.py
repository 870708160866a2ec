"""Prometheus recording and alerting rules, generated from the metric catalog.

Output: the ``groups:`` document of a Prometheus rule file
(https://prometheus.io/docs/prometheus/latest/configuration/alerting_rules/) and the same
groups wrapped as a prometheus-operator ``PrometheusRule`` object
(https://prometheus-operator.dev/docs/api-reference/api/#monitoring.coreos.com/v1.PrometheusRule).

Conventions:

- Alert names are CamelCase; every alert has a non-empty ``for``, a ``severity`` label
  (``critical`` pages, ``warning`` opens a ticket, ``none`` only for the always-firing
  ``Watchdog``), and ``summary``, ``description`` (with the value or the labels that matter)
  and ``runbook_url`` annotations. ``runbook_url`` is ``<base>/<AlertName>.md``; every one has
  a file in ``runbooks/``.
- Recording rules are named ``level:metric:operations``
  (https://prometheus.io/docs/practices/rules/#naming-and-aggregation).
- Expressions come from :mod:`dashboards.promql`: aggregate then divide, guard zero
  denominators, no data without traffic (docs/field-cases.md).
- Rules over missing series never fire (kubernetes-mixin #1112, docs/field-cases.md), so the
  engine and the controller each have an ``up == 0`` rule and an ``absent(...)`` rule whose
  selector carries only equality matchers (its labels become the alert's labels).

Every threshold, window, ``for:`` duration, quantile, scrape job name and the runbook base URL
comes from :class:`inferctl.contract.thresholds.Thresholds` (default
:data:`~inferctl.contract.thresholds.THRESHOLDS`), the config the controller's policies read
too; recording-rule names carry their window (``..._rate5m``) so they follow it.
"""

from __future__ import annotations

from dataclasses import replace

from inferctl.contract.precision import INT8
from inferctl.contract.thresholds import THRESHOLDS, Thresholds
from inferctl.dashboards import promql as q
from inferctl.dashboards.rules import AlertRule, RecordingRule, RuleGroup, spoken
from inferctl.dashboards.slo import saturation_alerts, saturation_recordings, slo_alerts

#: Where ``runbook_url`` points by default (``THRESHOLDS.runbook_base_url``).
DEFAULT_RUNBOOK_BASE_URL = THRESHOLDS.runbook_base_url

SEVERITIES = ("critical", "warning", "none")
LATENCY_HISTOGRAMS = {
    "e2e": "inferctl_engine_e2e_request_latency_seconds",
    "ttft": "inferctl_engine_time_to_first_token_seconds",
    "itl": "inferctl_engine_inter_token_latency_seconds",
}


def latency_record(histogram: str, t: Thresholds = THRESHOLDS) -> str:
    """Name of the recorded quantiles of a latency histogram (label ``quantile``)."""
    return f"job_model_quantile:{histogram}:histogram_quantile_rate{t.latency_rate_window}"


def repetition_record(t: Thresholds = THRESHOLDS) -> str:
    """Name of the recorded mean seq-rep-n of outputs (label ``n``)."""
    return f"job_model_n:inferctl_engine_output_repetition_ratio:avg_rate{t.quality_rate_window}"


def degenerate_record(t: Thresholds = THRESHOLDS) -> str:
    """Name of the recorded degenerate-output fraction per prompt-length bucket."""
    return f"job_model_prompt_len_bucket:inferctl_engine_degenerate_outputs:ratio_rate{t.quality_rate_window}"


def perplexity_record(t: Thresholds = THRESHOLDS) -> str:
    """Name of the recorded mean perplexity of outputs."""
    return f"job_model:inferctl_engine_output_perplexity:avg_rate{t.perplexity_window}"


def spec_acceptance_record(t: Thresholds = THRESHOLDS) -> str:
    """Name of the recorded speculative-decoding acceptance rate (accepted / draft tokens) per engine."""
    return f"job_instance:inferctl_engine_spec_decode_acceptance:ratio_rate{t.spec_acceptance_window}"


def _latency_recordings(t: Thresholds) -> list[RecordingRule]:
    labels = ("job", "model")
    rules: list[RecordingRule] = []
    for hist in LATENCY_HISTOGRAMS.values():
        for qv in t.latency_quantiles:
            rules.append(RecordingRule(
                record=latency_record(hist, t),
                expr=q.quantile(qv, hist, labels, t.latency_rate_window),
                labels=labels + ("quantile",), static={"quantile": str(qv)}))
    return rules


def _quality_recordings(t: Thresholds) -> list[RecordingRule]:
    w = t.quality_rate_window
    buckets = ("job", "model", "prompt_len_bucket")
    return [
        RecordingRule(
            record=repetition_record(t),
            expr=q.histogram_mean("inferctl_engine_output_repetition_ratio", ("job", "model", "n"), w),
            labels=("job", "model", "n")),
        RecordingRule(
            record=degenerate_record(t),
            expr=q.ratio(
                q.rate_sum("inferctl_engine_degenerate_outputs_total", buckets, w),
                q.rate_sum("inferctl_engine_outputs_total", buckets, w),
                zero_fill=True),
            labels=buckets),
        RecordingRule(
            record=perplexity_record(t),
            expr=q.histogram_mean("inferctl_engine_output_perplexity", ("job", "model"), t.perplexity_window),
            labels=("job", "model")),
        RecordingRule(
            record=spec_acceptance_record(t),
            expr=q.ratio(
                q.rate_sum("inferctl_engine_spec_decode_num_accepted_tokens_total", ("job", "instance"),
                           t.spec_acceptance_window),
                q.rate_sum("inferctl_engine_spec_decode_num_draft_tokens_total", ("job", "instance"),
                           t.spec_acceptance_window)),
            labels=("job", "instance")),
    ]


def recording_rules(thresholds: Thresholds = THRESHOLDS) -> list[RecordingRule]:
    """Every recording rule, in evaluation order (windows and quantiles from ``thresholds``)."""
    return _latency_recordings(thresholds) + _quality_recordings(thresholds) + saturation_recordings(thresholds)


def recorded_series(thresholds: Thresholds = THRESHOLDS) -> dict[str, frozenset[str]]:
    """``{record name: label names}`` of every recording rule's output."""
    return {r.record: frozenset(r.labels) for r in recording_rules(thresholds)}


def _latency_alerts(t: Thresholds) -> list[AlertRule]:
    sel = f'{{quantile="{t.latency_quantile:g}"}}'
    e2e = latency_record(LATENCY_HISTOGRAMS["e2e"], t) + sel
    ttft = latency_record(LATENCY_HISTOGRAMS["ttft"], t) + sel
    return (_p99_alerts("InferctlHighP99Latency", e2e, "end-to-end latency", "end-to-end request latency",
                        t.e2e_warning_seconds, t.e2e_critical_seconds, t)
            + _p99_alerts("InferctlHighTimeToFirstToken", ttft, "time to first token", "time to first token",
                          t.ttft_seconds, t.ttft_critical_seconds, t))


def _p99_alerts(name: str, p99: str, summary_what: str, description_what: str,
                warning_seconds: float, critical_seconds: float, t: Thresholds) -> list[AlertRule]:
    """A warning (for ``t.latency_warning_for``) and a critical (for ``t.latency_critical_for``)
    alert on the recorded P99 series ``p99`` (seconds) above each threshold; the texts name
    the latency as ``summary_what`` / ``description_what``."""
    return [AlertRule(
        name, f"{p99} > {thr:g}", for_, sev,
        f"P99 {summary_what} of {{{{ $labels.model }}}} is high.",
        f"P99 {description_what} of model {{{{ $labels.model }}}} (job {{{{ $labels.job }}}}) is "
        "{{ $value | humanizeDuration }} over the last " f"{spoken(t.latency_rate_window)}, above {thr:g}s.")
        for sev, thr, for_ in (("warning", warning_seconds, t.latency_warning_for),
                               ("critical", critical_seconds, t.latency_critical_for))]


def _quality_alerts(t: Thresholds) -> list[AlertRule]:
    rep = f'{repetition_record(t)}{{n="{t.degenerate_ngram}"}}'
    degen = degenerate_record(t)
    ppl = perplexity_record(t)
    drift = f"{ppl} / ({ppl} offset {t.perplexity_baseline_offset} > 0)"
    window = spoken(t.quality_rate_window)
    volume = q.rate_sum("inferctl_engine_outputs_total", ("job", "model", "prompt_len_bucket"), t.quality_rate_window,
                        fn="increase")
    spec_volume = q.rate_sum("inferctl_engine_spec_decode_num_draft_tokens_total", ("job", "instance"),
                             t.spec_acceptance_window, fn="increase")
    return [
        AlertRule(
            "InferctlOutputRepetitionHigh", f"{rep} > {t.repetition_ratio:g}", t.repetition_for, "warning",
            "Outputs of {{ $labels.model }} repeat themselves.",
            f"Mean seq-rep-{t.degenerate_ngram} of the outputs of model {{{{ $labels.model }}}} "
            "(job {{ $labels.job }}) is "
            f"{{{{ $value | humanizePercentage }}}} over the last {window}, above "
            f"{t.repetition_ratio:.0%}: the model is looping."),
        AlertRule(
            "InferctlDegenerateOutputRateHigh",
            f"{degen} > {t.degenerate_ratio:g} and on (job, model, prompt_len_bucket) "
            f"({volume} >= {t.degenerate_min_outputs})",
            t.degenerate_for, "warning",
            "Many degenerate outputs of {{ $labels.model }} for prompts of {{ $labels.prompt_len_bucket }} tokens.",
            "{{ $value | humanizePercentage }} of the outputs of model {{ $labels.model }} (job {{ $labels.job }}) "
            f"for prompts in bucket {{{{ $labels.prompt_len_bucket }}}} were degenerate over the last {window}, above "
            f"{t.degenerate_ratio:.0%}."),
        AlertRule(
            "InferctlSpecDecodeAcceptanceCollapsed",
            f"{spec_acceptance_record(t)} < {t.spec_acceptance_min_ratio:g} and on (job, instance) "
            f"({spec_volume} >= {t.spec_acceptance_min_draft_tokens})",
            t.spec_acceptance_for, "warning",
            "Speculative decoding on {{ $labels.instance }}: the target rejects almost every draft token.",
            "Only {{ $value | humanizePercentage }} of the draft tokens of engine {{ $labels.instance }} (job "
            f"{{{{ $labels.job }}}}) were accepted over the last {spoken(t.spec_acceptance_window)}, below "
            f"{t.spec_acceptance_min_ratio:.0%}: draft and target disagree, so speculation costs time and "
            "saves none."),
        AlertRule(
            "InferctlPerplexityDrift",
            f"{drift} > {t.perplexity_drift_factor:g} or {drift} < {1 / t.perplexity_drift_factor:.4g}",
            t.perplexity_drift_for, "warning",
            "Perplexity of {{ $labels.model }} drifted from yesterday.",
            "Mean perplexity of the outputs of model {{ $labels.model }} (job {{ $labels.job }}) over the last "
            f"{spoken(t.perplexity_window)} is {{{{ $value | printf \"%.2f\" }}}} times the same "
            f"{spoken(t.perplexity_window)} {spoken(t.perplexity_baseline_offset, one='a ')} before (alert outside "
            f"{1 / t.perplexity_drift_factor:.2f}..{t.perplexity_drift_factor:g})."),
    ]


def _availability_alerts(t: Thresholds) -> list[AlertRule]:
    down = spoken(t.down_for)
    return [
        AlertRule(
            "InferctlEngineDown", f'up{{job="{t.engine_job}"}} == 0', t.down_for, "critical",
            "Engine {{ $labels.instance }} is down.",
            "Prometheus has failed to scrape engine {{ $labels.instance }} (job {{ $labels.job }}) "
            f"for {down}: the engine is not serving, or its /metrics is unreachable."),
        AlertRule(
            "InferctlEngineMetricsAbsent", f'absent(inferctl_engine_num_requests_running{{job="{t.engine_job}"}})',
            t.down_for, "warning",
            "No engine metrics in Prometheus.",
            f"No series inferctl_engine_num_requests_running with job {{{{ $labels.job }}}} has existed for {down}: "
            "no engine target is scraped, or the engine stopped exposing its metrics. Every engine alert is blind."),
        AlertRule(
            "InferctlControllerDown", f'up{{job="{t.controller_job}"}} == 0', t.down_for, "critical",
            "Controller {{ $labels.instance }} is down.",
            "Prometheus has failed to scrape controller {{ $labels.instance }} (job {{ $labels.job }}) "
            f"for {down}: nothing degrades on OOM, rolls back, restarts or resets GPUs."),
        AlertRule(
            "InferctlControllerMetricsAbsent", f'absent(up{{job="{t.controller_job}"}})', t.down_for, "warning",
            "No controller target in Prometheus.",
            f"Prometheus has had no scrape target with job {{{{ $labels.job }}}} for {down}: the controller "
            "is not monitored (service discovery or scrape configuration)."),
    ]


def _control_plane_alerts(t: Thresholds) -> list[AlertRule]:
    overdue = (f"max by (job, engine) (inferctl_degraded_seconds) > max by (job, engine) "
               f"({t.rollback_overdue_factor:g} * inferctl_rollback_hold_seconds "
               f"+ {t.rollback_overdue_grace_seconds:g})")
    return [
        AlertRule(
            "InferctlEngineDegradedToInt8",
            f'max by (job, engine) (inferctl_precision_mode{{mode="{INT8}"}}) == 1', t.degraded_for, "critical",
            f"Engine {{{{ $labels.engine }}}} is degraded to {INT8}.",
            f"Engine {{{{ $labels.engine }}}} (controller job {{{{ $labels.job }}}}) serves {INT8} weights after an "
            "out-of-memory fault: output quality is reduced until the controller rolls back to full precision."),
        AlertRule(
            "InferctlPrecisionFlapping",
            f'max by (job, engine) (changes(inferctl_precision_mode{{mode="{INT8}"}}[{t.flap_window}])) '
            f'>= {t.flap_changes}',
            t.flapping_for, "warning",
            "Engine {{ $labels.engine }} flaps between int8 and full precision.",
            "Engine {{ $labels.engine }} changed precision {{ $value }} times in the last "
            f"{t.flap_window} (threshold {t.flap_changes}): memory recovers and runs out again."),
        AlertRule(
            "InferctlRollbackOverdue", overdue, t.rollback_overdue_for, "warning",
            "Engine {{ $labels.engine }} has not rolled back to full precision.",
            "Engine {{ $labels.engine }} has served int8 for {{ $value | humanizeDuration }}, more than "
            f"{t.rollback_overdue_factor:g} times its rollback hold plus {t.rollback_overdue_grace_seconds:g}s: "
            "memory has not recovered, or the rollback is blocked."),
        AlertRule(
            "InferctlGpuMemoryFragmentationHigh",
            f"max by (job, engine) (inferctl_fragmentation_ratio) > {t.fragmentation_ratio:g}", t.fragmentation_for,
            "warning",
            "Allocator fragmentation of engine {{ $labels.engine }} is high.",
            "{{ $value | humanizePercentage }} of the memory reserved by engine {{ $labels.engine }}'s allocator "
            f"is unallocated (threshold {t.fragmentation_ratio:.0%}) for {spoken(t.fragmentation_for)}; "
            "the automatic drain and "
            "restart has not cleared it."),
        AlertRule(
            "InferctlLatencyBreakerOpen",
            'max by (job, engine) (inferctl_breaker_state{state="open"}) == 1', t.breaker_open_for, "warning",
            "Latency breaker of {{ $labels.engine }} is open.",
            "The latency breaker of engine {{ $labels.engine }} has been open for "
            f"{spoken(t.breaker_open_for)}: requests go to "
            "the lightweight model because TTFT exceeded its budget."),
        AlertRule(
            "InferctlEventLogUnwritable",
            "max by (job, instance) (inferctl_event_log_buffered_events) > 0", t.event_log_unwritable_for,
            "warning",
            "The controller cannot write its event log.",
            "Controller {{ $labels.instance }} (job {{ $labels.job }}) keeps {{ $value }} events in memory for "
            f"{spoken(t.event_log_unwritable_for)}: its event log file cannot be written (disk full or read-only). "
            "Actions still run; the events are written once the disk has room, and are lost if the buffer "
            "fills or the controller stops first."),
        AlertRule(
            "InferctlAutomationPausedTooLong",
            f'max by (job, scope) (inferctl_automation_paused_seconds{{source="operator"}}) '
            f'> {t.automation_paused_max_seconds:g}',
            t.automation_paused_for, "warning",
            "Automatic actions are paused for {{ $labels.scope }}.",
            "An operator paused the controller's automatic actions for {{ $labels.scope }} (job {{ $labels.job }}) "
            "{{ $value | humanizeDuration }} ago (threshold "
            f"{t.automation_paused_max_seconds:g}s): faults are only logged as 'would have acted' until "
            "`inferctl resume`."),
    ]


def _gpu_alerts(t: Thresholds) -> list[AlertRule]:
    # Critical: every Xid whose catalogue action is not "ignore" or "restart_engine" (the
    # controller's XidAction vocabulary: reset_gpu, reboot_node, unknown -> a person or a reset).
    xid = q.counter_increased("inferctl_gpu_xid_events_total", ("job", "gpu", "xid", "action"),
                              t.critical_xid_window, 'action!~"ignore|restart_engine"')
    reset = q.counter_increased("inferctl_gpu_resets_total", ("job", "gpu"), t.reset_failed_window,
                                'outcome="failed"')
    return [
        AlertRule(
            "InferctlGpuResetFailed", reset, t.gpu_fault_for, "critical",
            "Reset of GPU {{ $labels.gpu }} failed.",
            "{{ $value | humanize }} reset(s) of GPU {{ $labels.gpu }} failed in the last " f"{t.reset_failed_window}: "
            "the GPU is still unhealthy and drained."),
        AlertRule(
            "InferctlGpuCriticalXid", xid, t.gpu_fault_for, "critical",
            "GPU {{ $labels.gpu }} reported Xid {{ $labels.xid }}.",
            "GPU {{ $labels.gpu }} reported Xid {{ $labels.xid }} ({{ $value | humanize }} time(s) in the last "
            f"{t.critical_xid_window}); the Xid catalogue's action is {{{{ $labels.action }}}}."),
        AlertRule(
            "InferctlGpuLost", "max by (job, gpu, uuid) (inferctl_gpu_lost) == 1", t.gpu_fault_for, "critical",
            "GPU {{ $labels.gpu }} is lost.",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) fell off the bus or NVML reports it lost: a reset "
            "cannot help, the node must be rebooted."),
        AlertRule(
            "InferctlGpuEccUncorrectable",
            'max by (job, gpu, uuid) (inferctl_gpu_ecc_errors{type="uncorrected"}) > 0', t.gpu_fault_for, "critical",
            "GPU {{ $labels.gpu }} has uncorrectable ECC errors.",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) reports {{ $value }} volatile uncorrectable ECC "
            "error(s): its memory contents cannot be trusted."),
        AlertRule(
            "InferctlGpuTelemetryDown", "max by (job, source) (inferctl_gpu_telemetry_up) == 0", t.telemetry_down_for,
            "warning",
            "GPU telemetry from {{ $labels.source }} is down.",
            "Every poll of GPU source {{ $labels.source }} (job {{ $labels.job }}) has failed for "
            f"{spoken(t.telemetry_down_for)}: "
            "GPU memory, Xid and ECC are unknown, and the hardware policy is blind."),
    ]


def _router_alerts(t: Thresholds) -> list[AlertRule]:
    """The router's alerts (issue 9): no ready replica, retry storm, one replica taking most traffic."""
    req = "inferctl_router_requests_total"
    retry = q.ratio(q.rate_sum("inferctl_router_retries_total", ("job",), t.router_retry_window),
                    q.rate_sum(req, ("job",), t.router_retry_window))
    w = t.router_imbalance_window
    share = (f"{q.rate_sum(req, ('job', 'replica'), w)} / ignoring (replica) group_left () "
             f"({q.rate_sum(req, ('job',), w)} > 0)")
    guards = (f"min by (job) (inferctl_router_replicas_ready) >= {t.router_imbalance_min_replicas} and on (job) "
              f"{q.rate_sum(req, ('job',), w, fn='increase')} >= {t.router_imbalance_min_requests}")
    return [
        AlertRule(
            "InferctlRouterNoReadyReplica", "max by (job, instance) (inferctl_router_replicas_ready) == 0",
            t.router_no_ready_for, "critical",
            "Router {{ $labels.instance }} has no ready replica.",
            "Router {{ $labels.instance }} (job {{ $labels.job }}) has had no replica it may send to for "
            f"{spoken(t.router_no_ready_for, one='a ')}: every request is answered 503 (no_ready_replica)."),
        AlertRule(
            "InferctlRouterRetryStorm", f"{retry} > {t.router_retry_ratio:g}", t.router_retry_for, "warning",
            "The router retries many requests.",
            "Retries are {{ $value | humanizePercentage }} of the requests of router job {{ $labels.job }} over "
            f"the last {spoken(t.router_retry_window)} (threshold {t.router_retry_ratio:.0%}): replicas refuse "
            "or fail before the first byte, and every retry adds latency."),
        AlertRule(
            "InferctlRouterReplicaImbalance",
            f"({share}) > {t.router_imbalance_ratio:g} and ignoring (replica) ({guards})",
            t.router_imbalance_for, "warning",
            "Replica {{ $labels.replica }} takes most of the router's traffic.",
            "Replica {{ $labels.replica }} answered {{ $value | humanizePercentage }} of the requests of router "
            f"job {{{{ $labels.job }}}} over the last {spoken(w)} (threshold {t.router_imbalance_ratio:.0%}) "
            f"while at least {t.router_imbalance_min_replicas} replicas are ready: the others are idle or "
            "refused."),
    ]


def _meta_alerts(t: Thresholds) -> list[AlertRule]:
    return [AlertRule(
        "Watchdog", "vector(1)", t.watchdog_for, "none",
        "Always firing: proves the alerting pipeline works.",
        "This alert always fires. Alertmanager sends it to the heartbeat receiver every minute; when the "
        "heartbeats stop, Prometheus, Alertmanager or the path between them is broken.")]


def rule_groups(thresholds: Thresholds | None = None, for_override: str | None = None) -> list[RuleGroup]:
    """The rule groups in file order.

    Args:
        thresholds: thresholds, windows and job names (default: ``THRESHOLDS``).
        for_override: replace every alert's ``for`` with this duration (e.g. ``"2s"``); only for
            the end-to-end test, which cannot wait minutes. The committed files never use it.
    """
    t = THRESHOLDS if thresholds is None else thresholds
    groups = [
        RuleGroup("inferctl-engine.recording", tuple(recording_rules(t))),
        RuleGroup("inferctl-engine.alerts", tuple(_latency_alerts(t) + _quality_alerts(t) + _availability_alerts(t))),
        RuleGroup("inferctl-controller.alerts", tuple(_control_plane_alerts(t))),
        RuleGroup("inferctl-gpu.alerts", tuple(_gpu_alerts(t))),
        RuleGroup("inferctl-router.alerts", tuple(_router_alerts(t))),
        RuleGroup("inferctl-saturation.alerts", tuple(saturation_alerts(t))),
        RuleGroup("inferctl-slo.alerts", tuple(slo_alerts(t))),
        RuleGroup("inferctl-meta.alerts", tuple(_meta_alerts(t))),
    ]
    if for_override is not None:
        groups = [RuleGroup(g.name, tuple(replace(r, for_=for_override) if isinstance(r, AlertRule) else r
                                          for r in g.rules)) for g in groups]
    return groups


def alert_rules(groups: list[RuleGroup] | None = None) -> list[AlertRule]:
    """Every alerting rule (two-tier alerts appear once per severity)."""
    return [r for g in (groups or rule_groups()) for r in g.rules if isinstance(r, AlertRule)]


def rules_document(groups: list[RuleGroup] | None = None,
                   runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL) -> dict:
    """The rule file as a dict: ``{"groups": [{"name", "rules": [...]}, ...]}``."""
    out = []
    for g in groups or rule_groups():
        out.append({"name": g.name, "rules": [
            r.to_dict(runbook_base_url) if isinstance(r, AlertRule) else r.to_dict() for r in g.rules]})
    return {"groups": out}


def prometheus_rule_object(groups: list[RuleGroup] | None = None,
                           runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL) -> dict:
    """The same groups as a ``monitoring.coreos.com/v1`` ``PrometheusRule`` (for Kubernetes)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "inferctl",
            "labels": {"app.kubernetes.io/name": "inferctl", "app.kubernetes.io/component": "alerting",
                       "prometheus": "k8s", "role": "alert-rules"},
        },
        "spec": rules_document(groups, runbook_base_url),
    }
