"""``inferctl engine serve --num-threads``: validated by the CLI and carried into the engine's config."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from inferctl.cli import app


def _serve(args: list[str]) -> tuple[object, list]:
    return CliRunner().invoke(app, ["engine", "serve", "--model", "demo", "--port", "0", "--device", "cpu", *args])


def test_num_threads_reaches_the_engine_config(monkeypatch):
    seen = []

    def capture(bundle, config, precision, budget_flag="--memory-budget"):  # noqa: ANN001, ANN202
        seen.append(config.num_threads)
        raise typer.Exit(7)

    monkeypatch.setattr("inferctl.engine.cli._build_engine", capture)
    r = _serve(["--num-threads", "3"])
    assert r.exit_code == 7 and seen == [3]
    seen.clear()
    assert _serve([]).exit_code == 7 and seen == [None]   # unset: torch's default (the engine's tiny rule)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_bad_num_threads_is_refused_naming_the_flag(value):
    r = _serve(["--num-threads", value])
    assert r.exit_code == 2
    assert "--num-threads" in r.output + (r.stderr if r.stderr_bytes is not None else "")
