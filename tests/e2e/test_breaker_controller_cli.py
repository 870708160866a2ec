"""Breaking the admin CLI: a controller that is down, a wrong token, a bad --url, something
that is not a controller, and a GPU reset nobody confirmed. Always one line, never a
traceback, never a reset that was not confirmed."""

from __future__ import annotations

import http.server
import threading

import pytest
from typer.testing import CliRunner

from inferctl.cli import app
from tests.controller_helpers import FakeClock, FakeEngineClient, FakeNvidiaSmi, free_port, make_controller
from tests.e2e.test_cli_admin import TOKEN, Served

ADMIN = [["degrade"], ["rollback"], ["drain"], ["undrain"], ["restart"], ["unpin"], ["reset-gpu", "0", "--yes"]]
IDS = ["degrade", "rollback", "drain", "undrain", "restart", "unpin", "reset-gpu"]


def run(*args, input=None, env=None):
    return CliRunner().invoke(app, list(args), input=input, env=env or {"INFERCTL_URL": "", "INFERCTL_ADMIN_TOKEN": ""})


def one_error_line(r) -> str:
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1, r.output
    return lines[0]


@pytest.mark.parametrize("cmd", ADMIN + [["status"], ["events"]], ids=IDS + ["status", "events"])
def test_every_command_with_the_controller_down_is_one_line_exit_1(cmd):
    url = f"http://127.0.0.1:{free_port()}"
    extra = [] if cmd[0] in ("status", "events") else ["--token", "x", "--engine", "main"]
    if cmd[0] == "reset-gpu":
        extra = ["--token", "x"]
    r = run(*cmd, "--url", url, *extra)
    assert r.exit_code == 1
    assert one_error_line(r).startswith("error: controller not reachable")


@pytest.fixture
def served(tmp_path, monkeypatch):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    client = FakeEngineClient()
    ctl, _, log = make_controller(tmp_path, {"main": client}, clock=FakeClock())
    ctl.tick()
    with Served(ctl) as s:
        yield s, client, smi


@pytest.mark.parametrize("cmd", ADMIN, ids=IDS)
def test_every_admin_command_with_a_wrong_token_is_a_clear_401(served, cmd):
    s, client, smi = served
    r = run(*cmd, "--url", s.url, "--token", "wrong")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert line.startswith("error: unauthorized: wrong bearer token") and "--token" in line
    assert client.calls == [] and smi.calls() == []


@pytest.mark.parametrize("url", ["not-a-url", "http://", "ftp://127.0.0.1:1", "http://127.0.0.1:99999"])
@pytest.mark.parametrize("cmd", [["status"], ["events"], ["drain", "--token", "t"]], ids=["status", "events", "drain"])
def test_a_bad_url_is_usage_exit_2_naming_the_option(url, cmd):
    r = run(*cmd, "--url", url)
    assert r.exit_code == 2, r.output
    line = one_error_line(r)
    assert line.startswith("error: --url:") and repr(url) in line


def test_a_bad_url_from_the_environment_names_the_variable():
    r = run("status", env={"INFERCTL_URL": "not-a-url", "INFERCTL_ADMIN_TOKEN": ""})
    assert r.exit_code == 2
    assert "INFERCTL_URL" in one_error_line(r)


def test_reset_without_yes_and_no_stdin_does_nothing(served):
    s, _, smi = served
    r = run("reset-gpu", "0", "--url", s.url, "--token", TOKEN, input="")
    assert r.exit_code == 1
    assert "aborted: nothing done" in r.output and "--yes" in r.output
    assert "Traceback" not in r.output
    assert smi.calls() == []


class NotAController:
    """An HTTP server that answers every request with the same body (not a controller)."""

    def __init__(self, body: bytes, status: int = 200) -> None:
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                try:
                    self.wfile.write(outer.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the CLI hangs up on an oversized answer: expected, and not its output

            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.body, self.status = body, status
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "NotAController":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("body", [b"[1, 2, 3]", b"[" * 100_000, b"{}", b'"text"', b"null"],
                         ids=["list", "nested", "empty-object", "string", "null"])
@pytest.mark.parametrize("cmd", [["status"], ["events"], ["drain", "--token", "t", "--engine", "m"],
                                 ["reset-gpu", "0", "--yes", "--token", "t"]],
                         ids=["status", "events", "drain", "reset-gpu"])
def test_an_answer_that_is_not_the_controllers_is_one_line_exit_1(body, cmd):
    with NotAController(body) as fake:
        r = run(*cmd, "--url", fake.url)
    assert r.exit_code == 1, r.output
    line = one_error_line(r)
    assert line.startswith("error: ") and fake.url in line


def test_an_endless_answer_is_cut_off(monkeypatch):
    """Something at --url that streams without end: one line, exit 1, bounded memory."""
    import inferctl.controller.admin_client as client   # the module whose _request reads the bound

    monkeypatch.setattr(client, "MAX_ANSWER_BYTES", 1024 * 1024)
    with NotAController(b"[" + b"1," * (2 * 1024 * 1024)) as fake:
        r = run("status", "--url", fake.url)
    assert r.exit_code == 1
    assert "more than 1048576 bytes" in one_error_line(r)
