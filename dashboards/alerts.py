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
  denominators, no data without traffic (field cases F04, F05).
- F07 (kubernetes-mixin #1112): rules over missing series never fire, so the engine and the
  controller each have an ``up == 0`` rule and an ``absent(...)`` rule whose selector carries
  only equality matchers (its labels become the alert's labels).

Thresholds live in :class:`AlertThresholds` (defaults documented on each field).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from inferctl.dashboards import promql as q
from inferctl.dashboards.catalog import CONTROLLER_JOB, ENGINE_JOB

#: Where ``runbook_url`` points: the runbooks/ folder of the repository's main branch.
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/inferctl/inferctl/blob/main/runbooks/"

SEVERITIES = ("critical", "warning", "none")
LATENCY_HISTOGRAMS = {
    "e2e": "inferctl_engine_e2e_request_latency_seconds",
    "ttft": "inferctl_engine_time_to_first_token_seconds",
    "itl": "inferctl_engine_inter_token_latency_seconds",
}
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class AlertThresholds:
    """Alert thresholds. Sources: ``ttft_*`` — the design's 500 ms latency budget (the
    breaker trips at the same value); ``fragmentation_ratio`` — the design's "restart when
    fragmentation passes 30 %"; the rest are operator defaults, tune per deployment."""

    e2e_p99_warning_seconds: float = 10.0
    e2e_p99_critical_seconds: float = 30.0
    ttft_p99_warning_seconds: float = 0.5
    ttft_p99_critical_seconds: float = 2.0
    fragmentation_ratio: float = 0.30
    flap_changes: int = 4                  # int8<->full changes within flap_window (2 round trips)
    flap_window: str = "1h"
    rollback_overdue_factor: float = 2.0   # degraded longer than factor * hold + grace
    rollback_overdue_grace_seconds: float = 600.0
    repetition_ratio: float = 0.5          # mean seq-rep-4 of outputs over 15 min
    degenerate_ratio: float = 0.2          # fraction of outputs flagged degenerate over 15 min
    degenerate_min_outputs: int = 10       # below this many outputs in 15 min, no verdict
    perplexity_drift_factor: float = 1.5   # mean perplexity (1 h) vs the same hour a day before
    critical_xid_window: str = "15m"
    reset_failed_window: str = "30m"


@dataclass(frozen=True)
class RecordingRule:
    """``record``: the output name; ``labels``: the label names the output carries (for the
    lint of expressions that read it); ``static``: constant labels added by the rule."""

    record: str
    expr: str
    labels: tuple[str, ...]
    static: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        out: dict = {"record": self.record, "expr": self.expr}
        if self.static:
            out["labels"] = dict(self.static)
        return out


@dataclass(frozen=True)
class AlertRule:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def to_dict(self, runbook_base_url: str) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": f"{runbook_base_url}{self.name}.md",
            },
        }


@dataclass(frozen=True)
class RuleGroup:
    name: str
    rules: tuple[RecordingRule | AlertRule, ...]


def _latency_recordings() -> list[RecordingRule]:
    labels = ("job", "model")
    rules: list[RecordingRule] = []
    for hist in LATENCY_HISTOGRAMS.values():
        for qv in QUANTILES:
            rules.append(RecordingRule(
                record=f"job_model_quantile:{hist}:histogram_quantile_rate5m",
                expr=q.quantile(qv, hist, labels, "5m"),
                labels=labels + ("quantile",), static={"quantile": str(qv)}))
    return rules


def _quality_recordings() -> list[RecordingRule]:
    return [
        RecordingRule(
            record="job_model_n:inferctl_engine_output_repetition_ratio:avg_rate15m",
            expr=q.histogram_mean("inferctl_engine_output_repetition_ratio", ("job", "model", "n"), "15m"),
            labels=("job", "model", "n")),
        RecordingRule(
            record="job_model_prompt_len_bucket:inferctl_engine_degenerate_outputs:ratio_rate15m",
            expr=q.ratio(
                q.rate_sum("inferctl_engine_degenerate_outputs_total", ("job", "model", "prompt_len_bucket"), "15m"),
                q.rate_sum("inferctl_engine_outputs_total", ("job", "model", "prompt_len_bucket"), "15m"),
                zero_fill=True),
            labels=("job", "model", "prompt_len_bucket")),
        RecordingRule(
            record="job_model:inferctl_engine_output_perplexity:avg_rate1h",
            expr=q.histogram_mean("inferctl_engine_output_perplexity", ("job", "model"), "1h"),
            labels=("job", "model")),
    ]


