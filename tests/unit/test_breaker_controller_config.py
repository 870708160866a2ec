"""Breaking the controller's configuration: each bad file is one clear line naming the field,
exit code 2, no traceback — from ``load_config`` / ``build_runtime`` and through the CLI."""

from __future__ import annotations

import re
import sqlite3

import pytest
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.controller.config import ConfigError, load_config, parse_config
from inferctl.controller.runtime import build_runtime
from tests.controller_helpers import free_port

TRACE = ('{"t": 0, "gpus": [{"uuid": "GPU-a", "index": 0, "memory_total_mib": 81920,'
         ' "memory_used_mib": 100, "memory_free_mib": 81820, "memory_reserved_mib": 0}]}\n')


def watched(tmp_path, **extra) -> dict:
    """A config that starts nothing heavy: one watched (not launched) engine, a replay GPU."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    data = {"listen": {"port": 0}, "event_log": str(tmp_path / "ev.db"),
            "engines": [{"name": "a", "kind": "vllm", "url": "http://127.0.0.1:9"}],
            "gpu": {"kind": "replay", "options": {"path": str(trace)}}}
    data.update(extra)
    return data


# --------------------------------------------------------------------------- parse errors
@pytest.mark.parametrize("data, field", [
    ({"engines": [{"name": "a", "url": "http://h:99999"}]}, "engines[0].url"),
    ({"engines": [{"name": "a", "url": "http://h:0x50"}]}, "engines[0].url"),
    ({"intervals": {"max_backoff_seconds": float("inf")}}, "intervals.max_backoff_seconds"),
    ({"rails": {"command_timeout_seconds": float("inf")}}, "rails.command_timeout_seconds"),
    ({"rails": {"reset_min_interval_seconds": float("inf")}}, "rails.reset_min_interval_seconds"),
    ({"engines": [{"name": "a", "launch": {"health_timeout_seconds": float("nan")}}]},
     "engines[0].launch.health_timeout_seconds"),
    ({"event_log": ""}, "event_log"),
    ({"gpu": {"kind": "dcgm"}}, "gpu.options.url"),
    ({"gpu": {"kind": "replay"}}, "gpu.options.path"),
    ({"gpu": {"kind": "replay", "options": {"pathh": "/x"}}}, "gpu.options.pathh"),
    ({"gpu": {"kind": "dcgm", "options": {"url": "http://h:9400/metrics", "timeout": 1}}}, "gpu.options.timeout"),
], ids=["url-port-range", "url-port-hex", "backoff-inf", "timeout-inf", "reset-interval-inf", "health-nan",
        "event-log-empty", "dcgm-no-url", "replay-no-path", "replay-typo", "dcgm-typo"])
def test_bad_values_name_the_field(data, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        parse_config(data)


def test_known_gpu_options_still_load():
    cfg = parse_config({"gpu": {"kind": "dcgm", "options": {"url": "http://h:9400/metrics", "timeout_s": 0.5}}})
    assert cfg.gpu.options == {"url": "http://h:9400/metrics", "timeout_s": 0.5}
    assert parse_config({"gpu": {"kind": "auto", "options": {"engine_stats_url": "http://h/stats"}}}).gpu.kind == "auto"


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path):
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe bad bytes\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(bad)


# --------------------------------------------------------------------------- start-up errors
def test_missing_files_are_config_errors_naming_the_field(tmp_path):
    cases = [
        ({"gpu": {"kind": "replay", "options": {"path": str(tmp_path / "nope.jsonl")}}}, "gpu.options.path"),
        ({"engines": [{"name": "m", "launch": {"model": str(tmp_path / "nope.bin"), "port": free_port()}}]},
         "engines[0].launch.model"),
        ({"policies": {"hardware": {"xid_catalog_dir": str(tmp_path / "nodir")}}}, "policies.hardware.xid_catalog_dir"),
    ]
    for extra, field in cases:
        with pytest.raises(ConfigError, match=re.escape(field)):
            build_runtime(parse_config(watched(tmp_path, **extra)), "tok")


def test_a_broken_replay_trace_is_a_config_error_naming_the_line(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(TRACE + "{not json\n")
    cfg = parse_config(watched(tmp_path, gpu={"kind": "replay", "options": {"path": str(trace)}}))
    with pytest.raises(ConfigError, match=r"gpu\.options\.path: .*bad\.jsonl:2"):
        build_runtime(cfg, "tok")
    trace.write_text('{"t": 0, "gpus": [{"uuid": "GPU-a", "index": 0, "memory_total_bytes": "abc"}]}\n')
    with pytest.raises(ConfigError, match=r"gpu\.options\.path: .*memory_total_bytes"):
        build_runtime(cfg, "tok")


@pytest.mark.parametrize("kind", ["corrupt", "truncated", "directory", "under-a-file"])
def test_an_unusable_event_log_is_a_config_error_at_start(tmp_path, kind):
    if kind == "corrupt":
        path = tmp_path / "ev.db"
        path.write_bytes(b"this is not sqlite at all " * 200)
    elif kind == "truncated":
        path = tmp_path / "ev.db"
        good = sqlite3.connect(path)
        good.execute("CREATE TABLE t(x)")
        good.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 200)
        good.commit()
        good.close()
        path.write_bytes(path.read_bytes()[:3000])
    elif kind == "directory":
        path = tmp_path
    else:
        (tmp_path / "afile").write_text("x")
        path = tmp_path / "afile" / "ev.db"
    cfg = parse_config(watched(tmp_path, event_log=str(path)))
    with pytest.raises(ConfigError, match=r"^event_log: "):
        build_runtime(cfg, "tok")


# --------------------------------------------------------------------------- through the CLI
@pytest.mark.parametrize("command", ["controller run", "up"])
@pytest.mark.parametrize("case", ["binary", "dcgm-no-url", "replay-missing", "corrupt-db", "model-missing",
                                  "url-port", "gpu-option-typo"])
def test_cli_bad_config_is_one_line_exit_2(tmp_path, monkeypatch, command, case):
    import yaml

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INFERCTL_ADMIN_TOKEN", raising=False)
    path = tmp_path / "c.yaml"
    data = watched(tmp_path)
    field = {"binary": "not UTF-8", "dcgm-no-url": "gpu.options.url", "replay-missing": "gpu.options.path",
             "corrupt-db": "event_log", "model-missing": "engines[0].launch.model", "url-port": "engines[0].url",
             "gpu-option-typo": "gpu.options.pathh"}[case]
    if case == "dcgm-no-url":
        data["gpu"] = {"kind": "dcgm"}
    elif case == "replay-missing":
        data["gpu"]["options"]["path"] = str(tmp_path / "missing.jsonl")
    elif case == "corrupt-db":
        (tmp_path / "ev.db").write_bytes(b"garbage " * 500)
    elif case == "model-missing":
        data["engines"] = [{"name": "m", "launch": {"model": str(tmp_path / "nope.bin"), "port": free_port()}}]
    elif case == "url-port":
        data["engines"][0]["url"] = "http://127.0.0.1:70000"
    elif case == "gpu-option-typo":
        data["gpu"]["options"]["pathh"] = "x"
    if case == "binary":
        path.write_bytes(b"\xff\xfe\x00 not yaml")
    else:
        path.write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(app, command.split() + ["--config", str(path), "--token", "t" * 16])
    assert r.exit_code == 2, (r.exit_code, r.output, repr(r.exception))
    assert field in r.output and "Traceback" not in r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.output


@pytest.mark.parametrize("data, field", [
    ({"intervals": {"engine_poll_seconds": "1"}}, "intervals.engine_poll_seconds"),
    ({"intervals": {"engine_poll_seconds": True}}, "intervals.engine_poll_seconds"),
    ({"listen": {"port": "8900"}}, "listen.port"),
    ({"listen": {"port": True}}, "listen.port"),
    ({"listen": {"port": 8900.0}}, "listen.port"),
], ids=["float-as-string", "float-as-bool", "int-as-string", "int-as-bool", "int-as-float"])
def test_values_of_the_wrong_yaml_type_are_refused_not_coerced(data, field):
    """A quoted number or a YAML boolean where a number belongs is a typo the operator must see,
    not a value silently converted (``"1"`` → 1, ``true`` → 1)."""
    with pytest.raises(ConfigError, match=re.escape(field)):
        parse_config(data)


def test_an_integer_is_still_a_valid_float_setting():
    assert parse_config({"intervals": {"engine_poll_seconds": 2}}).intervals.engine_poll_seconds == 2.0


@pytest.mark.parametrize("value, message", [(-1, "a size of at least 1 byte"), (True, "a size such as 256MiB")])
def test_event_log_max_bytes_of_the_wrong_kind_says_what_a_size_is(value, message):
    with pytest.raises(ConfigError, match=re.escape(f"event_log_retention.max_bytes: must be {message}")):
        parse_config({"event_log_retention": {"max_bytes": value}})
    assert parse_config({"event_log_retention": {"max_bytes": 4096}}).event_log_retention.max_bytes_value() == 4096


def test_a_maintenance_window_for_an_engine_that_is_not_configured_is_refused(tmp_path):
    window = {"scope": "engine:mian", "reason": "patching", "start": "2026-01-01T00:00:00Z",
              "end": "2026-01-02T00:00:00Z"}
    with pytest.raises(ConfigError, match=re.escape("maintenance[0].scope: 'engine:mian' names no configured"
                                                    " engine (engines: a)")):
        parse_config(watched(tmp_path, maintenance=[window]))
    window["scope"] = "engine:a"
    assert parse_config(watched(tmp_path, maintenance=[window])).maintenance[0].scope == "engine:a"
