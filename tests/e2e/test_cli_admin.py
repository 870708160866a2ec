"""The admin CLI against a running controller (real uvicorn on a free port)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import uvicorn
from typer.testing import CliRunner

from inferctl.controller.api import create_app
from inferctl.cli import app
from tests.controller_helpers import FakeClock, FakeEngineClient, FakeNvidiaSmi, free_port, make_controller

TOKEN = "cli-test-token"


class Served:
    def __init__(self, ctl) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(ctl, TOKEN), host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "Served":
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.delenv("INFERCTL_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("INFERCTL_URL", raising=False)
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    client = FakeEngineClient()
    ctl, _, log = make_controller(tmp_path, {"main": client}, clock=FakeClock())
    ctl.tick()
    with Served(ctl) as s:
        yield s, ctl, client, log, smi


def run(*args, input=None, env=None):
    return CliRunner().invoke(app, list(args), input=input, env=env, catch_exceptions=False)


def test_status_table_and_json(served):
    s, *_ = served
    r = run("status", "--url", s.url)
    assert r.exit_code == 0, r.output
    assert "main" in r.output and "full" in r.output and "precision=full" in r.output
    r = run("status", "--url", s.url, "--json")
    doc = json.loads(r.output)
    assert doc["engines"]["main"]["precision"] == "full"


def test_degrade_with_token_from_env(served):
    s, ctl, client, log, _ = served
    r = run("degrade", "--url", s.url, env={"INFERCTL_ADMIN_TOKEN": TOKEN})
    assert r.exit_code == 0, r.output
    assert r.output.startswith("ok: engine main switched to int8")
    assert client.precision == "int8"
    r = run("events", "--url", s.url, "--json", "--kind", "action")
    rows = [json.loads(line) for line in r.output.splitlines()]
    assert rows[-1]["source"] == "operator" and rows[-1]["target"] == "main"


def test_missing_and_wrong_token(served):
    s, _, client, _, _ = served
    r = run("drain", "--url", s.url)
    assert r.exit_code == 1 and "admin token is required" in r.output
    r = run("drain", "--url", s.url, "--token", "nope")
    assert r.exit_code == 1 and "unauthorized" in r.output
    assert client.calls == []


def test_unreachable_controller_is_one_line_exit_1():
    port = free_port()
    r = run("status", "--url", f"http://127.0.0.1:{port}")
    assert r.exit_code == 1
    assert r.output.strip().count("\n") == 0
    assert "controller not reachable" in r.output and "Traceback" not in r.output


def test_restart_refused_for_unlaunched_engine(served):
    s, *_ = served
    r = run("restart", "--url", s.url, "--token", TOKEN)
    assert r.exit_code == 1 and r.output.startswith("refused: engine main was not launched")


def test_unknown_engine(served):
    s, *_ = served
    r = run("drain", "--url", s.url, "--token", TOKEN, "--engine", "ghost")
    assert r.exit_code == 1 and "'ghost' is not a configured engine" in r.output


def test_reset_gpu_asks_for_confirmation(served):
    s, _, _, _, smi = served
    r = run("reset-gpu", "0", "--url", s.url, "--token", TOKEN, input="n\n")
    assert r.exit_code == 1 and "aborted" in r.output
    assert smi.calls() == []
    r = run("reset-gpu", "0", "--url", s.url, "--token", TOKEN, "--dry-run")
    assert r.exit_code == 0 and "outcome: dry_run" in r.output and "would run" in r.output
    assert smi.calls() == []
    r = run("reset-gpu", "0", "--url", s.url, "--token", TOKEN, input="y\n")
    assert r.exit_code == 0, r.output
    assert "outcome: success" in r.output
    assert ["--gpu-reset", "-i", "0"] in smi.calls()
    r = run("reset-gpu", "0", "--url", s.url, "--token", TOKEN, "--yes")
    assert r.exit_code == 1 and "refused" in r.output and "retry in" in r.output


def test_engine_is_required_when_several(tmp_path, monkeypatch):
    monkeypatch.delenv("INFERCTL_URL", raising=False)
    ctl, _, _ = make_controller(tmp_path, {"a": FakeEngineClient("a"), "b": FakeEngineClient("b")})
    with Served(ctl) as s:
        r = run("drain", "--url", s.url, "--token", TOKEN)
        assert r.exit_code == 2 and "--engine is required" in r.output and "a, b" in r.output
        r = run("drain", "--url", s.url, "--token", TOKEN, "-e", "b")
        assert r.exit_code == 0 and ctl.engines["b"].draining and not ctl.engines["a"].draining


def test_events_filters_and_bad_values(served):
    s, _, _, log, _ = served
    for i in range(3):
        log.append("refusal", "test", f"r{i}")
    r = run("events", "--url", s.url, "--kind", "refusal", "--limit", "2", "--json")
    assert [json.loads(x)["reason"] for x in r.output.splitlines()] == ["r1", "r2"]
    r = run("events", "--url", s.url, "--kind", "bogus")
    assert r.exit_code == 1 and "kind" in r.output


def test_status_prints_the_reset_interval_for_people():
    from inferctl.controller.cli import _fmt_seconds
    assert _fmt_seconds(1800.0) == "1800 s (30 min)"
    assert _fmt_seconds(30) == "30 s"
    assert _fmt_seconds(None) == "-" and _fmt_seconds(True) == "-"