def recording_rules() -> list[RecordingRule]:
    """Every recording rule, in evaluation order."""
    return _latency_recordings() + _quality_recordings()


def recorded_series() -> dict[str, frozenset[str]]:
    """``{record name: label names}`` of every recording rule's output."""
    return {r.record: frozenset(r.labels) for r in recording_rules()}


def _latency_alerts(t: AlertThresholds) -> list[AlertRule]:
    e2e = 'job_model_quantile:inferctl_engine_e2e_request_latency_seconds:histogram_quantile_rate5m{quantile="0.99"}'
    ttft = 'job_model_quantile:inferctl_engine_time_to_first_token_seconds:histogram_quantile_rate5m{quantile="0.99"}'
    return (_p99_alerts("InferctlHighP99Latency", e2e, "end-to-end latency", "end-to-end request latency",
                        t.e2e_p99_warning_seconds, t.e2e_p99_critical_seconds)
            + _p99_alerts("InferctlHighTimeToFirstToken", ttft, "time to first token", "time to first token",
                          t.ttft_p99_warning_seconds, t.ttft_p99_critical_seconds))


def _p99_alerts(name: str, p99: str, summary_what: str, description_what: str,
                warning_seconds: float, critical_seconds: float) -> list[AlertRule]:
    """A warning (for 10m) and a critical (for 5m) alert on the recorded P99 series ``p99``
    (seconds) above each threshold; the texts name the latency as ``summary_what`` /
    ``description_what``."""
    return [AlertRule(
        name, f"{p99} > {thr:g}", for_, sev,
        f"P99 {summary_what} of {{{{ $labels.model }}}} is high.",
        f"P99 {description_what} of model {{{{ $labels.model }}}} (job {{{{ $labels.job }}}}) is "
        "{{ $value | humanizeDuration }} over the last 5 minutes, above " f"{thr:g}s.")
        for sev, thr, for_ in (("warning", warning_seconds, "10m"), ("critical", critical_seconds, "5m"))]


def _quality_alerts(t: AlertThresholds) -> list[AlertRule]:
    rep = 'job_model_n:inferctl_engine_output_repetition_ratio:avg_rate15m{n="4"}'
    degen = "job_model_prompt_len_bucket:inferctl_engine_degenerate_outputs:ratio_rate15m"
    ppl = "job_model:inferctl_engine_output_perplexity:avg_rate1h"
    drift = f"{ppl} / ({ppl} offset 1d > 0)"
    volume = q.rate_sum("inferctl_engine_outputs_total", ("job", "model", "prompt_len_bucket"), "15m", fn="increase")
    return [
        AlertRule(
            "InferctlOutputRepetitionHigh", f"{rep} > {t.repetition_ratio:g}", "15m", "warning",
            "Outputs of {{ $labels.model }} repeat themselves.",
            "Mean seq-rep-4 of the outputs of model {{ $labels.model }} (job {{ $labels.job }}) is "
            "{{ $value | humanizePercentage }} over the last 15 minutes, above "
            f"{t.repetition_ratio:.0%}: the model is looping."),
        AlertRule(
            "InferctlDegenerateOutputRateHigh",
            f"{degen} > {t.degenerate_ratio:g} and on (job, model, prompt_len_bucket) "
            f"({volume} >= {t.degenerate_min_outputs})",
            "15m", "warning",
            "Many degenerate outputs of {{ $labels.model }} for prompts of {{ $labels.prompt_len_bucket }} tokens.",
            "{{ $value | humanizePercentage }} of the outputs of model {{ $labels.model }} (job {{ $labels.job }}) "
            "for prompts in bucket {{ $labels.prompt_len_bucket }} were degenerate over the last 15 minutes, above "
            f"{t.degenerate_ratio:.0%}."),
        AlertRule(
            "InferctlPerplexityDrift",
            f"{drift} > {t.perplexity_drift_factor:g} or {drift} < {1 / t.perplexity_drift_factor:.4g}",
            "30m", "warning",
            "Perplexity of {{ $labels.model }} drifted from yesterday.",
            "Mean perplexity of the outputs of model {{ $labels.model }} (job {{ $labels.job }}) over the last hour "
            "is {{ $value | printf \"%.2f\" }} times the same hour a day before (alert outside "
            f"{1 / t.perplexity_drift_factor:.2f}..{t.perplexity_drift_factor:g})."),
    ]


