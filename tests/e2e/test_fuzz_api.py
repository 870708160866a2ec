"""API fuzzing: schemathesis (``--checks all``) against the real engine, router and controller
started on loopback, each from its own ``/openapi.json`` (docs/api.md "Fuzzing").

Every run is repeatable (``--generation-deterministic``, a bounded ``--max-examples`` per
operation) and fails on any 5xx, any response that does not match the document (status,
content type, headers, schema), any schema-valid request refused with an undocumented status,
and on an operation with no generated case (read from schemathesis's ndjson event report).
Admin routes get the token; the state-changing ones (``/admin/*`` of the engine, the
controller's ``/actions/*``) are fuzzed against throw-away servers (a second engine; a
controller watching that engine with a replayed GPU, its reset rails in dry run), so a drain
or an injected fault never derails the other runs.

Break a route to see the stage fail (docs/api.md): e.g. make ``/tokenize`` answer 422, or
raise in ``/v1/models``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.server_helpers import free_port, start_inferctl, wait_ready

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-fuzz-e2e-0123456789"
#: Cases per operation: enough for every documented shape, few enough for CI (a few minutes).
MAX_EXAMPLES = int(os.environ.get("INFERCTL_FUZZ_EXAMPLES", "20"))
#: Statuses a schema-valid request may get besides 2xx: what JSON Schema cannot say (a prompt
#: over the context or an id outside the vocabulary: 400; unknown model/engine/GPU: 404; a rail
#: or the current state: 409; draining: 503). Each is a documented answer of the operation.
ACCEPTED = "2xx,400,401,403,404,409,503"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "INFERCTL_ADMIN_TOKEN": TOKEN}


def _start(cmd: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    return start_inferctl(cmd, log, env=ENV, cwd=cwd)


def _wait(url: str, proc: subprocess.Popen, log: Path) -> None:
    wait_ready(url, proc, log, timeout=90, interval=0.2)


def _engine(stories_dir: Path, tmp: Path, name: str) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = tmp / f"{name}.log"
    proc = _start(["engine", "serve", "--model", str(stories_dir / "stories260K.bin"), "--port", str(port),
                   "--max-model-len", "128", "--memory-budget", "512MiB"], log, tmp)
    return proc, f"http://127.0.0.1:{port}", log


@pytest.fixture(scope="module")
def servers(stories_dir, fixtures_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    procs: list[subprocess.Popen] = []
    try:
        engine, engine_url, elog = _engine(stories_dir, tmp, "engine")
        scratch, scratch_url, slog = _engine(stories_dir, tmp, "scratch")
        procs += [engine, scratch]
        _wait(engine_url + "/health", engine, elog)
        _wait(scratch_url + "/health", scratch, slog)
        rport = free_port()
        rlog = tmp / "router.log"
        router = _start(["router", "--port", str(rport), "--probe-interval", "0.2", "--engine", f"main={engine_url}"],
                        rlog, tmp)
        procs.append(router)
        router_url = f"http://127.0.0.1:{rport}"
        _wait(router_url + "/ready", router, rlog)
        cport = free_port()
        capture = fixtures_dir / "gpu" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__idle__querygpu.csv"
        (tmp / "c.yaml").write_text(yaml.safe_dump({
            "listen": {"port": cport}, "event_log": str(tmp / "ev.db"),
            "engines": [{"name": "main", "kind": "bundled", "url": scratch_url}],
            "gpu": {"kind": "replay", "options": {"path": str(capture)}},
            "rails": {"dry_run": True}}))
        clog = tmp / "controller.log"
        controller = _start(["controller", "run", "--config", str(tmp / "c.yaml")], clog, tmp)
        procs.append(controller)
        controller_url = f"http://127.0.0.1:{cport}"
        _wait(controller_url + "/health", controller, clog)
        yield {"engine": engine_url, "scratch": scratch_url, "router": router_url, "controller": controller_url,
               "tmp": tmp, "logs": {"engine": elog, "scratch": slog, "router": rlog, "controller": clog}}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def fuzz(base: str, tmp: Path, tag: str, *filters: str) -> dict[str, int]:
    """Run schemathesis against ``base``/openapi.json, failing the test (with schemathesis's own
    output) on any failure; returns the generated cases per operation (``"GET /health"``: n)."""
    config = tmp / f"{tag}.toml"
    config.write_text(f"[checks.positive_data_acceptance]\nexpected-statuses = {json.dumps(ACCEPTED.split(','))}\n")
    events = tmp / f"{tag}.ndjson"
    # --max-response-time: a slow answer is not what this stage looks for (speed is bench/'s), and
    # a shared CI machine may take seconds for a full-context generation
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{base}/openapi.json",
           "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--generation-deterministic",
           "--workers", "1", "--request-timeout", "60", "--max-response-time", "60", "--no-color",
           "--report", "ndjson", "--report-ndjson-path", str(events), "-H", f"Authorization: Bearer {TOKEN}", *filters]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp)
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"schemathesis found failures against {tag}:\n{text[-12000:]}"
    return cases_per_operation(events.read_text())


def cases_per_operation(ndjson: str) -> dict[str, int]:
    """Generated cases by operation label, summed over the scenarios of schemathesis's ndjson events."""
    counts: dict[str, int] = {}
    for line in ndjson.splitlines():
        event = json.loads(line).get("ScenarioFinished") if line.strip() else None
        recorder = (event or {}).get("recorder") or {}
        if recorder.get("label"):
            counts[recorder["label"]] = counts.get(recorder["label"], 0) + len(recorder.get("cases") or {})
    return counts


def _check_cases(counts: dict[str, int], base: str, exclude: tuple[str, ...] = ()) -> None:
    spec = httpx.get(base + "/openapi.json", timeout=10).json()
    expected = {f"{m.upper()} {p}" for p, item in spec["paths"].items() for m in item
                if not any(p.startswith(x) for x in exclude)}
    assert expected, "no operation to fuzz"
    missing = {label: counts.get(label, 0) for label in expected if counts.get(label, 0) == 0}
    assert not missing, f"operations with no generated case: {missing}"


def test_engine_api_fuzzed_without_failures(servers):
    counts = fuzz(servers["engine"], servers["tmp"], "engine", "--exclude-path-regex", "^/admin/")
    _check_cases(counts, servers["engine"], exclude=("/admin/",))


def test_engine_admin_api_fuzzed_on_a_throwaway_engine(servers):
    spec = httpx.get(servers["scratch"] + "/openapi.json", timeout=10).json()
    assert spec["paths"]["/admin/drain"]["post"]["security"] == [{"bearerAuth": []}]
    counts = fuzz(servers["scratch"], servers["tmp"], "scratch", "--include-path-regex", "^/admin/")
    _check_cases(counts, servers["scratch"], exclude=tuple(p for p in spec["paths"] if not p.startswith("/admin/")))


def test_router_api_fuzzed_without_failures(servers):
    counts = fuzz(servers["router"], servers["tmp"], "router")
    _check_cases(counts, servers["router"])


def test_controller_api_fuzzed_without_failures(servers):
    counts = fuzz(servers["controller"], servers["tmp"], "controller")
    _check_cases(counts, servers["controller"])
