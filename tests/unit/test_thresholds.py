"""contract/thresholds.py: validation, and one number in one place — the alert rules, the
dashboards and the policy / quality defaults all follow it."""

from __future__ import annotations

import dataclasses
import re

import pytest

from inferctl.contract.thresholds import THRESHOLDS, Thresholds, duration_seconds
from inferctl.dashboards.alerts import alert_rules, recorded_series, rule_groups, spoken
from inferctl.dashboards.build import dashboard_specs


def test_duration_seconds():
    assert duration_seconds("5m") == 300.0
    assert duration_seconds("1h30m") == 5400.0
    assert duration_seconds("250ms") == 0.25
    with pytest.raises(ValueError, match="flap_window"):
        duration_seconds("1 h", "flap_window")


@pytest.mark.parametrize("field, value", [
    ("fragmentation_ratio", 1.5), ("fragmentation_ratio", -0.1), ("ttft_seconds", 0.0),
    ("down_for", "five minutes"), ("latency_quantile", 1.0), ("latency_quantiles", (0.5, 0.0)),
    ("degenerate_seq_rep_threshold", 2.0), ("flap_changes", 0), ("ttft_critical_seconds", 0.1),
    ("runbook_base_url", "https://example.org/runbooks"), ("engine_job", ""),
])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        Thresholds(**{field: value})


def test_defaults_are_the_documented_numbers():
    t = THRESHOLDS
    assert (t.ttft_seconds, t.fragmentation_ratio, t.degenerate_seq_rep_threshold) == (0.5, 0.30, 0.5)
    assert (t.engine_job, t.controller_job) == ("inferctl-engine", "inferctl-controller")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.ttft_seconds = 1.0  # type: ignore[misc]


def test_policy_and_quality_defaults_equal_the_shared_config():
    from inferctl.contract import quality
    from inferctl.controller.policies.breaker import BreakerConfig
    from inferctl.controller.policies.fragmentation import FragmentationConfig

    breaker = BreakerConfig(light_model="light")
    assert breaker.ttft_threshold_seconds == THRESHOLDS.ttft_seconds
    assert breaker.quantile == THRESHOLDS.latency_quantile
    assert FragmentationConfig().threshold_ratio == THRESHOLDS.fragmentation_ratio
    assert quality.DEGENERATE_THRESHOLD == THRESHOLDS.degenerate_seq_rep_threshold
    assert quality.DEGENERATE_NGRAM == THRESHOLDS.degenerate_ngram
    assert quality.DEGENERATE_MIN_TOKENS == THRESHOLDS.degenerate_min_tokens


def test_a_changed_number_reaches_alerts_and_dashboards():
    t = dataclasses.replace(THRESHOLDS, ttft_seconds=0.75, fragmentation_ratio=0.4, latency_rate_window="2m",
                            down_for="3m", engine_job="llm")
    rules = {(r.name, r.severity): r for r in alert_rules(rule_groups(t))}
    ttft = rules[("InferctlHighTimeToFirstToken", "warning")]
    assert ttft.expr.endswith("> 0.75") and "histogram_quantile_rate2m" in ttft.expr
    assert "over the last 2 minutes" in ttft.description
    assert rules[("InferctlGpuMemoryFragmentationHigh", "warning")].expr.endswith("> 0.4")
    down = rules[("InferctlEngineDown", "critical")]
    assert down.expr == 'up{job="llm"} == 0' and down.for_ == "3m" and "for 3 minutes" in down.description
    assert all("rate2m" in name for name in recorded_series(t) if "quantile" in name)

    lines = {p.title: p.threshold for d in dashboard_specs(t) for _row, panels in d.rows for p in panels}
    assert lines["Time to first token P50 / P90 / P99"] == 0.75
    assert lines["Allocator fragmentation"] == 0.4


def test_spoken_durations():
    assert spoken("5m") == "5 minutes"
    assert spoken("1h") == "hour"
    assert spoken("1d", one="a ") == "a day"
    assert spoken("1h", one="a ") == "an hour"
    assert spoken("1h30m") == "1h30m"


def test_slo_defaults_are_the_issue_numbers_and_the_workbook_table():
    t = THRESHOLDS
    assert (t.slo_availability_objective, t.slo_ttft_objective, t.slo_ttft_seconds, t.slo_window) == (
        0.999, 0.99, 1.0, "30d")
    assert [(sev, f, lw, sw) for sev, f, lw, sw, _for in t.slo_burn_alerts] == [
        ("critical", 14.4, "1h", "5m"), ("critical", 6.0, "6h", "30m"), ("warning", 1.0, "3d", "6h")]
    assert t.router_job == "inferctl-router"


@pytest.mark.parametrize("field, value, needle", [
    ("slo_availability_objective", 1.0, "slo_availability_objective"),
    ("slo_ttft_objective", 0.0, "slo_ttft_objective"),
    ("slo_burn_alerts", (("critical", 14.4, "5m", "1h", "2m"),), "short window"),
    ("slo_burn_alerts", (("page", 14.4, "1h", "5m", "2m"),), "slo_burn_alerts[0]"),
    ("router_imbalance_min_replicas", 0, "router_imbalance_min_replicas"),
    ("router_job", "", "router_job"),
])
def test_invalid_slo_and_router_values_name_the_field(field, value, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        dataclasses.replace(THRESHOLDS, **{field: value})


def test_slo_objective_and_bucket_reach_the_burn_rules():
    from inferctl.dashboards.slo import le_matcher, top_finite_bucket
    t = dataclasses.replace(THRESHOLDS, slo_availability_objective=0.99, slo_ttft_seconds=0.5)
    burn = [r for r in alert_rules(rule_groups(t)) if r.name == "InferctlErrorBudgetBurn"]
    assert [r.expr.split(" > ")[1].split(" ")[0] for r in burn] == ["0.144", "0.06", "0.01"]
    slow = [r.expr for g in rule_groups(t) for r in g.rules
            if getattr(r, "record", "").endswith("_slow:ratio_rate5m")]
    assert len(slow) == 1 and 'le=~"0.5|0.5"' not in slow[0] and 'le="0.5"' in slow[0]
    assert le_matcher(1.0) == 'le=~"1|1.0"' and le_matcher(0.25) == 'le="0.25"'
    assert top_finite_bucket("inferctl_engine_e2e_request_latency_seconds") == 600.0
    with pytest.raises(ValueError, match="slo_ttft_seconds: 0.7 is not a bucket bound"):
        rule_groups(dataclasses.replace(THRESHOLDS, slo_ttft_seconds=0.7))
