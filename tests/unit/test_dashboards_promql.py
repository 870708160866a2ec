"""The PromQL lint that guards dashboards and rules, and the expression builders (F04, F05)."""

from __future__ import annotations

import pytest

from inferctl.dashboards import promql as q
from inferctl.dashboards.catalog import exposed_series, gauge_names, metric_catalog, scraped_label
from inferctl.dashboards.promql_lint import PromQLSyntaxError, analyze, check_expression

SERIES = exposed_series()
GAUGES = gauge_names()


def problems(expr: str, recorded: dict | None = None) -> list[str]:
    return check_expression(expr, SERIES, recorded or {}, GAUGES)


def test_catalog_merges_both_sides_and_expands_histograms():
    cat = metric_catalog()
    assert cat["inferctl_engine_kv_cache_usage_ratio"]["side"] == "engine"
    assert cat["inferctl_fragmentation_ratio"]["side"] == "controller"
    hist = "inferctl_engine_time_to_first_token_seconds"
    assert {f"{hist}_bucket", f"{hist}_sum", f"{hist}_count"} <= set(SERIES)
    assert hist not in SERIES                        # a histogram has no bare series
    assert "le" in SERIES[f"{hist}_bucket"].labels and "le" not in SERIES[f"{hist}_count"].labels
    assert {"job", "instance", "model"} <= SERIES[f"{hist}_count"].labels
    assert SERIES["up"].labels == frozenset({"job", "instance"})


def test_no_catalog_label_collides_with_target_labels():
    # A catalog label named job or instance would be renamed exported_* by Prometheus.
    assert scraped_label("poller") == "poller" and scraped_label("engine") == "engine"
    labels = SERIES["inferctl_poll_duration_seconds_count"].labels
    assert labels == frozenset({"poller", "job", "instance"})


def test_selectors_grouping_and_enclosing_calls():
    a = analyze('histogram_quantile(0.9, sum by (model, le) (rate(x_bucket{job="a", le!="1"}[5m]))) '
                'and on (model) (sum by (model) (rate(x_count[$__rate_interval])) > 0)')
    names = [(s.name, s.enclosing[:2]) for s in a.selectors]
    assert names == [("x_bucket", ("rate", "sum")), ("x_count", ("rate", "sum"))]
    assert a.selectors[0].matchers == (("job", "=", "a"), ("le", "!=", "1"))
    assert a.grouping_labels == {"model", "le"}
    assert a.divisions == []


def test_keywords_numbers_offsets_and_strings_are_not_metrics():
    a = analyze('sum without (instance) (x offset 1d) / 2 > bool 3 or absent(up{job="a b(c)"}) unless vector(1)')
    assert [s.name for s in a.selectors] == ["x", "up"]
    assert a.selectors[1].matchers == (("job", "=", "a b(c)"),)
    assert a.divisions == [(a.divisions[0][0], True)]     # division by the constant 2


def test_grafana_variables_after_offset_are_durations():
    a = analyze("x unless x offset $__rate_interval")
    assert [s.name for s in a.selectors] == ["x", "x"]


@pytest.mark.parametrize("expr", ["rate(x[5m]", "x{job=\"a}", "x @ 5", "x offset $"])
def test_bad_syntax_is_reported(expr):
    with pytest.raises(PromQLSyntaxError):
        analyze(expr)
    assert problems(expr)


def test_unknown_metric_label_and_grouping_are_flagged():
    assert any("not in the metric catalog" in p for p in problems("rate(inferctl_engine_bogus_total[5m])"))
    assert any("label 'gpu'" in p for p in problems('inferctl_engine_kv_cache_usage_ratio{gpu="0"}'))
    assert any("grouping label 'gpu'" in p for p in problems("max by (gpu) (inferctl_engine_kv_cache_usage_ratio)"))
    assert problems("max by (instance) (inferctl_engine_kv_cache_usage_ratio)") == []


def test_recorded_series_are_known_only_when_declared():
    rec = {"job_model:x:rate5m": frozenset({"job", "model"})}
    assert problems('job_model:x:rate5m{model="a"} > 1', rec) == []
    assert any("not in the metric catalog" in p for p in problems("job_model:x:rate5m > 1"))


def test_sum_over_a_gauge_is_flagged_but_max_and_counter_sums_are_not():
    assert any("aggregated with sum" in p for p in problems("sum by (job) (inferctl_engine_kv_cache_usage_ratio)"))
    assert problems("max by (job) (inferctl_engine_kv_cache_usage_ratio)") == []
    assert problems("sum by (job) (rate(inferctl_engine_steps_total[5m]))") == []
    with pytest.raises(ValueError, match="max, min or avg"):
        q.gauge("inferctl_engine_kv_cache_usage_ratio", ("job",), how="sum")


def test_unguarded_denominators_are_flagged():
    raw = ("sum(rate(inferctl_engine_step_padded_tokens_total[5m])) / "
           "sum(rate(inferctl_engine_step_real_tokens_total[5m]))")
    assert any("unguarded denominator" in p for p in problems(raw))
    clamp = ("sum(rate(inferctl_engine_step_padded_tokens_total[5m])) / "
             "clamp_min(sum(rate(inferctl_engine_step_real_tokens_total[5m])), 1)")
    assert any("unguarded denominator" in p for p in problems(clamp))
    assert any("unguarded denominator" in p for p in problems("up / 0"))
    guarded = q.ratio("sum(rate(inferctl_engine_step_padded_tokens_total[5m]))",
                      "sum(rate(inferctl_engine_step_real_tokens_total[5m]))")
    assert problems(guarded) == []


def test_ratio_builder_aggregates_then_divides_with_guard():
    assert q.ratio("A", "B") == "(A) / (B > 0)"
    assert q.ratio("A", "B", zero_fill=True) == "(A or B * 0) / (B > 0)"


def test_quantile_builder_drops_groups_without_traffic():
    expr = q.quantile(0.99, "h", ("model",), "5m")
    assert expr == ("histogram_quantile(0.99, sum by (model, le) (rate(h_bucket[5m]))) "
                    "and on (model) (sum by (model) (rate(h_count[5m])) > 0)")
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="quantile must lie in"):
            q.quantile(bad, "h", ("model",), "5m")


def test_window_increase_counts_a_series_born_inside_the_window():
    sel = 'c_total{outcome="failed"}'
    assert q.window_increase("c_total", ("gpu",), "30m", 'outcome="failed"') == (
        f"sum by (gpu) ((increase({sel}[30m]) and {sel} offset 30m) or ({sel} unless {sel} offset 30m))")
    assert q.counter_increased("c_total", ("gpu",), "30m").endswith(" > 0")


def test_gauge_builder_drops_nan_and_negative_readings():
    assert q.gauge("inferctl_engine_kv_cache_waste_ratio", ("job",)) == (
        "max by (job) (inferctl_engine_kv_cache_waste_ratio >= 0)")
