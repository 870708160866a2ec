"""Issue 13, as a newcomer meets the CLI: a busy port said in one line naming the flag (item 3),
vLLM habits — the model as a positional argument, ``inferctl serve`` (item 4)."""

from __future__ import annotations

import socket
from contextlib import contextmanager

import pytest
from typer.testing import CliRunner

from inferctl.cli import app
from tests.controller_helpers import free_port


@contextmanager
def _listening(port: int):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    try:
        yield
    finally:
        s.close()


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("role,flag", [("engine", "--engine-port"), ("controller", "--controller-port"),
                                       ("router", "--router-port")])
def test_up_says_which_port_is_taken_and_the_flag_before_anything(tmp_path, role, flag):
    ports = {"engine": free_port(), "controller": free_port(), "router": free_port()}
    busy = ports[role]
    with _listening(busy):
        res = _run("up", "--engine-port", str(ports["engine"]), "--controller-port", str(ports["controller"]),
                   "--router-port", str(ports["router"]), "--router", "--engine-log-dir", str(tmp_path))
    assert res.exit_code == 2, res.output
    assert res.output == (f"error: port {busy} ({role}) is in use on 127.0.0.1;"
                          f" choose another with {flag} N\n")


def test_engine_serve_says_the_port_is_taken_before_loading():
    port = free_port()
    with _listening(port):
        res = _run("engine", "serve", "--port", str(port))
    assert res.exit_code == 2
    assert res.output == f"error: port {port} (engine) is in use on 127.0.0.1; choose another with --port N\n"


def test_serve_alias_and_positional_model_reach_engine_serve():
    port = free_port()
    with _listening(port):
        res = _run("serve", "some/model.bin", "--port", str(port))
    # the positional model is accepted (no "unexpected extra argument"); the busy port is the error
    assert res.exit_code == 2 and "is in use" in res.output, res.output


def test_model_given_twice_differently_is_refused():
    res = _run("engine", "serve", "a.bin", "--model", "b.bin")
    assert res.exit_code == 2
    assert "given twice ('a.bin' as MODEL and 'b.bin' as --model)" in res.output
    res = _run("up", "a.bin", "--model", "b.bin")
    assert res.exit_code == 2
    assert "given twice ('a.bin' as MODEL and 'b.bin' as --model)" in res.output


def test_up_positional_model_is_used(tmp_path):
    missing = tmp_path / "nope.bin"
    res = _run("up", str(missing), "--engine-port", str(free_port()), "--controller-port", str(free_port()))
    assert res.exit_code == 2
    assert str(missing) in res.output and "unexpected extra argument" not in res.output
