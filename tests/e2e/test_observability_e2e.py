"""End to end: real Prometheus + Alertmanager with the generated rules and config, the bundled
engine on stories260K and the controller, a webhook receiver in the test.

Scenario: steady client traffic through the router (``inferctl router`` in front of the one
engine, scraped as job ``inferctl-router``); an out-of-memory fault injected into the engine
(``POST /admin/fault {"kind": "oom"}``; the next step really runs out of memory); the
controller degrades the engine to int8; ``InferctlEngineDegradedToInt8`` must reach the pager
webhook as a critical alert with its runbook link; after the rollback hold the controller
rolls back and the alert must arrive resolved. Then every dashboard query is evaluated against
this Prometheus and must return data, unless it is on :data:`EMPTY_IN_SCENARIO` (with why).

Speed-ups (documented in docs/observability.md): scrape and rule evaluation every 1 s, every
alert's ``for`` replaced by 1 s (:func:`dashboards.alerts.rule_groups` ``for_override``),
Prometheus ``--rules.alert.resend-delay`` 2 s, Alertmanager ``group_wait``/``group_interval``
1 s, the controller's rollback hold 12 s, and
Grafana's ``$__rate_interval``/``$__interval`` replaced by ``5s`` when dashboard queries run
(as range queries over the scenario, step 2 s, like a time-series panel).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from inferctl.dashboards.alertmanager import alertmanager_config
from inferctl.dashboards.alerts import DEFAULT_RUNBOOK_BASE_URL, rule_groups, rules_document
from inferctl.dashboards.build import annotation_queries, panel_queries
from inferctl.dashboards.generate import dump_yaml
from tests.obs_helpers import (Proc, WebhookReceiver, controller_config, free_port, prom_query, prom_query_range,
                         prometheus_config, python_cli, wait_until)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENGINE_TOKEN = "e2e-engine-token"
CONTROLLER_TOKEN = "e2e-controller-token"
HOLD_SECONDS = 12.0
WINDOW = "5s"      # stands in for Grafana's $__rate_interval / $__interval (4 x the 1 s scrape, + 1 s)
STEP = 2.0         # range-query step, as a panel ~60 points wide over the scenario would use

#: Why a latency panel's '≥ top bucket' query and the draft panels are empty here (several panels each).
TOP_BUCKET_ONLY = "the P99 line '≥ top bucket' shows only when P99 lies above the 600 s bucket"
NO_DRAFTS = "the scenario's engine runs without --speculative-config: nothing is drafted"

#: Queries that are legitimately empty in this scenario (CPU, simulated GPU, no light model,
#: no restarts/resets/Xids, no pause, no router rejection or retry): (dashboard uid, panel title, refId) -> why.
EMPTY_IN_SCENARIO: dict[tuple[str, str, str], str] = {
    ("inferctl-gpu", "Memory-bandwidth utilisation", "A"): "the simulated GPU reports no bandwidth (no data, never 0)",
    ("inferctl-gpu", "SM utilisation", "A"): "the simulated GPU reports no utilisation",
    ("inferctl-gpu", "Temperature", "A"): "the simulated GPU has no sensors",
    ("inferctl-gpu", "Power", "A"): "the simulated GPU has no power reading",
    ("inferctl-gpu", "ECC errors (volatile)", "A"): "the simulated GPU has no ECC counters",
    ("inferctl-gpu", "Xid events", "A"): "no Xid happens in the scenario (the counter is born by its first event)",
    ("inferctl-service", "Errors per second", "A"): "no request fails: the OOM re-queues the batch",
    ("inferctl-service", "inferctl_engine_core_process_up", "A"):
        "the scenario's engine runs in one process (no --core-process): the gauge has no series",
    ("inferctl-control-plane", "Engine restarts and drains", "A"): "no restart in the scenario",
    ("inferctl-control-plane", "Breaker state", "A"): "the breaker is off without a light model",
    ("inferctl-control-plane", "Breaker trips and TTFT P99", "A"): "the breaker is off without a light model",
    ("inferctl-control-plane", "Breaker trips and TTFT P99", "B"):
        "the controller computes TTFT P99 inside the breaker policy, off here",
    ("inferctl-control-plane", "Breaker trips and TTFT P99", "C"):
        "the saturation flag comes from the breaker policy, off here",
    ("inferctl-control-plane", "Invalid samples", "A"): "no invalid sample in the scenario",
    ("inferctl-gpu", "MIG instance memory", "A"): "the simulated GPU has no MIG instances",
    ("inferctl-gpu", "MIG instance memory", "B"): "the simulated GPU has no MIG instances",
    ("inferctl-gpu", "MIG instance memory", "C"): "the simulated GPU has no MIG instances",
    ("inferctl-gpu", "Correctable ECC errors per second", "A"):
        "the simulated GPU has no ECC counters, so no correctable-error rate",
    ("inferctl-control-plane", "Automation paused", "A"):
        "nobody pauses automation in the scenario (a scope's series exists only while it is paused)",
    ("inferctl-control-plane", "Paused for", "A"): "nobody pauses automation in the scenario",
    ("inferctl-control-plane", "Would have acted", "A"):
        "automation is never paused, so no decision is held back (the counter is born by its first event)",
    ("inferctl-service", "End-to-end latency P50 / P90 / P99", "D"):
        "the P99 line '≥ top bucket' shows only when P99 lies above the 600 s bucket; stories260K answers in < 5 s",
    ("inferctl-service", "Time to first token P50 / P90 / P99", "D"):
        TOP_BUCKET_ONLY,
    ("inferctl-service", "Inter-token latency P50 / P90 / P99", "D"):
        TOP_BUCKET_ONLY,
    ("inferctl-router", "Requests answered by the router", "A"):
        "every request is valid and the one replica stays routable: the router rejects none",
    ("inferctl-router", "Retries per second", "A"): "the one replica never refuses or fails, so nothing is retried",
    ("inferctl-router", "Streams cut and client disconnects", "A"):
        "no stream is cut after its first byte (the OOM re-queues the batch)",
    ("inferctl-router", "Streams cut and client disconnects", "B"): "the test's client reads every answer to its end",
    ("inferctl-service", "Request queue time P50 / P90 / P99", "D"):
        TOP_BUCKET_ONLY,
    ("inferctl-service", "Request prefill time P50 / P90 / P99", "D"):
        TOP_BUCKET_ONLY,
    ("inferctl-service", "Request decode time P50 / P90 / P99", "D"):
        TOP_BUCKET_ONLY,
    ("inferctl-model-health", "Draft acceptance rate", "A"):
        NO_DRAFTS,
    ("inferctl-model-health", "Acceptance by draft position", "A"):
        NO_DRAFTS,
    ("inferctl-router", "Rate limited (429) per second", "A"):
        "the scenario's router has no rate limits (no --config), so nothing is limited",
}


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} not installed "
                    "(.ci/run installs the Debian prometheus and prometheus-alertmanager packages)")
    return path


@dataclass
class Stack:
    prom: str
    am: str
    engine: str
    controller: str
    receiver: WebhookReceiver
    procs: list[Proc]
    traffic: dict = field(default_factory=lambda: {"ok": 0, "failed": 0})
    started: float = field(default_factory=time.time)

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs)


def _traffic(engine: str, stop: threading.Event, counts: dict) -> None:
    prompts = ["Once upon a time", "The little dog ran to the park and", "Lily and Ben were friends. One day",
               "Tom had a red ball."]
    i = 0
    with httpx.Client(timeout=30.0) as client:
        while not stop.is_set():
            # long enough (and close enough together) that a request holds KV blocks at most of
            # the controller's polls: the KV-waste panels need a busy engine to have data
            body = {"model": "stories260K", "prompt": prompts[i % len(prompts)], "max_tokens": 64,
                    "temperature": 0.0 if i % 3 == 0 else 0.8, "seed": i}
            try:
                ok = client.post(f"{engine}/v1/completions", json=body).status_code == 200
            except httpx.HTTPError:
                ok = False
            counts["ok" if ok else "failed"] += 1
            i += 1
            stop.wait(0.02)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stories_dir):
    prometheus, alertmanager = need("prometheus"), need("prometheus-alertmanager")
    tmp = tmp_path_factory.mktemp("obs-e2e")
    ports = {k: free_port() for k in ("prom", "am", "engine", "controller", "router")}
    receiver = WebhookReceiver()
    rules = tmp / "rules.yaml"
    rules.write_text(dump_yaml(rules_document(rule_groups(for_override="1s")), "alerts.py"))
    am_cfg = tmp / "alertmanager.yml"
    am_cfg.write_text(dump_yaml(alertmanager_config(
        {name: receiver.url(f"/{name}") for name in ("pager", "ticket", "heartbeat")},
        group_wait="1s", group_interval="1s", repeat_interval="1h"), "alertmanager.py"))
    procs: list[Proc] = []
    stop = threading.Event()
    counts = {"ok": 0, "failed": 0}
    thread = None
    try:
        procs.append(Proc("alertmanager", [alertmanager, f"--config.file={am_cfg}", f"--storage.path={tmp / 'am'}",
                                           f"--web.listen-address=127.0.0.1:{ports['am']}",
                                           "--cluster.listen-address="],
                          tmp / "alertmanager.log"))
        procs.append(Proc("engine", python_cli(
            "engine", "serve", "--model", str(stories_dir / "stories260K.bin"), "--port", str(ports["engine"]),
            "--admin-token", ENGINE_TOKEN, "--memory-budget", "16MiB", "--num-kv-blocks", "64",
            "--log-level", "warning"),
            tmp / "engine.log", env={"OMP_NUM_THREADS": "1"}, cwd=ROOT))
        procs[0].wait_http(f"http://127.0.0.1:{ports['am']}/-/ready", 30)   # before Prometheus sends anything
        prom_cfg = prometheus_config(tmp / "prometheus.yml", rules, ports["am"], ports["engine"], ports["controller"],
                                     router_port=ports["router"])
        procs.append(Proc("prometheus", [prometheus, f"--config.file={prom_cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                         f"--web.listen-address=127.0.0.1:{ports['prom']}",
                                         "--rules.alert.resend-delay=2s"], tmp / "prometheus.log"))
        engine = f"http://127.0.0.1:{ports['engine']}"
        procs[1].wait_http(f"{engine}/health", 60)
        ctl_cfg = controller_config(tmp / "controller.yaml", ports["controller"], ports["engine"], ENGINE_TOKEN,
                                    CONTROLLER_TOKEN, tmp / "events.db", HOLD_SECONDS)
        procs.append(Proc("controller", python_cli("controller", "run", "--config", str(ctl_cfg)),
                          tmp / "controller.log", env={"OMP_NUM_THREADS": "1"}, cwd=ROOT))
        s = Stack(prom=f"http://127.0.0.1:{ports['prom']}", am=f"http://127.0.0.1:{ports['am']}", engine=engine,
                  controller=f"http://127.0.0.1:{ports['controller']}", receiver=receiver, procs=procs, traffic=counts)
        procs[3].wait_http(f"{s.controller}/status", 60)
        # the router in front of the engine (its panels need traffic through it)
        procs.append(Proc("router", python_cli(
            "router", "--port", str(ports["router"]), "--host", "127.0.0.1", "--engine", f"main={engine}",
            "--controller", s.controller), tmp / "router.log", cwd=ROOT))
        router = f"http://127.0.0.1:{ports['router']}"
        procs[4].wait_http(f"{router}/ready", 60)
        procs[2].wait_http(f"{s.prom}/-/ready", 30)
        wait_until(lambda: len([r for r in prom_query(s.prom, "up == 1")]) == 3, 30,
                   what=f"the three targets up\n{s.logs()}")
        thread = threading.Thread(target=_traffic, args=(router, stop, counts), daemon=True)
        thread.start()
        wait_until(lambda: counts["ok"] >= 5, 30, what="first completions")
        yield s
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=35)
        for p in reversed(procs):
            p.stop()
        receiver.close()


@pytest.fixture(scope="module")
def oom_scenario(stack: Stack) -> dict:
    """Inject an OOM; wait for the page, the rollback and the resolved notification."""
    t0 = time.monotonic()
    resp = httpx.post(f"{stack.engine}/admin/fault", json={"kind": "oom", "count": 1},
                      headers={"Authorization": f"Bearer {ENGINE_TOKEN}"}, timeout=10)
    assert resp.status_code == 200, resp.text
    name = "InferctlEngineDegradedToInt8"
    page = wait_until(lambda: stack.receiver.find("/pager", name, "firing"), 60,
                      what=f"the degradation page\n{stack.logs()}")
    t_page = time.monotonic() - t0
    resolved = wait_until(lambda: stack.receiver.find("/pager", name, "resolved"), 90,
                          what=f"the resolved notification\n{stack.logs()}")
    t_resolved = time.monotonic() - t0
    time.sleep(3)   # a few more scrapes after the rollback, for the dashboard queries
    return {"page": page, "resolved": resolved, "t_page": t_page, "t_resolved": t_resolved}


def test_degradation_pages_with_runbook_and_resolves_after_rollback(stack: Stack, oom_scenario: dict):
    page, resolved = oom_scenario["page"], oom_scenario["resolved"]
    assert page["labels"]["severity"] == "critical"
    assert page["labels"]["engine"] == "main" and page["labels"]["job"] == "inferctl-controller"
    url = page["annotations"]["runbook_url"]
    assert url == f"{DEFAULT_RUNBOOK_BASE_URL}InferctlEngineDegradedToInt8.md"
    runbook = ROOT / "runbooks" / url[len(DEFAULT_RUNBOOK_BASE_URL):]
    assert all(f"## {s}" in runbook.read_text() for s in ("Meaning", "Impact", "Diagnosis", "Mitigation"))
    assert "Engine main" in page["annotations"]["description"]
    assert resolved["labels"] == page["labels"] and resolved["endsAt"] >= page["startsAt"]
    # A page never goes to the ticket receiver, and the controller really went int8 and back.
    assert stack.receiver.find("/ticket", "InferctlEngineDegradedToInt8", "firing") is None
    switches = {r["metric"]["to"]: float(r["value"][1])
                for r in prom_query(stack.prom, 'inferctl_precision_switches_total{engine="main"}')}
    # every mode's counter exists from the start (int4 at 0: a start-only mode, never switched to)
    assert {to: n for to, n in switches.items() if n} == {"int8": 1.0, "full": 1.0}, switches
    assert oom_scenario["t_page"] < oom_scenario["t_resolved"]
    assert stack.traffic["ok"] > 20


def _post_alerts(am: str, alerts: list[dict]) -> None:
    now = datetime.now(timezone.utc)
    body = [{"labels": a, "annotations": {"summary": "e2e routing check"},
             "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=5)).isoformat()} for a in alerts]
    assert httpx.post(f"{am}/api/v2/alerts", json=body, timeout=10).status_code == 200


def test_alertmanager_routes_heartbeat_tickets_and_inhibits_the_matching_warning(stack: Stack):
    wait_until(lambda: stack.receiver.find("/heartbeat", "Watchdog", "firing"), 30, what="the Watchdog heartbeat")
    base = {"alertname": "InferctlHighP99Latency", "job": "inferctl-engine", "model": "inhibit-check",
            "quantile": "0.99"}
    _post_alerts(stack.am, [dict(base, severity="critical"), dict(base, severity="warning"),
                            {"alertname": "InferctlGpuTelemetryDown", "severity": "warning", "job": "e2e",
                             "source": "route-check"}])
    wait_until(lambda: stack.receiver.find("/pager", "InferctlHighP99Latency", "firing"), 20, what="critical page")
    wait_until(lambda: stack.receiver.find("/ticket", "InferctlGpuTelemetryDown", "firing"), 20, what="warning ticket")

    def warning_state():
        got = httpx.get(f"{stack.am}/api/v2/alerts",
                        params={"filter": ['alertname="InferctlHighP99Latency"', 'severity="warning"']},
                        timeout=10).json()
        return got[0]["status"] if got and got[0]["status"]["inhibitedBy"] else None
    status = wait_until(warning_state, 20, what="the warning to be inhibited")
    assert status["state"] == "suppressed"
    time.sleep(2.5)   # two group intervals: an uninhibited warning would have been sent by now
    assert [a for a in stack.receiver.alerts("/ticket")
            if a["labels"].get("alertname") == "InferctlHighP99Latency"] == []


def _substitute(expr: str) -> str:
    return expr.replace("$__rate_interval", WINDOW).replace("$__interval", WINDOW)


def _values(matrix: list[dict]) -> list[str]:
    return [v for series in matrix for _t, v in series["values"]]


def test_every_dashboard_query_returns_data(stack: Stack, oom_scenario: dict):
    """Each panel query, run as Grafana runs it (a range query over the scenario), has data —
    or is on EMPTY_IN_SCENARIO — and no point is NaN or ±Inf ("no data" is absence)."""
    start, end = stack.started, time.time()
    empty, errors, checked = [], [], 0

    def run(key, expr):
        nonlocal checked
        checked += 1
        try:
            matrix = prom_query_range(stack.prom, _substitute(expr), start, end, STEP)
        except RuntimeError as exc:
            errors.append(f"{key}: {exc}")
            return []
        bad = [v for v in _values(matrix) if v in ("NaN", "+Inf", "-Inf")]
        assert bad == [], (key, expr)
        return matrix

    panels: dict[tuple[str, str, str], list[dict]] = {}
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        doc = json.loads(path.read_text())
        for title, ref, expr in panel_queries(doc):
            key = (doc["uid"], title, ref)
            panels[key] = matrix = run(key, expr)
            if not matrix and key not in EMPTY_IN_SCENARIO:
                empty.append(f"{key}: {expr}")
            if matrix and key in EMPTY_IN_SCENARIO:
                empty.append(f"{key} is on the empty list but returned data: update EMPTY_IN_SCENARIO")
        for name, expr in annotation_queries(doc):   # the scenario made events and two switches
            found = {tuple(sorted(r["metric"].items())) for r in run((doc["uid"], name, "annotation"), expr)}
            if name == "Precision switches":
                assert found == {(("engine", "main"), ("to", "int8")), (("engine", "main"), ("to", "full"))}, found
            else:
                assert (("kind", "transition"),) in found and (("kind", "action"),) in found, found
    assert errors == []
    assert empty == [], "\n".join(empty)
    assert checked > 60
    # One degrade, one rollback in the scenario. The counters exist at 0 from the controller's
    # start, so increase() extrapolates over its window (Prometheus docs: "increase ... is
    # extrapolated"): a single event reads about 1.1, hence round().
    rollbacks = panels[("inferctl-control-plane", "Rollbacks", "A")]
    assert round(max(float(v) for v in _values(rollbacks))) == 1
    switches = panels[("inferctl-control-plane", "Precision switches", "A")]
    by_mode = {s["metric"]["to"]: round(max(float(v) for _t, v in s["values"])) for s in switches}
    assert {to: n for to, n in by_mode.items() if n} == {"int8": 1, "full": 1}, by_mode   # int4: start-only, 0
    # The latency panels show the stories260K traffic: P99 TTFT in (0, 5 s), P50 <= P99.
    ttft = panels[("inferctl-service", "Time to first token P50 / P90 / P99", "C")]
    assert 0.0 < max(float(v) for v in _values(ttft)) < 5.0
    # All traffic went through the router to its one replica: share 1, one replica ready.
    share = panels[("inferctl-router", "Share of requests per replica", "A")]
    assert {s["metric"]["replica"] for s in share} == {"main"}
    assert {round(float(v), 6) for v in _values(share)} == {1.0}
    ready = panels[("inferctl-router", "Replicas ready", "A")]
    assert max(float(v) for v in _values(ready)) == 1.0


def test_every_rule_evaluates_without_errors(stack: Stack):
    groups = httpx.get(f"{stack.prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == sum(len(g.rules) for g in rule_groups())
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert bad == []
    recorded = prom_query(stack.prom, 'job_model_quantile:inferctl_engine_time_to_first_token_seconds:'
                                      'histogram_quantile_rate5m{quantile="0.99"}')
    assert recorded and 0.0 < float(recorded[0]["value"][1]) < 5.0


@pytest.mark.parametrize("which", ["engine", "controller"])
def test_promtool_check_metrics_on_real_scrapes(stack: Stack, which: str):
    text = httpx.get(f"{getattr(stack, which)}/metrics", timeout=10).text
    assert "inferctl_" in text
    out = subprocess.run([need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "" and out.stderr.strip() == ""
