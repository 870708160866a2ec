"""Generated Prometheus rules and Alertmanager config: conventions, promtool, amtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from inferctl.dashboards.alertmanager import alertmanager_config
from inferctl.dashboards.alerts import (DEFAULT_RUNBOOK_BASE_URL, AlertRule, alert_rules, recorded_series, rule_groups,
                               rules_document)
from inferctl.dashboards.catalog import ENGINE_JOB, exposed_series, gauge_names
from inferctl.dashboards.generate import dump_yaml
from inferctl.dashboards.promql_lint import analyze, check_expression

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "inferctl.rules.yaml"
PROMRULE = ROOT / "alerts" / "prometheusrule.yaml"
AMCONFIG = ROOT / "alerts" / "alertmanager.yml"
UNIT_TESTS = sorted((ROOT / "alerts" / "tests").glob("*.yaml"))
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")

# The list, by the names we gave them (severity in parentheses where it is prescribed).
REQUIRED = {
    "InferctlHighP99Latency": None, "InferctlHighTimeToFirstToken": None,
    "InferctlGpuMemoryFragmentationHigh": None, "InferctlEngineDegradedToInt8": "critical",
    "InferctlPrecisionFlapping": None, "InferctlRollbackOverdue": None, "InferctlGpuResetFailed": None,
    "InferctlGpuCriticalXid": None, "InferctlGpuLost": None, "InferctlGpuEccUncorrectable": None,
    "InferctlGpuTelemetryDown": None, "InferctlOutputRepetitionHigh": None,
    "InferctlDegenerateOutputRateHigh": None, "InferctlPerplexityDrift": None, "InferctlEngineDown": None,
    "InferctlEngineMetricsAbsent": None, "InferctlControllerDown": None, "Watchdog": None,
}


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} not installed "
                    "(the Debian prometheus / prometheus-alertmanager packages; .ci/run installs them)")
    return path


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def committed_rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_required_alerts_exist_with_prescribed_severity():
    by_name: dict[str, set[str]] = {}
    for r in alert_rules():
        by_name.setdefault(r.name, set()).add(r.severity)
    for name, sev in REQUIRED.items():
        assert name in by_name, name
        if sev is not None:
            assert by_name[name] == {sev}, name
    assert by_name["Watchdog"] == {"none"}
    assert by_name["InferctlHighP99Latency"] == {"warning", "critical"}


def test_every_alert_follows_the_conventions(committed_rules):
    alerts = [r for r in committed_rules if "alert" in r]
    assert len(alerts) >= 20
    for r in alerts:
        name = r["alert"]
        assert re.fullmatch(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*", name), name
        assert r.get("for") and DURATION.match(r["for"]), name
        sev = r["labels"]["severity"]
        assert sev in ("critical", "warning") or (name == "Watchdog" and sev == "none"), name
        ann = r["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}, name
        assert ann["summary"].strip() and ann["description"].strip(), name
        assert "$value" in ann["description"] or "$labels" in ann["description"] or name == "Watchdog", name
        assert ann["runbook_url"] == f"{DEFAULT_RUNBOOK_BASE_URL}{name}.md"


def test_recording_rules_are_level_metric_operations(committed_rules):
    records = [r["record"] for r in committed_rules if "record" in r]
    assert len(records) >= 10
    for name in records:
        assert re.fullmatch(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*", name), name


def test_every_rule_expression_names_only_catalog_or_recorded_series(committed_rules):
    series, gauges, recorded = exposed_series(), gauge_names(), recorded_series()
    bad = []
    for r in committed_rules:
        bad += [f"{r.get('alert') or r.get('record')}: {p}"
                for p in check_expression(r["expr"], series, recorded, gauges)]
    assert bad == []
    # and the lint is not vacuous on this file: a renamed metric is caught
    assert check_expression(committed_rules[0]["expr"].replace("_bucket", "_buckets"), series, recorded, gauges)


def test_f07_down_and_absent_rules_carry_only_equality_matchers():
    rules = {r.name: r for r in alert_rules()}
    assert rules["InferctlEngineDown"].expr == f'up{{job="{ENGINE_JOB}"}} == 0'
    absent = analyze(rules["InferctlEngineMetricsAbsent"].expr)
    assert rules["InferctlEngineMetricsAbsent"].expr.startswith("absent(")
    assert [m[1] for s in absent.selectors for m in s.matchers] == ["="]


def test_prometheusrule_carries_the_same_groups():
    obj = yaml.safe_load(PROMRULE.read_text())
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "PrometheusRule"
    assert obj["metadata"]["name"] == "inferctl"
    assert obj["spec"] == yaml.safe_load(RULES.read_text())


def test_for_override_changes_only_alert_durations():
    fast = rule_groups(for_override="2s")
    slow = rule_groups()
    assert [r.for_ for r in alert_rules(fast)] == ["2s"] * len(alert_rules(slow))
    assert len({r.for_ for r in alert_rules(slow)}) > 2
    assert rules_document(fast)["groups"][0] == rules_document(slow)["groups"][0]   # recording rules unchanged
    assert all(isinstance(r, AlertRule) for r in alert_rules(fast))


def test_promtool_check_rules():
    out = run([need("promtool"), "check", "rules", str(RULES)])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 34 rules found" in out.stdout or "SUCCESS" in out.stdout


def test_promtool_unit_tests_pass():
    assert len(UNIT_TESTS) >= 5
    out = run([need("promtool"), "test", "rules", *[p.name for p in UNIT_TESTS]], cwd=UNIT_TESTS[0].parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(UNIT_TESTS)


def test_promtool_unit_tests_fail_on_a_broken_threshold(tmp_path):
    """The unit tests bite: move the TTFT warning threshold from 0.5 s to 0.3 s and they fail."""
    rules = RULES.read_text().replace('histogram_quantile_rate5m{quantile="0.99"} > 0.5',
                                      'histogram_quantile_rate5m{quantile="0.99"} > 0.3')
    assert rules != RULES.read_text()
    (tmp_path / "alerts" / "tests").mkdir(parents=True)
    (tmp_path / "alerts" / "inferctl.rules.yaml").write_text(rules)
    src = (ROOT / "alerts" / "tests" / "latency_test.yaml").read_text()
    (tmp_path / "alerts" / "tests" / "latency_test.yaml").write_text(src)
    out = run([need("promtool"), "test", "rules", "latency_test.yaml"], cwd=tmp_path / "alerts" / "tests")
    assert out.returncode != 0 and "t-close" in out.stdout + out.stderr


def _unit_test_cases() -> list[dict]:
    cases = []
    for path in UNIT_TESTS:
        for group in yaml.safe_load(path.read_text())["tests"]:
            cases += group.get("alert_rule_test", [])
    return cases


def test_every_alert_has_a_firing_case_and_a_quiet_case():
    firing: dict[str, set[str]] = {}
    quiet: set[str] = set()
    for case in _unit_test_cases():
        if case.get("exp_alerts"):
            firing.setdefault(case["alertname"], set()).update(a["exp_labels"]["severity"] for a in case["exp_alerts"])
        else:
            quiet.add(case["alertname"])
    for rule in alert_rules():
        assert rule.severity in firing.get(rule.name, set()), f"no promtool case fires {rule.name} ({rule.severity})"
        assert rule.name in quiet, f"no promtool close call for {rule.name}"


def test_amtool_check_config_on_committed_and_test_configs(tmp_path):
    amtool = need("amtool")
    out = run([amtool, "check-config", str(AMCONFIG)])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 inhibit rules" in out.stdout and "3 receivers" in out.stdout
    fast = tmp_path / "am.yml"
    fast.write_text(dump_yaml(alertmanager_config({"pager": "http://127.0.0.1:1/p", "ticket": "http://127.0.0.1:1/t",
                                                   "heartbeat": "http://127.0.0.1:1/h"}, group_wait="1s",
                                                  group_interval="1s"), "alertmanager.py"))
    assert run([amtool, "check-config", str(fast)]).returncode == 0


@pytest.mark.parametrize("labels, receiver", [
    (["alertname=InferctlEngineDegradedToInt8", "severity=critical", "engine=main"], "pager"),
    (["alertname=InferctlHighP99Latency", "severity=warning", "model=m"], "ticket"),
    (["alertname=Watchdog", "severity=none"], "heartbeat"),
    (["alertname=SomethingElse"], "ticket"),
])
def test_amtool_routes(labels, receiver):
    out = run([need("amtool"), "config", "routes", "test", f"--config.file={AMCONFIG}", *labels])
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == receiver


def test_alertmanager_config_requires_every_receiver_url():
    with pytest.raises(ValueError, match="heartbeat"):
        alertmanager_config({"pager": "http://a", "ticket": "http://b"})
    inhibit = alertmanager_config()["inhibit_rules"][0]
    assert (inhibit["source_matchers"] == ['severity="critical"']
            and inhibit["target_matchers"] == ['severity="warning"'])
    assert "alertname" in inhibit["equal"]


def test_promtool_check_metrics_on_every_catalog_series():
    """Every catalog metric, with every label set, passes promtool's lint (names, units, help)."""
    from prometheus_client import generate_latest

    from inferctl.controller.metrics import CONTROLLER_METRICS, build_registry as build_controller
    from inferctl.engine.metrics import ENGINE_METRICS, build_registry as build_engine

    for build, catalog in ((build_engine, ENGINE_METRICS), (build_controller, CONTROLLER_METRICS)):
        registry, metrics = build()
        for spec in catalog:
            m = metrics[spec["name"]]
            if spec["labels"]:
                m = m.labels(**{lbl: "x" for lbl in spec["labels"]})
            {"histogram": lambda o: o.observe(0.5), "counter": lambda o: o.inc(),
             "gauge": lambda o: o.set(1)}[spec["type"]](m)
        text = generate_latest(registry).decode()
        for spec in catalog:
            assert f"# TYPE {spec['name']} {spec['type']}" in text, spec["name"]
        out = subprocess.run([need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.strip() == "" and out.stderr.strip() == ""
