"""Generated Grafana dashboards: fresh, schema-valid (SDK round trip), catalog-only queries."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm
from typer.testing import CliRunner

from inferctl.dashboards.alerts import recorded_series
from inferctl.dashboards.build import annotation_queries, panel_queries, render_dashboards
from inferctl.dashboards.catalog import exposed_series, gauge_names, metric_catalog
from inferctl.dashboards.cli import make_app
from inferctl.dashboards.generate import render_all, stale_files
from inferctl.dashboards.promql_lint import analyze, check_expression

ROOT = Path(__file__).resolve().parents[2]
UIDS = {"inferctl-service", "inferctl-gpu", "inferctl-batching", "inferctl-model-health", "inferctl-control-plane",
        "inferctl-router"}


@pytest.fixture(scope="module")
def committed() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))}


def test_committed_files_are_fresh():
    assert stale_files(ROOT) == [], "run `inferctl dashboards build` and commit the result"


def test_stable_uids_one_file_each(committed):
    assert set(committed) == UIDS
    for uid, doc in committed.items():
        assert doc["uid"] == uid and len(uid) <= 40
        assert doc["title"].startswith("inferctl / ")


def test_round_trip_through_the_sdk_models(committed):
    """The JSON loads back into the SDK's typed models (Grafana 11.6 schema) and re-serialises
    byte for byte: every target is a Prometheus query and every panel's options a typed object."""
    register_default_plugins()
    for uid, doc in committed.items():
        model = dm.Dashboard.from_json(doc)
        assert (json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
                == (ROOT / "dashboards" / f"{uid}.json").read_text())
        assert model.schema_version == 41
        for panel in model.panels:
            if isinstance(panel, dm.RowPanel):
                continue
            assert all(isinstance(t, pm.Dataquery) for t in panel.targets), (uid, panel.title)
            assert not isinstance(panel.options, dict), (uid, panel.title, "options not typed")


