"""Every help page of ``inferctl`` shows placeholders that say what to type (``--port PORT``,
``--model PATH``, ``--memory-budget SIZE``), never typer's type names (``<str>``, ``<int range>``)."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.help_names import placeholder

TYPE_NAMES = re.compile(r"<(?:str|int|float|bool|path|dir|file|list\[[^\]]*\])(?: range)?>"
                        r"|\b(?:INTEGER|FLOAT|BOOLEAN)\b")


def _paths(cmd, path=()):
    yield list(path)
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _paths(sub, (*path, name))


ALL = list(_paths(typer.main.get_command(app)))


def _help(path: list[str]) -> str:
    r = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    return r.output


def test_every_command_is_covered():
    assert len(ALL) > 25 and ["up"] in ALL and ["engine", "serve"] in ALL and ["plan"] in ALL


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "inferctl")
def test_no_help_page_shows_type_names(path):
    found = TYPE_NAMES.findall(_help(path))
    assert found == [], f"inferctl {' '.join(path)} --help shows {found}"


def test_placeholders_say_what_to_type():
    up = _help(["up"])
    for text in ("--model PATH", "--router-port PORT", "--memory-budget SIZE", "--token-file PATH",
                 "--token TOKEN", "--replicas N"):
        assert text in up
    assert re.search(r"^\s+MODEL\s{2,}Model path", up, re.M)      # the argument: its name, no type
    serve = _help(["engine", "serve"])
    assert "--max-model-len TOKENS" in serve and "--gpu-memory-utilization FRACTION" in serve
    assert "--engine NAME=URL" in _help(["router"])
    status = _help(["status"])
    assert "--url URL" in status and re.search(r"--json\s{2,}", status)   # a flag takes no value


def test_placeholder_rules():
    assert placeholder("--engine-port", int) == "PORT"
    assert placeholder("--max-body-bytes", str) == "SIZE"
    assert placeholder("--served-model-name", str) == "NAME"
    assert placeholder("--top-k", int) == "N" and placeholder("--top-p", float) == "NUMBER"
    assert placeholder("--log-format", str) == "FORMAT"