def _availability_alerts() -> list[AlertRule]:
    return [
        AlertRule(
            "InferctlEngineDown", f'up{{job="{ENGINE_JOB}"}} == 0', "5m", "critical",
            "Engine {{ $labels.instance }} is down.",
            "Prometheus has failed to scrape engine {{ $labels.instance }} (job {{ $labels.job }}) "
            "for 5 minutes: the engine is not serving, or its /metrics is unreachable."),
        AlertRule(
            "InferctlEngineMetricsAbsent", f'absent(inferctl_engine_num_requests_running{{job="{ENGINE_JOB}"}})',
            "5m", "warning",
            "No engine metrics in Prometheus.",
            "No series inferctl_engine_num_requests_running with job {{ $labels.job }} has existed for 5 minutes: "
            "no engine target is scraped, or the engine stopped exposing its metrics. Every engine alert is blind."),
        AlertRule(
            "InferctlControllerDown", f'up{{job="{CONTROLLER_JOB}"}} == 0', "5m", "critical",
            "Controller {{ $labels.instance }} is down.",
            "Prometheus has failed to scrape controller {{ $labels.instance }} (job {{ $labels.job }}) "
            "for 5 minutes: nothing degrades on OOM, rolls back, restarts or resets GPUs."),
        AlertRule(
            "InferctlControllerMetricsAbsent", f'absent(up{{job="{CONTROLLER_JOB}"}})', "5m", "warning",
            "No controller target in Prometheus.",
            "Prometheus has had no scrape target with job {{ $labels.job }} for 5 minutes: the controller "
            "is not monitored (service discovery or scrape configuration)."),
    ]


def _control_plane_alerts(t: AlertThresholds) -> list[AlertRule]:
    overdue = (f"max by (job, engine) (inferctl_degraded_seconds) > max by (job, engine) "
               f"({t.rollback_overdue_factor:g} * inferctl_rollback_hold_seconds + {t.rollback_overdue_grace_seconds:g})")
    return [
        AlertRule(
            "InferctlEngineDegradedToInt8",
            'max by (job, engine) (inferctl_precision_mode{mode="int8"}) == 1', "1m", "critical",
            "Engine {{ $labels.engine }} is degraded to int8.",
            "Engine {{ $labels.engine }} (controller job {{ $labels.job }}) serves int8 weights after an "
            "out-of-memory fault: output quality is reduced until the controller rolls back to full precision."),
        AlertRule(
            "InferctlPrecisionFlapping",
            f'max by (job, engine) (changes(inferctl_precision_mode{{mode="int8"}}[{t.flap_window}])) >= {t.flap_changes}',
            "1m", "warning",
            "Engine {{ $labels.engine }} flaps between int8 and full precision.",
            "Engine {{ $labels.engine }} changed precision {{ $value }} times in the last "
            f"{t.flap_window} (threshold {t.flap_changes}): memory recovers and runs out again."),
        AlertRule(
            "InferctlRollbackOverdue", overdue, "10m", "warning",
            "Engine {{ $labels.engine }} has not rolled back to full precision.",
            "Engine {{ $labels.engine }} has served int8 for {{ $value | humanizeDuration }}, more than "
            f"{t.rollback_overdue_factor:g} times its rollback hold plus {t.rollback_overdue_grace_seconds:g}s: "
            "memory has not recovered, or the rollback is blocked."),
        AlertRule(
            "InferctlGpuMemoryFragmentationHigh",
            f"max by (job, engine) (inferctl_fragmentation_ratio) > {t.fragmentation_ratio:g}", "15m", "warning",
            "Allocator fragmentation of engine {{ $labels.engine }} is high.",
            "{{ $value | humanizePercentage }} of the memory reserved by engine {{ $labels.engine }}'s allocator "
            f"is unallocated (threshold {t.fragmentation_ratio:.0%}) for 15 minutes; the automatic drain and "
            "restart has not cleared it."),
        AlertRule(
            "InferctlLatencyBreakerOpen",
            'max by (job, engine) (inferctl_breaker_state{state="open"}) == 1', "5m", "warning",
            "Latency breaker of {{ $labels.engine }} is open.",
            "The latency breaker of engine {{ $labels.engine }} has been open for 5 minutes: requests go to "
            "the lightweight model because TTFT exceeded its budget."),
    ]