def _walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield f"{path}.{k}", k, v
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_no_null_options_and_unique_panel_ids(committed):
    for uid, doc in committed.items():
        nulls = [p for p, k, v in _walk(doc) if k == "options" and v is None]
        assert nulls == [], (uid, nulls)
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)) and 0 not in ids, uid
        for panel in doc["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert doc["templating"]["list"][0]["type"] == "datasource"
        assert doc["templating"]["list"][0]["query"] == "prometheus"


def test_every_query_names_only_catalog_series_and_follows_the_rules(committed):
    series, gauges = exposed_series(), gauge_names()
    bad = []
    count = 0
    for uid, doc in committed.items():
        exprs = [(title, e) for title, _ref, e in panel_queries(doc)] + annotation_queries(doc)
        for title, expr in exprs:
            count += 1
            bad += [f"{uid} / {title}: {p}" for p in check_expression(expr, series, {}, gauges)]
    assert count > 60
    assert bad == []


def test_every_catalog_metric_is_charted(committed):
    charted = set()
    for doc in committed.values():
        for _t, _r, expr in panel_queries(doc):
            charted |= {s.name for s in analyze(expr).selectors}
    for name, spec in metric_catalog().items():
        wanted = {f"{name}_bucket", f"{name}_count"} if spec["type"] == "histogram" else {name}
        assert wanted & charted, f"{name} appears on no dashboard"


def _titles(doc) -> str:
    return " | ".join(p["title"] for p in doc["panels"]).lower()


@pytest.mark.parametrize("uid, needles", [
    ("inferctl-service", ["end-to-end latency p50 / p90 / p99", "time to first token", "inter-token latency",
                          "tokens per second", "requests per second", "errors per second", "error ratio"]),
    ("inferctl-gpu", ["used / reserved / total", "fragmentation", "memory-bandwidth", "temperature", "power",
                      "ecc", "xid", "telemetry up"]),
    ("inferctl-batching", ["effective batch size", "padding ratio", "queue depth", "preemptions",
                           "kv cache usage", "kv cache waste"]),
    ("inferctl-model-health", ["repetition", "degenerate-output rate by prompt length", "perplexity"]),
    ("inferctl-control-plane", ["precision mode", "precision switches", "rollbacks", "restarts", "gpu resets",
                                "breaker state", "switches in window and cap", "automation paused",
                                "event-log write failures"]),
    ("inferctl-router", ["requests per second by replica", "share of requests per replica", "retries per second",
                         "routing decisions by reason", "upstream time to first byte p50 / p99",
                         "router overhead p50 / p99", "replicas ready"]),
])
def test_required_panels_exist(committed, uid, needles):
    titles = _titles(committed[uid])
    for needle in needles:
        assert needle in titles, (uid, needle)


def test_latency_panels_are_p50_p90_p99_and_no_data_without_traffic(committed):
    panel = next(p for p in committed["inferctl-service"]["panels"] if p["title"].startswith("End-to-end latency"))
    exprs = [t["expr"] for t in panel["targets"]]
    assert [e.split(",")[0] for e in exprs] == ["histogram_quantile(0.5", "histogram_quantile(0.9",
                                                "histogram_quantile(0.99", "histogram_quantile(0.99"]
    assert all("rate(inferctl_engine_e2e_request_latency_seconds_count[$__rate_interval])) > 0)" in e for e in exprs)
    # the fourth line is the P99 only where it is saturated (> 1 % of observations above 600 s)
    legends = [t["legendFormat"] for t in panel["targets"]]
    assert legends[3] == "p99 ≥ top bucket {{model}}"
    assert exprs[3].endswith('_bucket{le=~"600|600.0"}[$__rate_interval]))) / (sum by (model) '
                             '(rate(inferctl_engine_e2e_request_latency_seconds_count[$__rate_interval])) > 0) > 0.01)')


def test_fragmentation_panel_is_reserved_unallocated_over_reserved_not_free_memory(committed):
    panel = next(p for p in committed["inferctl-gpu"]["panels"] if p["title"] == "Allocator fragmentation")
    engine_expr = panel["targets"][1]["expr"]
    assert engine_expr == ("(max by (job, instance) (inferctl_engine_memory_reserved_bytes >= 0) - "
                           "max by (job, instance) "
                           "(inferctl_engine_memory_allocated_bytes >= 0)) / (max by (job, instance) "
                           "(inferctl_engine_memory_reserved_bytes >= 0) > 0)")
    assert "inferctl_gpu_memory_used_bytes" not in json.dumps(panel)


def test_controller_events_are_prometheus_annotations(committed):
    for doc in committed.values():
        anns = dict(annotation_queries(doc))
        assert "inferctl_events_total" in anns["Controller events"]
        assert "inferctl_precision_switches_total" in anns["Precision switches"]
        for a in doc["annotations"]["list"]:
            assert a["datasource"]["type"] == "prometheus"


def test_provisioning_files():
    prov = yaml.safe_load((ROOT / "dashboards/provisioning/dashboards.yaml").read_text())
    assert prov["apiVersion"] == 1 and prov["providers"][0]["type"] == "file"
    assert prov["providers"][0]["options"]["path"]
    ds = yaml.safe_load((ROOT / "dashboards/provisioning/datasources.yaml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"


def test_cli_build_writes_everything_and_check_detects_staleness(tmp_path):
    runner = CliRunner()
    app = make_app()
    check = runner.invoke(app, ["check", "--root", str(tmp_path)])
    assert check.exit_code == 1 and "stale: dashboards/inferctl-gpu.json" in check.output
    built = runner.invoke(app, ["build", "--root", str(tmp_path)])
    assert built.exit_code == 0, built.output
    expected = render_all()
    assert f"{len(expected)} file(s) changed" in built.output
    for rel, text in expected.items():
        assert (tmp_path / rel).read_text() == text
    assert runner.invoke(app, ["check", "--root", str(tmp_path)]).exit_code == 0
    # A hand edit makes exactly that file stale; a rebuild rewrites only it.
    target = tmp_path / "dashboards" / "inferctl-batching.json"
    target.write_text(target.read_text().replace("Padding ratio", "Padding"))
    (tmp_path / "dashboards" / "old-dashboard.json").write_text("{}")
    check = runner.invoke(app, ["check", "--root", str(tmp_path)])
    assert check.exit_code == 1
    assert "stale: dashboards/inferctl-batching.json" in check.output
    assert "stale: dashboards/old-dashboard.json" in check.output
    assert "inferctl-gpu.json" not in check.output
    rebuilt = runner.invoke(app, ["build", "--root", str(tmp_path)])
    assert "wrote dashboards/inferctl-batching.json" in rebuilt.output and "1 file(s) changed" in rebuilt.output
    bad = runner.invoke(app, ["build", "--root", str(tmp_path), "--runbook-base-url", "https://x/no-slash"])
    assert bad.exit_code != 0 and "--runbook-base-url" in bad.output


def test_render_is_deterministic():
    assert render_dashboards() == render_dashboards()


ALLOWED_INTERNAL = {"inferctl.engine.metrics", "inferctl.controller.metrics", "inferctl.router.metrics"}


def _internal_imports(path: Path) -> list[str]:
    """Modules of the engine/controller/router packages that ``path`` imports (dotted names)."""
    parts = ("inferctl.engine", "inferctl.controller", "inferctl.router")
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(parts)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith(parts):
                if node.module in parts:
                    found += [f"{node.module}.{a.name}" for a in node.names]
                else:
                    found.append(node.module)
    return found


def test_dashboards_package_imports_only_the_three_catalogs():
    files = sorted((ROOT / "dashboards").glob("*.py"))
    assert len(files) >= 8
    seen = set()
    for path in files:
        for mod in _internal_imports(path):
            assert mod in ALLOWED_INTERNAL, f"{path.name} imports {mod}"
            seen.add(mod)
    assert seen == ALLOWED_INTERNAL


def test_import_checker_catches_forbidden_forms(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import inferctl.engine.server\nfrom inferctl.controller import loop\n"
                   "from inferctl.controller.metrics import X\nfrom inferctl.engine import metrics\nimport os\n")
    assert _internal_imports(bad) == ["inferctl.engine.server", "inferctl.controller.loop",
                                      "inferctl.controller.metrics", "inferctl.engine.metrics"]


def test_recorded_series_names_follow_level_metric_operations():
    for name in recorded_series():
        level, metric, ops = name.split(":")
        assert level and metric.startswith("inferctl_engine_") and ops


def _panel_expr(uid: str, title: str, ref: str = "A") -> str:
    doc = json.loads((ROOT / "dashboards" / f"{uid}.json").read_text())
    expr = next(e for t, r, e in panel_queries(doc) if t == title and r == ref)
    return expr.replace("$__rate_interval", "5m")


def _promtool_eval(tmp_path: Path, series: list[dict], expr: str, expected: list[dict]) -> subprocess.CompletedProcess:
    """Evaluate a real panel expression on synthetic scrapes with ``promtool test rules``."""
    (tmp_path / "empty.rules.yaml").write_text("groups: []\n")
    test = {"rule_files": ["empty.rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series,
                       "promql_expr_test": [{"expr": expr, "eval_time": "10m", "exp_samples": expected}]}]}
    (tmp_path / "panel_test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not installed (.ci/run installs the Debian prometheus package)")
    return subprocess.run([promtool, "test", "rules", "panel_test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


def test_f05_padding_ratio_panel_divides_aggregates_and_is_blank_for_an_idle_engine(tmp_path):
    a, b = 'job="inferctl-engine",instance="a:8000"', 'job="inferctl-engine",instance="b:8000"'
    series = [
        {"series": f"inferctl_engine_step_real_tokens_total{{{a}}}", "values": "0+50x10"},
        {"series": f"inferctl_engine_step_padded_tokens_total{{{a}}}", "values": "0+50x10"},
        {"series": f"inferctl_engine_step_real_tokens_total{{{b}}}", "values": "0x10"},      # 0 of 0
        {"series": f"inferctl_engine_step_padded_tokens_total{{{b}}}", "values": "0x10"},
    ]
    expr = _panel_expr("inferctl-batching", "Padding ratio")
    ok = _promtool_eval(tmp_path, series, expr, [{"labels": f"{{{a}}}", "value": 0.5}])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = _promtool_eval(tmp_path, series, expr,
                           [{"labels": f"{{{a}}}", "value": 0.5}, {"labels": f"{{{b}}}", "value": 0}])
    assert wrong.returncode != 0     # B is no data, not 0


def test_error_ratio_panel_is_zero_with_traffic_and_blank_without(tmp_path):
    series = [
        {"series": 'inferctl_engine_requests_total{job="inferctl-engine",instance="a:8000",model="busy",'
                   'finish_reason="length"}', "values": "0+60x10"},
        {"series": 'inferctl_engine_requests_total{job="inferctl-engine",instance="a:8000",model="idle",'
                   'finish_reason="length"}', "values": "9x10"},
        {"series": 'inferctl_engine_request_errors_total{job="inferctl-engine",instance="a:8000",model="flaky",'
                   'reason="oom"}', "values": "0+6x10"},
        {"series": 'inferctl_engine_requests_total{job="inferctl-engine",instance="a:8000",model="flaky",'
                   'finish_reason="stop"}', "values": "0+60x10"},
    ]
    out = _promtool_eval(tmp_path, series, _panel_expr("inferctl-service", "Error ratio"),
                         [{"labels": '{model="busy"}', "value": 0}, {"labels": '{model="flaky"}', "value": 0.1}])
    assert out.returncode == 0, out.stdout + out.stderr


def test_f04_latency_panels_show_no_data_for_flat_histograms(tmp_path):
    lbl = 'job="inferctl-engine",instance="a:8000",model="m"'
    h = "inferctl_engine_e2e_request_latency_seconds"
    series = [{"series": f'{h}_bucket{{{lbl},le="1"}}', "values": "40x10"},
              {"series": f'{h}_bucket{{{lbl},le="+Inf"}}', "values": "50x10"},
              {"series": f"{h}_count{{{lbl}}}", "values": "50x10"}]
    for ref in ("A", "B", "C"):
        out = _promtool_eval(tmp_path, series,
                             _panel_expr("inferctl-service", "End-to-end latency P50 / P90 / P99", ref), [])
        assert out.returncode == 0, (ref, out.stdout + out.stderr)
    # with traffic the same panel has data (the test above is not vacuous)
    series = [dict(s, values=s["values"].replace("40x10", "0+4x10").replace("50x10", "0+5x10")) for s in series]
    out = _promtool_eval(tmp_path, series,
                         _panel_expr("inferctl-service", "End-to-end latency P50 / P90 / P99", "C"), [])
    assert out.returncode != 0 and "got" in out.stdout + out.stderr
