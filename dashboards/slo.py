"""Saturation and SLO rules (issue 10, items 9 and 10): generated like :mod:`dashboards.alerts`.

- **Saturation**: KV-cache usage and the request backlog per engine, aggregated with ``max``
  (never ``sum``: a summed ratio or queue of several engines says nothing about any one), with
  a long ``for:`` so a signal hovering at its threshold does not flap.
- **Histograms too low for the traffic**: ``histogram_quantile`` cannot go beyond the largest
  finite bucket — a quantile in the ``+Inf`` bucket comes back as that bound
  (https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile).
  The recording rule ``..._above_top_bucket:ratio_rate<w>`` is the share of observations above
  the largest finite bucket; where it exceeds ``1 - q`` the recorded ``q`` quantile is only a
  lower bound ("≥ top bucket"). A warning fires when that happens for the judged quantile, or
  when the mean observation lies above the largest finite bucket.
- **SLO burn rates**: multi-window, multi-burn-rate alerts (Google SRE workbook, "Alerting on
  SLOs", https://sre.google/workbook/alerting-on-slos/): an alert fires when the error rate over
  a long window *and* over a short window (1/12 of it) both exceed ``factor * (1 - objective)``.
  Availability SLI: failed requests (server errors: ``request_errors_total`` except
  ``invalid_request``) / finished requests. TTFT SLI: share of successful requests whose first
  token came after ``slo_ttft_seconds``, read from the TTFT histogram's bucket of that bound.

Objectives, factors, windows and thresholds come from
:class:`inferctl.contract.thresholds.Thresholds`.
"""

from __future__ import annotations

from inferctl.contract.thresholds import Thresholds
from inferctl.dashboards import promql as q
from inferctl.dashboards.catalog import metric_catalog
from inferctl.dashboards.rules import AlertRule, RecordingRule, spoken

#: The latency histograms whose bucket layout is watched (name -> words for the alert text).
WATCHED_HISTOGRAMS = {
    "inferctl_engine_e2e_request_latency_seconds": "end-to-end latency",
    "inferctl_engine_time_to_first_token_seconds": "time to first token",
    "inferctl_engine_inter_token_latency_seconds": "inter-token latency",
}
TTFT = "inferctl_engine_time_to_first_token_seconds"
_BY = ("job", "model")


def le_matcher(bound: float) -> str:
    """``le`` matcher for a bucket bound in either spelling: prometheus-client writes ``1.0``,
    Prometheus 3 normalises classic-histogram ``le`` values to ``1`` (``le=~"1|1.0"``)."""
    text = repr(float(bound))
    short = f"{float(bound):g}"
    return f'le=~"{short}|{text}"' if short != text else f'le="{text}"'


def top_finite_bucket(histogram: str) -> float:
    """The largest finite bucket bound of a catalog histogram. Raises ValueError when the
    catalog has no such histogram or it declares no buckets."""
    spec = metric_catalog().get(histogram)
    if spec is None or spec["type"] != "histogram" or not spec.get("buckets"):
        raise ValueError(f"{histogram}: not a catalog histogram with buckets")
    return max(float(b) for b in spec["buckets"])


def above_top_record(histogram: str, t: Thresholds) -> str:
    return f"job_model:{histogram}_above_top_bucket:ratio_rate{t.latency_rate_window}"


def error_ratio_record(window: str) -> str:
    return f"job_model:inferctl_engine_request_errors:ratio_rate{window}"


def ttft_slow_record(window: str) -> str:
    return f"job_model:{TTFT}_slow:ratio_rate{window}"


def slo_windows(t: Thresholds) -> list[str]:
    """Every window a burn-rate alert reads, long and short, without repeats, in order."""
    out: list[str] = []
    for _sev, _factor, long_w, short_w, _for in t.slo_burn_alerts:
        for w in (long_w, short_w):
            if w not in out:
                out.append(w)
    return out


def share_above(histogram: str, bound: float, window: str, labels: tuple[str, ...] = _BY) -> str:
    """Share of the observations of ``histogram`` over ``window`` above ``bound`` (a bucket
    bound), by ``labels``; no data without traffic. PromQL text."""
    count = q.rate_sum(f"{histogram}_count", labels, window)
    below = q.rate_sum(f"{histogram}_bucket", labels, window, le_matcher(bound))
    return f"({count} - {below}) / ({count} > 0)"


def saturated_quantile(qv: float, histogram: str, labels: tuple[str, ...], window: str) -> str:
    """The ``qv`` quantile, only where it is a lower bound ("≥ top bucket"): where more than
    ``1 - qv`` of the observations lie above the largest finite bucket, so
    ``histogram_quantile`` returned that bucket's bound. No data otherwise."""
    above = share_above(histogram, top_finite_bucket(histogram), window, labels)
    return f"{q.quantile(qv, histogram, labels, window)} and on ({', '.join(labels)}) ({above} > {1 - qv:g})"




