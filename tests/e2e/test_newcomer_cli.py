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


# ------------------------------------------------------------------ item 6: help
def test_help_flags_have_no_bool_placeholder_and_version_and_up_first():
    status_help = _run("status", "--help").output
    assert "--json" in status_help and "<bool>" not in status_help
    assert "<bool>" not in _run("up", "--help").output
    root = _run("--help").output
    commands = root.split("Commands:")[1].split()
    assert commands[0] == "up"
    version = _run("--version")
    assert version.exit_code == 0 and version.output.startswith("inferctl 0.")


def test_help_paragraphs_are_rewrapped_not_ragged():
    out = CliRunner().invoke(app, ["reset-gpu", "--help"], terminal_width=100).output
    para = out.split("\n\n")[1]                       # the command's description
    lines = [ln.strip() for ln in para.splitlines()]
    # the docstring breaks after "one at a time,": rewrapped, no line but the last is short
    assert all(len(ln) > 50 for ln in lines[:-1]), lines


def test_port_options_say_their_defaults():
    up_help = " ".join(CliRunner().invoke(app, ["up", "--help"], terminal_width=200).output.split())
    assert "--engine-port PORT The engine's port (default 8000" in up_help
    assert "--controller-port PORT The controller's API port (default 8900" in up_help
    assert "--router-port PORT The router's port. [default: 8080" in up_help
    serve_help = " ".join(CliRunner().invoke(app, ["engine", "serve", "--help"], terminal_width=200).output.split())
    assert "--port PORT Port to listen on (0: any free port). [default: 8000" in serve_help


def test_the_help_budget_example_fits_both_bundled_models(stories_dir):
    import torch

    from inferctl.contract.units import parse_size
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.loader import load_model

    up_help = " ".join(CliRunner().invoke(app, ["up", "--help"], terminal_width=200).output.split())
    example = up_help.split("--memory-budget SIZE Engine memory budget, e.g. ")[1].split()[0]
    budget = parse_size(example, "--memory-budget")
    for spec in (None, str(stories_dir / "stories260K.bin")):
        bundle = load_model(spec, device="cpu", dtype=torch.float32)
        engine = LLMEngine(bundle, EngineConfig(memory_budget_bytes=budget))   # raises when it does not fit
        assert engine is not None


# ------------------------------------------------------------------ item 5: the user's flag named
@pytest.mark.parametrize("argv", [["up"], ["engine", "serve"], ["generate", "--prompt", "hi"]])
def test_a_hub_id_as_model_says_it_is_not_downloaded(argv):
    res = _run(*argv, "--model", "HuggingFaceTB/SmolLM2-135M-Instruct", *(["--port", str(free_port())]
                                                                          if argv[-1] == "serve" else []))
    assert res.exit_code == 2, res.output
    assert "--model: 'HuggingFaceTB/SmolLM2-135M-Instruct' looks like a Hugging Face hub id: hub ids are not" \
        " downloaded; give a local path" in res.output


def test_up_bad_budget_names_the_flag():
    res = _run("up", "--memory-budget", "12QB")
    assert res.exit_code == 2 and res.output.startswith("error: --memory-budget:"), res.output


def test_engine_budget_refusal_names_the_flag_not_the_field(stories_dir, capsys):
    import torch
    import typer

    from inferctl.engine import cli as engine_cli
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.loader import load_model

    bundle = load_model(str(stories_dir / "stories260K.bin"), device="cpu", dtype=torch.float32)
    with pytest.raises(typer.Exit):
        engine_cli._build_engine(bundle, EngineConfig(memory_budget_bytes=64 * 2**20), "full")
    err = capsys.readouterr().err
    assert err.startswith("error: --memory-budget: budget 64.00 MiB leaves no room") and "_bytes" not in err
