"""``inferctl engine serve --max-oom-retries / --oom-backoff-seconds / --oom-backoff-max-seconds``:
the values reach every served engine's EngineConfig; bad values fail cleanly naming the flag."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from inferctl.engine.cli import oom_options
from tests.server_helpers import serve_without_listening

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def test_flags_reach_the_engine_config(monkeypatch):
    res, seen = serve_without_listening(monkeypatch, ["--max-oom-retries", "7", "--oom-backoff-seconds", "0.25",
                                                      "--oom-backoff-max-seconds", "1.5"])
    assert res.exit_code == 0, res.output
    [eng] = seen["engines"].values()
    cfg = eng.engine.config
    assert (cfg.max_oom_retries, cfg.oom_backoff_seconds, cfg.oom_backoff_max_seconds) == (7, 0.25, 1.5)


def test_defaults_are_the_engine_config_defaults():
    from inferctl.engine.config import EngineConfig

    d = EngineConfig()
    assert oom_options(3, 0.05, 2.0) == {"max_oom_retries": d.max_oom_retries,
                                         "oom_backoff_seconds": d.oom_backoff_seconds,
                                         "oom_backoff_max_seconds": d.oom_backoff_max_seconds}


@pytest.mark.parametrize("args, flag", [
    ((-1, 0.05, 2.0), "--max-oom-retries"),
    ((3, -0.1, 2.0), "--oom-backoff-seconds"),
    ((3, float("nan"), 2.0), "--oom-backoff-seconds"),
    ((3, 0.05, float("inf")), "--oom-backoff-max-seconds"),
])
def test_oom_options_name_the_flag(args, flag):
    with pytest.raises(typer.BadParameter, match=flag):
        oom_options(*args)


@pytest.mark.parametrize("args, words", [
    (["--max-oom-retries", "-2"], "--max-oom-retries: must be an integer >= 0, got -2"),
    (["--max-oom-retries", "many"], "--max-oom-retries"),
    (["--oom-backoff-seconds", "nan"], "--oom-backoff-seconds: must be a finite number of seconds >= 0"),
    (["--oom-backoff-max-seconds", "-1"], "--oom-backoff-max-seconds"),
])
def test_serve_rejects_bad_oom_flags_before_loading(args, words):
    proc = subprocess.run([sys.executable, "-m", "inferctl", "engine", "serve", "--port", "0",
                           "--model", "/nonexistent/model.bin", *args],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 2
    assert words in proc.stderr
    assert "model not found" not in proc.stderr          # refused before the model is loaded
    assert "Traceback" not in proc.stderr