def _gpu_alerts(t: AlertThresholds) -> list[AlertRule]:
    # Critical: every Xid whose catalogue action is not "ignore" or "restart_engine" (the
    # controller's XidAction vocabulary: reset_gpu, reboot_node, unknown -> a person or a reset).
    xid = q.counter_increased("inferctl_gpu_xid_events_total", ("job", "gpu", "xid", "action"),
                              t.critical_xid_window, 'action!~"ignore|restart_engine"')
    reset = q.counter_increased("inferctl_gpu_resets_total", ("job", "gpu"), t.reset_failed_window,
                                'outcome="failed"')
    return [
        AlertRule(
            "InferctlGpuResetFailed", reset, "1m", "critical",
            "Reset of GPU {{ $labels.gpu }} failed.",
            "{{ $value | humanize }} reset(s) of GPU {{ $labels.gpu }} failed in the last " f"{t.reset_failed_window}: "
            "the GPU is still unhealthy and drained."),
        AlertRule(
            "InferctlGpuCriticalXid", xid, "1m", "critical",
            "GPU {{ $labels.gpu }} reported Xid {{ $labels.xid }}.",
            "GPU {{ $labels.gpu }} reported Xid {{ $labels.xid }} ({{ $value | humanize }} time(s) in the last "
            f"{t.critical_xid_window}); the Xid catalogue's action is {{{{ $labels.action }}}}."),
        AlertRule(
            "InferctlGpuLost", "max by (job, gpu, uuid) (inferctl_gpu_lost) == 1", "1m", "critical",
            "GPU {{ $labels.gpu }} is lost.",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) fell off the bus or NVML reports it lost: a reset "
            "cannot help, the node must be rebooted."),
        AlertRule(
            "InferctlGpuEccUncorrectable",
            'max by (job, gpu, uuid) (inferctl_gpu_ecc_errors{type="uncorrected"}) > 0', "1m", "critical",
            "GPU {{ $labels.gpu }} has uncorrectable ECC errors.",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) reports {{ $value }} volatile uncorrectable ECC "
            "error(s): its memory contents cannot be trusted."),
        AlertRule(
            "InferctlGpuTelemetryDown", "max by (job, source) (inferctl_gpu_telemetry_up) == 0", "5m", "warning",
            "GPU telemetry from {{ $labels.source }} is down.",
            "Every poll of GPU source {{ $labels.source }} (job {{ $labels.job }}) has failed for 5 minutes: "
            "GPU memory, Xid and ECC are unknown, and the hardware policy is blind."),
    ]


def _meta_alerts() -> list[AlertRule]:
    return [AlertRule(
        "Watchdog", "vector(1)", "1m", "none",
        "Always firing: proves the alerting pipeline works.",
        "This alert always fires. Alertmanager sends it to the heartbeat receiver every minute; when the "
        "heartbeats stop, Prometheus, Alertmanager or the path between them is broken.")]


def rule_groups(thresholds: AlertThresholds | None = None, for_override: str | None = None) -> list[RuleGroup]:
    """The rule groups in file order.

    Args:
        thresholds: alert thresholds (defaults: :class:`AlertThresholds`).
        for_override: replace every alert's ``for`` with this duration (e.g. ``"2s"``); only for
            the end-to-end test, which cannot wait minutes. The committed files never use it.
    """
    t = thresholds or AlertThresholds()
    groups = [
        RuleGroup("inferctl-engine.recording", tuple(recording_rules())),
        RuleGroup("inferctl-engine.alerts", tuple(_latency_alerts(t) + _quality_alerts(t) + _availability_alerts())),
        RuleGroup("inferctl-controller.alerts", tuple(_control_plane_alerts(t))),
        RuleGroup("inferctl-gpu.alerts", tuple(_gpu_alerts(t))),
        RuleGroup("inferctl-meta.alerts", tuple(_meta_alerts())),
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