def saturation_recordings(t: Thresholds) -> list[RecordingRule]:
    """Share above the top finite bucket per watched histogram, and the two SLIs per SLO window.

    Raises:
        ValueError: ``t.slo_ttft_seconds`` is not a bucket bound of the TTFT histogram (the
            SLI reads that bucket; any other bound would silently read nothing).
    """
    if float(t.slo_ttft_seconds) not in {float(b) for b in metric_catalog()[TTFT]["buckets"]}:
        raise ValueError(f"slo_ttft_seconds: {t.slo_ttft_seconds:g} is not a bucket bound of {TTFT}")
    rules = [RecordingRule(above_top_record(h, t), share_above(h, top_finite_bucket(h), t.latency_rate_window),
                           _BY) for h in WATCHED_HISTOGRAMS]
    for w in slo_windows(t):
        errors = q.rate_sum("inferctl_engine_request_errors_total", _BY, w, 'reason!="invalid_request"')
        rules.append(RecordingRule(error_ratio_record(w), q.ratio(
            errors, q.rate_sum("inferctl_engine_requests_total", _BY, w), zero_fill=True), _BY))
        rules.append(RecordingRule(ttft_slow_record(w), share_above(TTFT, t.slo_ttft_seconds, w), _BY))
    return rules


def _pct(v: float) -> str:
    return f"{v * 100:g} %"


def saturation_alerts(t: Thresholds) -> list[AlertRule]:
    eng = ("job", "instance")
    out = [
        AlertRule(
            "InferctlKvCacheUsageHigh",
            f"{q.gauge('inferctl_engine_kv_cache_usage_ratio', eng)} > {t.kv_cache_usage_ratio:g}",
            t.kv_cache_usage_for, "warning",
            "KV cache of engine {{ $labels.instance }} is nearly full.",
            "Engine {{ $labels.instance }} (job {{ $labels.job }}) has used {{ $value | humanizePercentage }} of "
            f"its KV-cache blocks for {spoken(t.kv_cache_usage_for)} (threshold {t.kv_cache_usage_ratio:.0%}): "
            "new sequences wait and running ones get preempted."),
        AlertRule(
            "InferctlRequestBacklogHigh",
            f"{q.gauge('inferctl_engine_num_requests_waiting', eng)} > {t.request_backlog:g}",
            t.request_backlog_for, "warning",
            "Engine {{ $labels.instance }} has a long request backlog.",
            "{{ $value }} requests have been waiting on engine {{ $labels.instance }} (job {{ $labels.job }}) for "
            f"{spoken(t.request_backlog_for)} (threshold {t.request_backlog}): the engine cannot keep up; "
            "TTFT grows with the queue."),
    ]
    for h, words in WATCHED_HISTOGRAMS.items():
        top = top_finite_bucket(h)
        mean = q.histogram_mean(h, _BY, t.latency_rate_window)
        out.append(AlertRule(
            "InferctlHistogramBucketsTooLow",
            f"{above_top_record(h, t)} > {1 - t.latency_quantile:g} or ({mean}) > {top:g}",
            t.histogram_saturated_for, "warning",
            f"The {words} histogram's buckets are too low for {{{{ $labels.model }}}}.",
            f"More than {_pct(1 - t.latency_quantile)} of the {words} observations of model "
            f"{{{{ $labels.model }}}} (job {{{{ $labels.job }}}}) lie above the largest finite bucket ({top:g}s), "
            f"or their mean does, over the last {spoken(t.latency_rate_window)}: the recorded "
            f"P{t.latency_quantile * 100:g} is only a lower bound (≥ {top:g}s). Add larger buckets to {h}.",
            (("histogram", h),)))
    return out


def slo_alerts(t: Thresholds) -> list[AlertRule]:
    out = []
    for sli, objective, record, what in (
            ("InferctlErrorBudgetBurn", t.slo_availability_objective, error_ratio_record,
             "of the requests failed"),
            ("InferctlTtftBudgetBurn", t.slo_ttft_objective, ttft_slow_record,
             f"of the successful requests got their first token after {t.slo_ttft_seconds:g}s")):
        budget = 1 - objective
        for sev, factor, long_w, short_w, for_ in t.slo_burn_alerts:
            limit = float(f"{factor * budget:.6g}")
            out.append(AlertRule(
                sli, f"{record(long_w)} > {limit:g} and {record(short_w)} > {limit:g}", for_, sev,
                f"{{{{ $labels.model }}}} burns its {_pct(objective)} SLO budget {factor:g}x too fast.",
                f"Model {{{{ $labels.model }}}} (job {{{{ $labels.job }}}}): {{{{ $value | humanizePercentage }}}} "
                f"{what} over the last {spoken(long_w)}, and over the last {spoken(short_w)} too: "
                f"{factor:g} times the error budget of the {_pct(objective)} objective over {t.slo_window}.",
                (("long_window", long_w), ("short_window", short_w))))
    return out
