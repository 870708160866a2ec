"""contract/envflags.py: one rule for the engine's on/off environment switches, and the engine's CLI
refusing a typo at start (exit 2 naming the variable) instead of leaving the switch on."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from inferctl.contract import envflags
from inferctl.contract.envflags import check_switches, switch, switch_or_default
from inferctl.engine import cpu_kernels, hugepages, onednn


@pytest.mark.parametrize("value,want", [("0", False), ("off", False), (" OFF ", False), ("No", False),
                                        ("f", False), ("n", False), ("false", False),
                                        ("1", True), ("on", True), ("Yes", True), ("TRUE", True), ("t", True),
                                        ("y", True)])
def test_the_words_of_clicks_boolean_flags_in_any_case(value, want):
    assert switch("X", environ={"X": value}) is want


def test_unset_or_empty_gives_the_default():
    assert switch("X", environ={}) is True
    assert switch("X", default=False, environ={}) is False
    assert switch("X", default=False, environ={"X": "  "}) is False


@pytest.mark.parametrize("value", ["of", "2", "disable", "0ff", "yes please"])
def test_any_other_word_is_an_error_naming_the_variable_and_the_words(value):
    with pytest.raises(ValueError, match=rf"^INFERCTL_ONEDNN='{value}': must be one of 0/false/f/no/n/off \(off\)"):
        switch("INFERCTL_ONEDNN", environ={"INFERCTL_ONEDNN": value})


def test_a_read_while_serving_warns_once_and_keeps_the_default(caplog, monkeypatch):
    monkeypatch.setattr(envflags, "_warned", set())
    env = {"INFERCTL_CPU_KERNELS": "of"}
    with caplog.at_level(logging.WARNING, logger="inferctl.contract.envflags"):
        assert switch_or_default("INFERCTL_CPU_KERNELS", environ=env) is True
        assert switch_or_default("INFERCTL_CPU_KERNELS", environ=env) is True
        assert switch_or_default("INFERCTL_CPU_KERNELS", default=False, environ={"INFERCTL_CPU_KERNELS": "x"}) is False
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["INFERCTL_CPU_KERNELS='of': must be one of 0/false/f/no/n/off (off) or 1/true/t/yes/y/on (on);"
                    " using the default (on)",
                    "INFERCTL_CPU_KERNELS='x': must be one of 0/false/f/no/n/off (off) or 1/true/t/yes/y/on (on);"
                    " using the default (off)"]


def test_check_switches_names_the_first_bad_one():
    check_switches({"INFERCTL_CPU_KERNELS": "off", "INFERCTL_ONEDNN": "1", "INFERCTL_HUGEPAGES": ""})
    with pytest.raises(ValueError, match="INFERCTL_HUGEPAGES='nope'"):
        check_switches({"INFERCTL_HUGEPAGES": "nope"})


def test_the_three_engine_switches_follow_the_one_rule(monkeypatch):
    for name, enabled in (("INFERCTL_CPU_KERNELS", cpu_kernels.enabled), ("INFERCTL_ONEDNN", onednn.enabled)):
        monkeypatch.setenv(name, "Off")
        assert enabled() is False, name
        monkeypatch.setenv(name, "yes")
        assert enabled() is True, name
    # hugepages: "off" used to leave it on (only "0" turned it off)
    monkeypatch.setenv("INFERCTL_HUGEPAGES", "off")
    assert hugepages.enabled() is False
    monkeypatch.setenv("INFERCTL_HUGEPAGES", "0")
    assert hugepages.enabled() is False


def test_engine_serve_refuses_a_typo_before_loading_anything(tmp_path):
    r = subprocess.run([sys.executable, "-m", "inferctl", "engine", "serve", "--model", str(tmp_path / "none.bin")],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "INFERCTL_ONEDNN": "of"})
    assert r.returncode == 2, r.stderr
    assert "INFERCTL_ONEDNN='of': must be one of" in r.stderr
    assert "none.bin" not in r.stderr          # said before the model path was looked at


def test_load_model_refuses_a_typo_before_reading_the_model(monkeypatch, tmp_path):
    # every in-process loader (longtext, the benches) goes through load_model, not only engine serve
    from inferctl.engine.loader import load_model

    monkeypatch.setenv("INFERCTL_HUGEPAGES", "nope")
    with pytest.raises(ValueError, match="INFERCTL_HUGEPAGES='nope': must be one of"):
        load_model(tmp_path / "missing.bin")        # not FileNotFoundError: the switch is checked first


def test_up_refuses_a_typo_before_it_starts_anything(monkeypatch):
    from typer.testing import CliRunner

    from inferctl.cli import app

    started = []
    monkeypatch.setattr("inferctl.controller.cli_run._run_config", lambda *a, **k: started.append(a))
    monkeypatch.setenv("INFERCTL_CPU_KERNELS", "nein")
    res = CliRunner().invoke(app, ["up", "--replicas", "2"])
    assert res.exit_code == 2, res.output
    assert "INFERCTL_CPU_KERNELS='nein': must be one of" in res.output
    assert started == []
    monkeypatch.setenv("INFERCTL_CPU_KERNELS", "off")
    assert CliRunner().invoke(app, ["up", "--replicas", "2"]).exit_code == 0
    assert len(started) == 1
