"""The one configuration of thresholds, windows and scrape job names.

Read by the alert generator (``dashboards/alerts.py``), the dashboard generator
(``dashboards/build.py``), the controller's policy defaults (``controller/policies/``) and the
engine's degeneration rule, so that each number exists once: change it here, then run
``inferctl dashboards build`` to regenerate ``alerts/*.yaml`` and ``dashboards/*.json``.

Conventions:

- ``*_seconds`` fields are floats in seconds; ``*_ratio`` fields are fractions in [0, 1].
- ``*_window``, ``*_for`` and ``*_offset`` fields are Prometheus duration strings
  (``"5m"``, ``"1h30m"``; https://prometheus.io/docs/prometheus/latest/querying/basics/#time-durations):
  a ``*_window`` is the range of a ``rate()``/``increase()``, a ``*_for`` the ``for:`` of an
  alerting rule (https://prometheus.io/docs/prometheus/latest/configuration/alerting_rules/).
- Sources of the defaults are on each field; "operator default" means no external source:
  tune it per deployment. See ``docs/observability.md`` (alerts) and ``docs/design.md``
  (the latency budget, the fragmentation restart, the degeneration rule).

Use :data:`THRESHOLDS` (the defaults) or build a variant with ``dataclasses.replace``; the
instance is frozen (a constant, not state).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


def duration_seconds(text: str, name: str = "duration") -> float:
    """Seconds in a Prometheus duration string (``"1h30m"`` -> 5400.0).

    Raises:
        ValueError: ``text`` is not a Prometheus duration (the message names ``name``).
    """
    if not isinstance(text, str) or not _DURATION.match(text):
        raise ValueError(f"{name}: {text!r} is not a Prometheus duration such as '5m' or '1h30m'")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text))


@dataclass(frozen=True)
class Thresholds:
    """Thresholds, windows and job names shared by policies, alerts and dashboards.

    Raises:
        ValueError: (at construction) a ratio outside [0, 1], a non-positive number of
            seconds or count, a quantile outside (0, 1), a malformed duration, or a critical
            latency threshold below its warning one; the message names the field.
    """

    # --- scrape targets and links -------------------------------------------------------
    #: Prometheus ``job`` of the engines' /metrics (rules select ``up{job=...}`` with it).
    engine_job: str = "inferctl-engine"
    #: Prometheus ``job`` of the controller's /metrics.
    controller_job: str = "inferctl-controller"
    #: Prometheus ``job`` of the router's /metrics (deploy/kubernetes/base/monitoring.yaml).
    router_job: str = "inferctl-router"
    #: Prefix of every alert's ``runbook_url`` (``<base><AlertName>.md``; ends with "/").
    runbook_base_url: str = "https://github.com/inferctl/inferctl/blob/main/runbooks/"

    # --- latency ------------------------------------------------------------------------
    #: TTFT budget, seconds. Source: the design's 500 ms time-to-first-token budget. Read by
    #: the latency breaker (``ttft_threshold_seconds``), the TTFT P99 warning alert and the
    #: red line of the Service dashboard's TTFT panel.
    ttft_seconds: float = 0.5
    #: TTFT P99 above which the TTFT alert pages, seconds (operator default).
    ttft_critical_seconds: float = 2.0
    #: End-to-end P99 warning / critical, seconds (operator defaults).
    e2e_warning_seconds: float = 10.0
    e2e_critical_seconds: float = 30.0
    #: The quantile that latency is judged on (the breaker and the latency alerts): P99.
    latency_quantile: float = 0.99
    #: Quantiles recorded by the rules and charted by the Service dashboard.
    latency_quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)
    #: ``rate()`` window of the recorded latency quantiles.
    latency_rate_window: str = "5m"
    #: ``for:`` of the latency warning and critical alerts.
    latency_warning_for: str = "10m"
    latency_critical_for: str = "5m"

    # --- memory, precision, breaker -----------------------------------------------------
    #: Allocator fragmentation (reserved-but-unallocated / reserved) above which the
    #: controller drains and restarts an engine. Source: the design's "restart when
    #: fragmentation passes 30 %". Read by the fragmentation policy (``threshold_ratio``),
    #: its alert and the GPU dashboard's red line.
    fragmentation_ratio: float = 0.30
    #: ``for:`` of the fragmentation alert (the automatic restart had time to clear it).
    fragmentation_for: str = "15m"
    #: Precision changes (int8 <-> full) within ``flap_window`` that count as flapping:
    #: 4 = two round trips (operator default).
    flap_changes: int = 4
    flap_window: str = "1h"
    flapping_for: str = "1m"
    #: ``for:`` of the "degraded to int8" alert.
    degraded_for: str = "1m"
    #: A degradation is overdue when it lasts longer than ``factor * hold + grace`` seconds,
    #: the hold being the precision policy's current rollback hold (operator defaults).
    rollback_overdue_factor: float = 2.0
    rollback_overdue_grace_seconds: float = 600.0
    rollback_overdue_for: str = "10m"
    #: ``for:`` of the "latency breaker open" alert.
    breaker_open_for: str = "5m"
    #: ``for:`` of the "event log unwritable" alert: events wait in the controller's memory
    #: that long (the buffer is flushed every few seconds once the disk has room).
    event_log_unwritable_for: str = "2m"

    # --- output quality -----------------------------------------------------------------
    #: The degeneration rule: an output of at least ``degenerate_min_tokens`` tokens is
    #: degenerate when seq-rep-``degenerate_ngram`` >= ``degenerate_seq_rep_threshold``.
    #: Source: Welleck et al. 2019 (seq-rep-4 of human text ~0.006, greedy GPT-2 ~0.44), see
    #: docs/field-cases.md. The repetition alert reads the same n (``seq-rep-4``).
    degenerate_ngram: int = 4
    degenerate_seq_rep_threshold: float = 0.5
    degenerate_min_tokens: int = 8
    #: Mean seq-rep-n of outputs over ``quality_rate_window`` above which the repetition
    #: alert fires (operator default).
    repetition_ratio: float = 0.5
    #: Fraction of degenerate outputs per prompt-length bucket over ``quality_rate_window``
    #: above which the degenerate-rate alert fires, given at least ``degenerate_min_outputs``
    #: outputs in the window (operator defaults).
    degenerate_ratio: float = 0.2
    degenerate_min_outputs: int = 10
    #: Mean perplexity over ``perplexity_window`` vs the same window ``perplexity_baseline_offset``
    #: earlier: alert outside [1/factor, factor] (operator default).
    perplexity_drift_factor: float = 1.5
    quality_rate_window: str = "15m"
    perplexity_window: str = "1h"
    perplexity_baseline_offset: str = "1d"
    repetition_for: str = "15m"
    degenerate_for: str = "15m"
    perplexity_drift_for: str = "30m"
    #: Speculative decoding (engine --speculative-config): the acceptance rate (accepted / draft
    #: tokens over ``spec_acceptance_window``) below which draft and target are said to disagree,
    #: given at least ``spec_acceptance_min_draft_tokens`` draft tokens in the window. Measured on
    #: stories260K (docs/speculative-decoding.md): int8_self accepts ~0.97, ngram ~0.18 on free
    #: stories and more on text that repeats its prompt; 0.05 is far below both (operator default).
    spec_acceptance_min_ratio: float = 0.05
    spec_acceptance_min_draft_tokens: int = 100
    spec_acceptance_window: str = "15m"
    spec_acceptance_for: str = "15m"

    # --- availability -------------------------------------------------------------------
    #: ``for:`` of the ``up == 0`` and ``absent(...)`` alerts of engine and controller.
    down_for: str = "5m"
    #: ``for:`` of the "GPU telemetry down" alert.
    telemetry_down_for: str = "5m"

    # --- GPU hardware -------------------------------------------------------------------
    #: Window in which a critical Xid / a failed GPU reset keeps its alert firing.
    critical_xid_window: str = "15m"
    reset_failed_window: str = "30m"
    #: ``for:`` of the hardware alerts (reset failed, critical Xid, GPU lost, ECC).
    gpu_fault_for: str = "1m"

    # --- decisions under real faults (issue 10: items 1, 2, 12) ---------------------------
    #: Automatic precision switches (degrades + rollbacks together) allowed per engine within
    #: ``precision_switch_window_seconds``: a rollback that would leave no room for the degrade
    #: a relapse needs is deferred, so the count never exceeds the cap (operator default: two
    #: round trips in ten minutes; docs/policies.md "No ping-pong").
    precision_max_switches: int = 4
    precision_switch_window_seconds: float = 600.0
    #: Relapses of one prompt-size class (an OOM of the same class within the relapse window of
    #: a rollback) after which int8 is pinned until an operator unpins (operator default).
    precision_pin_after_class_relapses: int = 2
    #: Correctable (single-bit) ECC errors per second over ``ecc_correctable_window_seconds``
    #: that make a correctable-error storm warning (never critical, never a reset). NVIDIA:
    #: correctable errors are corrected in hardware; a high rate is a service hint (operator
    #: default: 60 errors in ten minutes).
    ecc_correctable_storm_per_second: float = 0.1
    ecc_correctable_window_seconds: float = 600.0
    #: Automation paused (``inferctl pause``) longer than this fires AutomationPausedTooLong
    #: (operator default: half a working day), with its ``for:``.
    automation_paused_max_seconds: float = 14400.0
    automation_paused_for: str = "5m"

    # --- router (issue 9) ---------------------------------------------------------------
    #: ``for:`` of "no ready replica" (the router answers 503 to every request meanwhile).
    router_no_ready_for: str = "1m"
    #: Retries / requests over ``router_retry_window`` above which the retry-storm warning
    #: fires (operator default: one request in ten needs a second attempt), with its ``for:``.
    router_retry_ratio: float = 0.1
    router_retry_window: str = "5m"
    router_retry_for: str = "10m"
    #: One replica's share of the router's requests over ``router_imbalance_window`` above
    #: which the imbalance warning fires, only with at least ``router_imbalance_min_replicas``
    #: replicas ready (with one or two, a large share is normal). Operator defaults.
    router_imbalance_ratio: float = 0.8
    router_imbalance_min_replicas: int = 3
    #: ... and at least this many requests in the window (a trickle lands anywhere).
    router_imbalance_min_requests: int = 100
    router_imbalance_window: str = "15m"
    router_imbalance_for: str = "15m"

    # --- saturation and SLOs (issue 10: items 9, 10) -------------------------------------
    #: KV-cache usage (max over an engine's series, never a sum) above which the saturation
    #: warning fires; its ``for:`` is long so a signal hovering at the threshold does not flap
    #: (operator defaults; vLLM preempts as usage nears 1).
    kv_cache_usage_ratio: float = 0.9
    kv_cache_usage_for: str = "15m"
    #: Requests waiting (max per engine) above which the backlog warning fires, with its ``for:``.
    request_backlog: int = 32
    request_backlog_for: str = "15m"
    #: ``for:`` of the "histogram buckets too low" warning (quantiles in +Inf, or the mean above
    #: the top finite bucket), over ``latency_rate_window``.
    histogram_saturated_for: str = "30m"
    #: SLO objectives over ``slo_window`` (defaults from issue 10): 99.9 % of finished requests
    #: succeed; 99 % of successful requests get their first token within ``slo_ttft_seconds``
    #: (must be a bucket bound of the TTFT histogram: the SLI reads its ``le`` bucket).
    slo_availability_objective: float = 0.999
    slo_ttft_objective: float = 0.99
    slo_ttft_seconds: float = 1.0
    slo_window: str = "30d"
    #: Multi-window, multi-burn-rate alerts: (severity, burn-rate factor, long window, short
    #: window, ``for:``). Source: Google SRE workbook, "Alerting on SLOs", recommendation
    #: table (2 % of a 30-day budget in 1 h pages, 5 % in 6 h pages, 10 % in 3 d tickets).
    slo_burn_alerts: tuple[tuple[str, float, str, str, str], ...] = (
        ("critical", 14.4, "1h", "5m", "2m"),
        ("critical", 6.0, "6h", "30m", "15m"),
        ("warning", 1.0, "3d", "6h", "1h"),
    )

    # --- meta ---------------------------------------------------------------------------
    #: ``for:`` of the always-firing ``Watchdog``.
    watchdog_for: str = "1m"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith(("_window", "_for", "_offset")):
                duration_seconds(value, f.name)
            elif f.name.endswith("_ratio"):
                _check_number(f.name, value, 0.0, 1.0, strict_min=False)
            elif f.name.endswith(("_seconds", "_factor")) or f.name in ("flap_changes", "degenerate_ngram",
                                                                         "degenerate_min_outputs"):
                _check_number(f.name, value, 0.0, None, strict_min=True)
        _check_number("degenerate_seq_rep_threshold", self.degenerate_seq_rep_threshold, 0.0, 1.0, strict_min=False)
        _check_number("degenerate_min_tokens", self.degenerate_min_tokens, 0.0, None, strict_min=False)
        quantiles = [("latency_quantile", self.latency_quantile)]
        quantiles += [("latency_quantiles", v) for v in self.latency_quantiles]
        for name, q in quantiles:
            if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q < 1.0:
                raise ValueError(f"{name}: quantile must lie in (0, 1), got {q!r}")
        if self.ttft_critical_seconds < self.ttft_seconds:
            raise ValueError(f"ttft_critical_seconds: {self.ttft_critical_seconds:g} is below "
                             f"ttft_seconds {self.ttft_seconds:g}")
        if self.e2e_critical_seconds < self.e2e_warning_seconds:
            raise ValueError(f"e2e_critical_seconds: {self.e2e_critical_seconds:g} is below "
                             f"e2e_warning_seconds {self.e2e_warning_seconds:g}")
        for name in ("precision_max_switches", "precision_pin_after_class_relapses",
                     "ecc_correctable_storm_per_second"):
            _check_number(name, getattr(self, name), 0.0, None, strict_min=True)
        for name in ("slo_availability_objective", "slo_ttft_objective"):
            _check_number(name, getattr(self, name), 0.0, 1.0, strict_min=True)
            if getattr(self, name) >= 1.0:
                raise ValueError(f"{name}: must be < 1 (an objective of 100 % leaves no error budget)")
        for name in ("router_imbalance_min_replicas", "router_imbalance_min_requests", "request_backlog"):
            _check_number(name, getattr(self, name), 0.0, None, strict_min=True)
        for i, burn in enumerate(self.slo_burn_alerts):
            if len(burn) != 5 or burn[0] not in ("critical", "warning"):
                raise ValueError(f"slo_burn_alerts[{i}]: want (severity critical|warning, factor, long window, "
                                 f"short window, for), got {burn!r}")
            _check_number(f"slo_burn_alerts[{i}] factor", burn[1], 0.0, None, strict_min=True)
            for d in burn[2:]:
                duration_seconds(d, f"slo_burn_alerts[{i}]")
            if duration_seconds(burn[3]) >= duration_seconds(burn[2]):
                raise ValueError(f"slo_burn_alerts[{i}]: short window {burn[3]} must be shorter than {burn[2]}")
        for name in ("engine_job", "controller_job", "router_job"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name}: must be a non-empty string")
        if not self.runbook_base_url.endswith("/"):
            raise ValueError(f"runbook_base_url: must end with '/', got {self.runbook_base_url!r}")


def _check_number(name: str, value: object, minimum: float, maximum: float | None, strict_min: bool) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a real number in range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{name}: must be a number, got {value!r}")
    if value < minimum or (strict_min and value == minimum) or (maximum is not None and value > maximum):
        bound = f"> {minimum:g}" if strict_min else f">= {minimum:g}"
        upper = f" and <= {maximum:g}" if maximum is not None else ""
        raise ValueError(f"{name}: must be {bound}{upper}, got {value!r}")


#: The defaults: what the policies, the committed alerts and the committed dashboards use.
THRESHOLDS = Thresholds()
