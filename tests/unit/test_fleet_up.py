"""`inferctl up --replicas N` configuration, the router's argv, and the engine grace inside the stop timeout."""

from __future__ import annotations

import pytest

from inferctl.controller.config import ConfigError, parse_config
from inferctl.controller.supervisor import engine_serve_argv
from inferctl.controller.router_launch import RouterSpec, router_argv
from inferctl.controller.up_flags import replica_names, up_config


def test_replicas_get_names_and_consecutive_ports_and_the_model_each():
    cfg = up_config(parse_config({}), from_file=False, replicas=3, model="/m.bin", engine_port=9100)
    assert [e.name for e in cfg.engines] == ["main-0", "main-1", "main-2"]
    assert [e.url for e in cfg.engines] == [f"http://127.0.0.1:{p}" for p in (9100, 9101, 9102)]
    assert {e.launch.model for e in cfg.engines} == {"/m.bin"}


def test_replicas_split_the_cores_unless_the_threads_are_given():
    cfg = up_config(parse_config({}), from_file=False, replicas=3, cpus=8)
    assert [e.launch.args for e in cfg.engines] == [["--num-threads", "2"]] * 3
    two_cores = up_config(parse_config({}), from_file=False, replicas=3, cpus=2)
    assert {tuple(e.launch.args) for e in two_cores.engines} == {("--num-threads", "1")}
    given = up_config(parse_config({}), from_file=False, replicas=2, cpus=8, engine_args=["--num-threads=3"])
    assert [e.launch.args for e in given.engines] == [["--num-threads=3"]] * 2
    assert up_config(parse_config({}), from_file=False, replicas=1, cpus=8).engines[0].launch.args == []


def test_one_replica_keeps_the_engine_named_main():
    cfg = up_config(parse_config({}), from_file=False, replicas=1)
    assert [e.name for e in cfg.engines] == ["main"] and replica_names(1) == ["main"]


def test_replicas_with_engines_in_the_config_is_an_error_naming_the_flag():
    cfg = parse_config({"engines": [{"name": "a", "url": "http://127.0.0.1:9"}]})
    with pytest.raises(ConfigError, match="--replicas"):
        up_config(cfg, from_file=True, replicas=2)
    with pytest.raises(ConfigError, match="--replicas: must be 1..64"):
        up_config(parse_config({}), from_file=False, replicas=65)


def test_router_argv_names_every_replica_and_the_controller():
    argv = router_argv(RouterSpec("127.0.0.1", 8181), [("main-0", "http://h:1"), ("main-1", "http://h:2")],
                       "http://127.0.0.1:8900")
    assert argv[1:4] == ["-m", "inferctl", "router"]
    assert argv[argv.index("--port") + 1] == "8181"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--engine"] == ["main-0=http://h:1", "main-1=http://h:2"]
    assert argv[argv.index("--controller") + 1] == "http://127.0.0.1:8900"


def test_engine_grace_fits_inside_the_stop_timeout():
    launch = parse_config({"engines": [{"name": "a", "launch": {}}]}).engines[0].launch
    assert launch.stop_timeout_seconds == 30 and launch.grace_seconds() == 17   # 30 - (2 x 5 s flush + 3 s)
    argv = engine_serve_argv(8000, shutdown_grace_seconds=launch.grace_seconds())
    assert argv[argv.index("--shutdown-grace-seconds") + 1] == "17"
    mine = engine_serve_argv(8000, extra=["--shutdown-grace-seconds=3"], shutdown_grace_seconds=17)
    assert mine.count("--shutdown-grace-seconds=3") == 1 and "--shutdown-grace-seconds" not in mine
    with pytest.raises(ConfigError, match="shutdown_grace_seconds.*stop_timeout_seconds"):
        parse_config({"engines": [{"name": "a", "launch": {"stop_timeout_seconds": 10, "shutdown_grace_seconds": 30}}]})


def test_rails_keys_have_defaults_and_limits():
    rails = parse_config({}).rails
    assert rails.max_unavailable == 1 and rails.quiet_wait_seconds == 60
    with pytest.raises(ConfigError, match="rails.max_unavailable"):
        parse_config({"rails": {"max_unavailable": 0}})


@pytest.mark.parametrize("value", [True, "1", 1.0])
def test_rails_max_unavailable_is_a_real_integer(value):
    """YAML ``true`` or ``"1"`` is not a replica count: refused naming the key (was coerced to 1)."""
    from inferctl.controller.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"rails\.max_unavailable"):
        parse_config({"rails": {"max_unavailable": value}})


def test_router_argv_carries_the_haproxy_data_plane_and_python_adds_nothing():
    engines = [("main-0", "http://h:1")]
    argv = router_argv(RouterSpec("127.0.0.1", 8181, "haproxy"), engines, "http://c:9")
    assert argv[argv.index("--data-plane") + 1] == "haproxy"
    assert "--data-plane" not in router_argv(RouterSpec("127.0.0.1", 8181), engines, "http://c:9")


def test_up_refuses_the_haproxy_data_plane_with_api_keys_before_starting_the_router(monkeypatch):
    from inferctl.controller import up
    from inferctl.controller.config_launch import API_KEY_ENV

    monkeypatch.setenv(API_KEY_ENV, "k" * 32)
    config = up_config(parse_config({}), from_file=False, replicas=2, model="/m.bin", engine_port=9100)
    with pytest.raises(RuntimeError, match="--router-data-plane haproxy does not carry API keys"):
        up._start_router(RouterSpec("127.0.0.1", 1, "haproxy"), config, "http://c:9", None)


def test_up_refuses_an_unknown_router_data_plane_with_exit_2():
    from typer.testing import CliRunner

    from inferctl.cli import app
    result = CliRunner().invoke(app, ["up", "--replicas", "2", "--router-data-plane", "envoy"])
    assert result.exit_code == 2 and "--router-data-plane: 'envoy' is not one of python, haproxy" in result.output


@pytest.mark.parametrize("args,env,needle", [
    (["--replicas", "2"], {"INFERCTL_API_KEY": "k" * 32}, "--router-data-plane haproxy does not carry API keys"),
    (["--replicas", "1"], {}, "--router-data-plane: no router is started (one replica)"),
])
def test_up_refuses_an_unusable_router_data_plane_before_starting_anything(monkeypatch, args, env, needle):
    from typer.testing import CliRunner

    from inferctl.cli import app
    from inferctl.controller import cli_run

    monkeypatch.setattr(cli_run, "_run_config", lambda *a, **k: pytest.fail("up started the fleet"))
    result = CliRunner().invoke(app, ["up", *args, "--router-data-plane", "haproxy", "--model", "/m.bin"], env=env)
    assert result.exit_code == 2, result.output
    assert needle in result.output
