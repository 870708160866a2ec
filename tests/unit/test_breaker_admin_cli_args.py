"""The controller's CLI and API under testers' inputs (wave: breaker/controller CLI).

Each case was a traceback, a hang, a wrong exit code or a silent default before:

* ``--url`` / ``$INFERCTL_URL`` with control characters or bytes that are not UTF-8 (httpx
  ``InvalidURL`` traceback), an empty ``--url`` (the default URL silently), credentials echoed;
* ``--timeout inf|nan|-1|1e308`` on ``reset-gpu`` / ``release-gpu`` / ``restart`` (OverflowError);
* a non-ASCII ``--actor`` / ``$INFERCTL_ACTOR`` (UnicodeEncodeError: it travels in a header), a
  ``--reason`` the controller refuses (its 400 named the body field, not the flag);
* ``--token-file`` naming a FIFO (blocked forever);
* ``inferctl up --engine-log-dir FILE`` (errno 17, exit 1), an engine's usage error (exit 1);
* a dead engine's gauges kept on ``/metrics``; ``reset-gpu`` of an unknown GPU answered 409.

No server is reached by the client cases (a discard port, or refused before anything is sent).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.contract.http import read_token_file, redact_url
from inferctl.controller.api import create_app
from inferctl.controller.config import parse_config
from inferctl.controller.exporter import ENGINE_POLL_GAUGES, Exporter
from inferctl.controller.metrics import build_registry
from inferctl.controller.signals import InvalidSampleCounter
from tests.controller_helpers import (FakeClock, FakeEngineClient, StaticGpuSource, api_setup, engine_snapshot, gpu,
                                      make_controller)

URL = "http://127.0.0.1:9"      # discard port: never answers
TOKEN = "t0ken-for-tests-0123456789"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("INFERCTL_URL", "INFERCTL_ADMIN_TOKEN", "INFERCTL_ACTOR"):
        monkeypatch.delenv(name, raising=False)


def _run(args: list[str], **env: str):
    r = CliRunner().invoke(app, args, env=env or None)
    assert r.exception is None or isinstance(r.exception, SystemExit), (r.output, r.exception)
    assert "Traceback" not in r.output
    return r


# --------------------------------------------------------------------------- 1, 6, 7: --url
@pytest.mark.parametrize("url, what", [
    (URL + "\x01", "control characters"), ("http://127.0.0.1:9/\x7f", "control characters"),
    ("http://127.0.0.1\n:9", "control characters"), ("http://127.0.0.1:9/\udcff", "not UTF-8"),
    ("http://h\udcffst:9", "not UTF-8")])
def test_a_url_no_request_can_carry_is_usage_naming_where_it_came_from(url, what):
    for args in (["status", "--url", url], ["reset-gpu", "0", "--yes", "--token", TOKEN, "--url", url],
                 ["pause", "--reason", "r", "--token", TOKEN, "--url", url]):
        r = _run(args)
        assert r.exit_code == 2 and r.output.startswith("error: --url: ") and what in r.output, r.output
    r = _run(["status"], INFERCTL_URL=url)
    assert r.exit_code == 2 and r.output.startswith("error: $INFERCTL_URL: ") and what in r.output, r.output


def test_an_empty_url_is_usage_not_the_default():
    for url in ("", "  "):
        r = _run(["status", "--url", url])
        assert r.exit_code == 2 and r.output.startswith("error: --url: empty"), r.output
        assert "not reachable" not in r.output


def test_credentials_in_the_url_are_never_echoed():
    secret = "hunter2-secret"
    for url, code in ((f"http://admin:{secret}@127.0.0.1:9", 1), (f"http://admin:{secret}@127.0.0.1:99999", 2),
                      (f"http://admin:{secret}@127.0.0.1:9\x01", 2)):
        r = _run(["status", "--url", url])
        assert r.exit_code == code and secret not in r.output and "admin" not in r.output, r.output
        assert "http://<credentials>@127.0.0.1:" in r.output
        r = _run(["status"], INFERCTL_URL=url)
        assert r.exit_code == code and secret not in r.output and "<credentials>" in r.output, r.output


def test_redact_url():
    assert redact_url("http://u:p@h:1/x?q=@") == "http://<credentials>@h:1/x?q=@"
    assert redact_url("https://a@b@h") == "https://<credentials>@h"          # the last @ ends them
    assert redact_url("http://h:1/x@y") == "http://h:1/x@y"                  # an @ in the path is no credential
    assert redact_url("http://[::1]:9") == "http://[::1]:9" and redact_url("not a url") == "not a url"


# --------------------------------------------------------------------------- 2: --timeout
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "0", "0.5", "1e308", "3601"])
@pytest.mark.parametrize("command", [["reset-gpu", "0", "--yes"], ["release-gpu", "0", "--yes"],
                                     ["restart", "--engine", "main"]])
def test_timeout_is_bounded(command, value):
    r = _run([*command, "--timeout", value, "--token", TOKEN, "--url", URL])
    assert r.exit_code == 2, r.output
    assert "--timeout" in r.output and "3600" in r.output and "OverflowError" not in r.output


def test_a_timeout_in_range_still_goes_to_the_server():
    r = _run(["release-gpu", "0", "--yes", "--timeout", "3600", "--token", TOKEN, "--url", URL])
    assert r.exit_code == 1 and "not reachable" in r.output


# --------------------------------------------------------------------------- 3: --actor, --reason
@pytest.mark.parametrize("actor", ["jürgen", "ops team", "a" * 65, "x\udcff", "tab\there"])
def test_an_actor_no_header_can_carry_is_usage_naming_the_flag(actor):
    for command in (["pause", "--reason", "maintenance"], ["resume"]):
        r = _run([*command, "--actor", actor, "--token", TOKEN, "--url", URL])
        assert r.exit_code == 2 and r.output.startswith("error: --actor: "), r.output
        assert "1-64 characters" in r.output and "x-inferctl-actor" not in r.output.lower()
        r = _run([*command, "--token", TOKEN, "--url", URL], INFERCTL_ACTOR=actor)
        assert r.exit_code == 2 and r.output.startswith("error: $INFERCTL_ACTOR: "), r.output


def test_an_ascii_actor_still_goes_to_the_server():
    r = _run(["pause", "--reason", "r", "--actor", "jane.doe@ops", "--token", TOKEN, "--url", URL])
    assert r.exit_code == 1 and "not reachable" in r.output


@pytest.mark.parametrize("reason, says", [("", "empty"), ("   ", "empty"), ("a\nb", "separator characters"),
                                          ("nul\x00", "control, format"), ("bad\udcff", "not UTF-8"),
                                          ("x" * 1025, "1024")])
def test_a_reason_the_controller_refuses_is_usage_naming_the_flag(reason, says):
    r = _run(["pause", "--reason", reason, "--token", TOKEN, "--url", URL])
    assert r.exit_code == 2 and r.output.startswith("error: --reason: ") and says in r.output, r.output


def test_a_value_that_is_not_utf8_elsewhere_is_usage_not_a_traceback():
    r = _run(["drain", "--engine", "main\udcff", "--token", TOKEN, "--url", URL])
    assert r.exit_code == 2 and "not UTF-8" in r.output, r.output


# --------------------------------------------------------------------------- 8: --token-file FIFO
def _read_in_thread(path: Path) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def go() -> None:
        try:
            out["token"] = read_token_file(str(path), "--token-file")
        except ValueError as exc:
            out["error"] = str(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout=5)
    return t, out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_token_file_that_is_a_fifo_never_blocks(tmp_path, monkeypatch):
    """A FIFO nobody writes to is given up on after TOKEN_PIPE_SECONDS (it used to block for ever)."""
    import inferctl.contract.http as http

    monkeypatch.setattr(http, "TOKEN_PIPE_SECONDS", 0.3)
    fifo = tmp_path / "token.fifo"
    os.mkfifo(fifo)
    t, out = _read_in_thread(fifo)
    if t.is_alive():       # unblock the reader (open a writer, close it) before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(timeout=5)
        pytest.fail("read_token_file blocked on a FIFO")
    assert "gave no complete line within 0.3 s" in out["error"] and out["error"].startswith("--token-file: ")
    r = _run(["drain", "--engine", "main", "--url", URL, "--token-file", str(fifo)])
    assert r.exit_code == 2 and "error: --token-file: " in r.output and "no complete line" in r.output
    r = _run(["drain", "--engine", "main", "--url", URL, "--token-file", str(tmp_path)])
    assert r.exit_code == 2 and "a directory" in r.output


def test_a_token_from_a_pipe_is_read_and_a_silent_pipe_times_out(monkeypatch):
    """``--token-file <(cat secret)`` keeps working: a pipe with a writer is read to its first line."""
    import inferctl.contract.http as http

    r, w = os.pipe()
    os.write(w, (TOKEN + "\nsecond\n").encode())
    assert read_token_file(f"/dev/fd/{r}", "--token-file") == TOKEN
    os.close(r)
    os.close(w)
    monkeypatch.setattr(http, "TOKEN_PIPE_SECONDS", 0.3)
    r, w = os.pipe()             # a writer that never writes
    try:
        with pytest.raises(ValueError, match=r"--token-file: the pipe .* gave no complete line within 0.3 s"):
            read_token_file(f"/dev/fd/{r}", "--token-file")
    finally:
        os.close(r)
        os.close(w)


def test_a_regular_token_file_still_works(tmp_path):
    f = tmp_path / "token"
    f.write_text("\n  " + TOKEN + "  \nsecond line\n")
    assert read_token_file(str(f), "--token-file") == TOKEN
    r = _run(["drain", "--engine", "main", "--url", URL, "--token-file", str(f)])
    assert r.exit_code == 1 and "not reachable" in r.output
    r = _run(["drain", "--engine", "main", "--url", URL, "--token-file", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "error: --token-file: cannot read" in r.output


# --------------------------------------------------------------------------- 4, 5, 11: inferctl up
def test_up_engine_log_dir_that_is_a_file_is_usage(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    for command in (["up", "--controller-port", "0"], ["controller", "run", "--config", _config(tmp_path)]):
        r = _run([*command, "--engine-log-dir", str(f), "--token", TOKEN])
        assert r.exit_code == 2, r.output
        assert "error: --engine-log-dir: " in r.output and "not a directory" in r.output
        assert "Errno 17" not in r.output


def _config(tmp_path: Path) -> str:
    p = tmp_path / "c.yaml"
    p.write_text(f"event_log: {tmp_path / 'ev.db'}\nlisten: {{port: 0}}\n")
    return str(p)


def _engine_exiting(code: int, message: str):
    """``engine_serve_argv`` stand-in: a process that prints ``message`` on stderr and exits ``code``."""
    def argv(*_a, **_kw) -> list[str]:
        return [sys.executable, "-c", f"import sys; sys.stderr.write({message!r} + '\\n'); sys.exit({code})"]
    return argv


@pytest.mark.parametrize("log_dir", [True, False])
def test_an_engine_usage_error_at_start_makes_up_exit_2_with_its_message(tmp_path, monkeypatch, log_dir):
    from inferctl.controller import runtime, up   # build_runtime (runtime.py) launches; up.serve calls it

    monkeypatch.setattr(runtime, "engine_serve_argv", _engine_exiting(2, "error: --max-num-seqs: must be >= 1"))
    cfg = parse_config({"event_log": str(tmp_path / "ev.db"), "listen": {"port": 0},
                        "engines": [{"name": "main", "kind": "bundled", "launch": {"port": _free_port()}}]})
    out: list[str] = []
    code = up.serve(cfg, TOKEN, echo=out.append, engine_log_dir=tmp_path / "logs" if log_dir else None)
    assert code == 2, out
    err = [line for line in out if line.startswith("error: ")]
    assert err and "engine 'main' refused its command line (exit code 2" in err[0]
    if log_dir:
        assert "--max-num-seqs: must be >= 1" in err[0]


def test_an_engine_that_fails_otherwise_is_still_exit_1(tmp_path, monkeypatch):
    from inferctl.controller import runtime, up   # build_runtime (runtime.py) launches; up.serve calls it

    monkeypatch.setattr(runtime, "engine_serve_argv", _engine_exiting(1, "error: out of memory"))
    cfg = parse_config({"event_log": str(tmp_path / "ev.db"), "listen": {"port": 0},
                        "engines": [{"name": "main", "kind": "bundled", "launch": {"port": _free_port()}}]})
    out: list[str] = []
    assert up.serve(cfg, TOKEN, echo=out.append) == 1
    assert any("exited with code 1" in line for line in out), out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_says_the_router_url_once_first_and_starts_the_router_after_the_engines(tmp_path, monkeypatch):
    """The router reads the controller's /status from its start: started before a slow model
    load, it warned "controller unreachable" on a healthy start. Its URL is said once."""
    from types import SimpleNamespace

    import uvicorn

    from inferctl.controller import up

    order: list[str] = []

    def build_runtime(config, token, *, on_engine_started=None, **_kw):
        order.append("engines")
        on_engine_started("main-0", SimpleNamespace(base_url="http://127.0.0.1:8000", pid=1))
        controller = SimpleNamespace(start=lambda: order.append("controller"), event_log=None)
        return SimpleNamespace(controller=controller, maintenance=None, app=None,
                               close=lambda: order.append("close"))

    def start_router(spec, config, controller_url, log_dir):
        order.append("router")
        return SimpleNamespace(base_url=f"http://{spec.host}:{spec.port}", stop=lambda: order.append("router-stop"))

    monkeypatch.setattr(up, "build_runtime", build_runtime)
    monkeypatch.setattr(up, "_start_router", start_router)
    monkeypatch.setattr(up, "RouterWatch", lambda *a: SimpleNamespace(start=lambda: None, stop=lambda: None))
    monkeypatch.setattr(up, "freeze_startup_heap", lambda: None)
    monkeypatch.setattr(up, "check_ports_free", lambda *a: None)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: order.append("serve"))
    out: list[str] = []
    cfg = parse_config({"event_log": ":memory:", "listen": {"port": 0}})
    assert up.serve(cfg, TOKEN, echo=out.append, router=up.RouterSpec("127.0.0.1", 18080)) == 0
    assert order[:4] == ["engines", "router", "controller", "serve"], order
    assert out[0].startswith("router:     http://127.0.0.1:18080  ("), out
    assert sum("http://127.0.0.1:18080" in line for line in out) == 1, out


# --------------------------------------------------------------------------- 9: /metrics of a dead engine
def test_a_dead_engines_gauges_go_away_and_engine_up_says_0():
    registry, metrics = build_registry()
    ex = Exporter(metrics, InvalidSampleCounter())
    recent = [{"prompt_tokens": 100, "completion_tokens": 20, "seq_rep_4": 0.1, "degenerate": False,
               "perplexity": 3.0}]
    good = engine_snapshot("a", kv_usage_ratio=0.5, kv_waste_ratio=0.1, memory_reserved_bytes=100,
                           memory_allocated_bytes=80, precision="int8", recent_requests=recent)
    ex.export_engine("a", good, None)
    ex.export_engine("b", engine_snapshot("b", kv_usage_ratio=0.25), None)

    def engine_series(name: str) -> set[str]:
        return {s.name for m in registry.collect() for s in m.samples
                if s.labels.get("engine") == name and s.name in ENGINE_POLL_GAUGES}

    before = engine_series("a")
    assert {"inferctl_kv_cache_usage_ratio", "inferctl_precision_mode", "inferctl_degraded_seconds",
            "inferctl_fragmentation_ratio"} <= before
    ex.export_engine("a", engine_snapshot("a", ok=False, error="connection refused", precision=None), good)
    assert registry.get_sample_value("inferctl_engine_up", {"engine": "a"}) == 0.0
    assert engine_series("a") == set()
    # another engine keeps its gauges; a second failed poll changes nothing
    assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "b"}) == 0.25
    ex.export_engine("a", engine_snapshot("a", ok=False, precision=None), None)
    assert engine_series("a") == set()
    # back up: the gauges are set again
    ex.export_engine("a", good, None)
    assert registry.get_sample_value("inferctl_engine_up", {"engine": "a"}) == 1.0
    assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "a"}) == 0.5
    assert registry.get_sample_value("inferctl_precision_mode", {"engine": "a", "mode": "int8"}) == 1.0


# --------------------------------------------------------------------------- 10: reset-gpu of an unknown GPU
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_reset_of_an_unknown_gpu_is_404_in_the_error_shape(tmp_path):
    src = StaticGpuSource({0: gpu(0)})
    ctl, _, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src, clock=FakeClock())
    ctl.tick()
    http = TestClient(create_app(ctl, TOKEN))
    r = http.post("/actions/reset-gpu", json={"gpu": 99}, headers=AUTH)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["code"] == "gpu_not_found" and err["field"] == "gpu" and err["message"].startswith("gpu: 99")
    assert "known: 0" in err["message"]
    assert not [e for e in log.query(kind="refusal") if e["target"] == "gpu:99"]
    assert 'gpu="99"' not in http.get("/metrics").text
    # a known GPU still goes to the rails (dry run: 200)
    assert http.post("/actions/reset-gpu", json={"gpu": 0, "dry_run": True}, headers=AUTH).status_code == 200
    r = http.post("/actions/release-gpu", json={"gpu": 99}, headers=AUTH)       # release: the same 404
    assert r.status_code == 404 and r.json()["error"]["field"] == "gpu", r.text
    r = http.post("/actions/release-gpu", json={"gpu": 0}, headers=AUTH)        # known, nothing held: 409
    assert r.status_code == 409, r.text
    # telemetry down: which GPUs exist is not known now; the rails refuse (409), never a 404
    src.ok = False
    ctl.tick()
    r = http.post("/actions/reset-gpu", json={"gpu": 99}, headers=AUTH)
    assert r.status_code == 409 and "telemetry" in r.json()["message"], r.text


def test_reset_gpu_documents_404(tmp_path):
    http, *_ = api_setup(tmp_path, TOKEN)
    paths = http.get("/openapi.json").json()["paths"]
    assert "404" in paths["/actions/reset-gpu"]["post"]["responses"]
    assert "404" in paths["/actions/release-gpu"]["post"]["responses"]


# --------------------------------------------------------------------------- 13: docs
ROOT = Path(__file__).resolve().parents[2]


def test_readme_cli_table_names_drill_fleet_and_the_url_variable():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## CLI reference"):readme.index("## Configuration")]
    assert "`inferctl drill fleet" in table and "$INFERCTL_URL" in table


def test_configuration_says_launch_model_takes_a_gguf_file():
    row = next(line for line in (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `launch.model`"))
    assert ".gguf" in row


def test_gpu_gauges_are_no_data_while_telemetry_is_down_and_for_a_gpu_gone_from_the_reading():
    from inferctl.controller.exporter import GPU_POLL_GAUGES
    from inferctl.controller.types import GpuReading, GpuSnapshot

    registry, metrics = build_registry()
    ex = Exporter(metrics, InvalidSampleCounter())

    def gpu(i: int) -> GpuSnapshot:
        return GpuSnapshot(uuid=f"GPU-{i}", index=i, memory_total_bytes=80 << 30, memory_used_bytes=1 << 30,
                           memory_free_bytes=79 << 30, utilization_ratio=0.5, temperature_celsius=40.0,
                           power_watts=100.0, ecc_corrected=0, ecc_uncorrected=0)

    def gpu_series() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for m in registry.collect():
            for s in m.samples:
                if s.name in GPU_POLL_GAUGES:
                    out.setdefault(s.labels["gpu"], set()).add(s.name)
        return out

    both = GpuReading("static", True, {"GPU-0": gpu(0), "GPU-1": gpu(1)})
    ex.export_gpu(both)
    assert set(gpu_series()) == {"0", "1"} and "inferctl_gpu_temperature_celsius" in gpu_series()["0"]
    ex.export_gpu(GpuReading("static", False, error="nvml: driver not loaded"))
    assert registry.get_sample_value("inferctl_gpu_telemetry_up", {"source": "static"}) == 0.0
    assert gpu_series() == {}                      # no data, not the last temperatures
    ex.export_gpu(both)
    assert set(gpu_series()) == {"0", "1"}
    ex.export_gpu(GpuReading("static", True, {"GPU-0": gpu(0)}))     # GPU 1 fell off the bus
    assert set(gpu_series()) == {"0"}
    assert registry.get_sample_value("inferctl_gpu_memory_used_bytes", {"gpu": "0", "uuid": "GPU-0"}) == 1 << 30


@pytest.mark.parametrize("url", ["http://" + "a" * 64 + ":1", "http://a..b:1", "http://.:1", "http://xn--:1"])
def test_a_host_name_the_resolver_refuses_is_usage_everywhere(url):
    """These hosts parse as URLs but fail IDNA encoding at the first request (a traceback)."""
    from inferctl.router.config import ConfigError, parse_engine

    r = _run(["status", "--url", url])
    assert r.exit_code == 2 and "error: --url: " in r.output and "Traceback" not in r.output
    r = _run(["status"], INFERCTL_URL=url)
    assert r.exit_code == 2 and "$INFERCTL_URL" in r.output
    with pytest.raises(ConfigError, match="--engine: a: URL .* not a valid host name"):
        parse_engine(f"a={url}")


@pytest.mark.parametrize("url", ["http://localhost:1", "http://my_host:1", "http://[::1]:1", "http://bücher.de:1",
                                 "http://xn--bcher-kva.de:1", "http://example.com.:1"])
def test_ordinary_host_names_still_pass(url):
    from inferctl.contract.http import host_name_problem
    from inferctl.router.config import parse_engine

    assert host_name_problem(url.split("//")[1].rsplit(":", 1)[0]) is None
    assert parse_engine(f"a={url}").url == url


@pytest.mark.parametrize("bad", ["\u2028", "\u2029", "\u202e", "\u200b", "\ufeff"])
def test_a_reason_with_separator_or_format_characters_is_refused_by_cli_and_api(bad, tmp_path):
    """A line separator or a bidi override would forge or hide text in /status and the events."""
    reason = f"line1{bad}FAKE: resumed by admin"
    r = _run(["pause", "--reason", reason, "--url", URL, "--token", TOKEN])
    assert r.exit_code == 2 and "--reason: " in r.output and f"U+{ord(bad):04X}" in r.output
    http, *_ = api_setup(tmp_path, TOKEN)
    resp = http.post("/actions/pause", json={"reason": reason}, headers=AUTH)
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "reason", resp.text


def test_a_reason_in_any_script_still_passes(tmp_path):
    http, *_ = api_setup(tmp_path, TOKEN)
    for reason in ("обновление драйвера — 驱动更新 ✓", "می\u200cخواهم", "family 👨\u200d👩\u200d👧", "עברית\u200f"):
        resp = http.post("/actions/pause", json={"reason": reason}, headers=AUTH)
        assert resp.status_code == 200, (reason, resp.text)



@pytest.mark.parametrize("reason", ["\u200d", "\u200c\u200c\u200c", "\u200f", "\u3164", "\u2800", " \u034f "])
def test_a_reason_that_shows_nothing_is_empty_for_cli_and_api(reason, tmp_path):
    r = _run(["pause", "--reason", reason, "--url", URL, "--token", TOKEN])
    assert r.exit_code == 2 and "--reason: empty" in r.output
    http, *_ = api_setup(tmp_path, TOKEN)
    resp = http.post("/actions/pause", json={"reason": reason}, headers=AUTH)
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "reason", resp.text


def test_tag_sequence_flags_and_the_arabic_letter_mark_pass(tmp_path):
    http, *_ = api_setup(tmp_path, TOKEN)
    england = "\U0001F3F4\U000E0067\U000E0062\U000E0065\U000E006E\U000E0067\U000E007F"
    for reason in (f"rollout {england}", "\u0627\u061c\u0628 maintenance"):
        resp = http.post("/actions/pause", json={"reason": reason}, headers=AUTH)
        assert resp.status_code == 200, (reason, resp.text)


@pytest.mark.parametrize("url", ["http://a..:1", "http://localhost..:1", "http://a.b...:1"])
def test_more_than_one_trailing_dot_is_refused_like_an_empty_label(url):
    from inferctl.router.config import ConfigError, parse_engine

    r = _run(["status", "--url", url])
    assert r.exit_code == 2 and "error: --url: " in r.output
    with pytest.raises(ConfigError, match="not a valid host name"):
        parse_engine(f"a={url}")
