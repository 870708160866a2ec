"""ControllerConfig: YAML loading, defaults, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import re

import pytest

from inferctl.controller.config import ConfigError, load_config, parse_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "inferctl.yaml"


def test_example_file_loads_with_its_values():
    cfg = load_config(EXAMPLE)
    assert cfg.listen.host == "127.0.0.1" and cfg.listen.port == 8900
    [main] = cfg.engines
    assert main.kind == "bundled" and main.url == "http://127.0.0.1:8000"
    assert main.launch.memory_budget == "512MiB"
    assert cfg.policies.fragmentation.options()["threshold_ratio"] == 0.30
    assert cfg.policies.breaker.options()["ttft_threshold_seconds"] == 0.5
    assert cfg.policies.breaker_active() is False          # no light_model
    assert cfg.policies.precision.options()["hold_seconds"] == 60
    assert cfg.rails.reset_min_interval_seconds == 1800
    assert cfg.intervals.call_timeout_seconds < cfg.intervals.engine_poll_seconds


def test_defaults_listen_on_loopback():
    cfg = parse_config({})
    assert cfg.listen.host == "127.0.0.1"
    assert cfg.rails.dry_run is False
    assert cfg.engines == []


@pytest.mark.parametrize("data, field", [
    ({"intervals": {"engine_poll_seconds": 1.0, "call_timeout_seconds": 1.0}}, "call_timeout_seconds"),
    ({"engines": [{"name": "a", "kind": "vllm"}]}, "url"),
    ({"engines": [{"name": "a", "url": "ftp://x"}]}, "engines[0].url"),
    ({"engines": [{"name": "bad name!", "url": "http://x"}]}, "engines[0].name"),
    ({"engines": [{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}]}, "duplicate name"),
    ({"engines": [{"name": "v", "kind": "vllm", "url": "http://x", "launch": {}}]}, "launch"),
    ({"gpu": {"kind": "quantum"}}, "gpu.kind"),
    ({"rails": {"reset_min_interval_seconds": -5}}, "rails.reset_min_interval_seconds"),
    ({"policies": {"fragmentation": {"threshold_ratio": 1.5}}}, "policies.fragmentation.threshold_ratio"),
    ({"policies": {"precision": {"hold_secs": 3}}}, "policies.precision: PrecisionConfig: unknown field(s) hold_secs"),
    ({"policies": {"breaker": {"light_model": "l", "window_seconds": 0}}}, "policies.breaker.window_seconds"),
    ({"rails": {"dryrun": True}}, "rails.dryrun: unknown key"),
    ({"listen": {"port": 70000}}, "listen.port"),
])
def test_errors_name_the_field(data, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        parse_config(data)


def test_file_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("engines: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(lst)


def test_tokens_from_environment(monkeypatch):
    monkeypatch.setenv("INFERCTL_ADMIN_TOKEN", "s3cret")
    monkeypatch.setenv("VLLM_TOKEN", "vt")
    cfg = parse_config({"engines": [{"name": "v", "kind": "vllm", "url": "http://h:8000/",
                                     "admin_token_env": "VLLM_TOKEN"}]})
    assert cfg.token() == "s3cret"
    assert cfg.engines[0].token() == "vt"
    assert cfg.engines[0].url == "http://h:8000"
