"""The router's upstream API key (issue 9, hole 3): read from an environment variable only
(``--upstream-api-key-env`` / ``upstream_api_key_env``), validated, never printed; ``inferctl up``
hands the launched engines' key to its router through the environment, never argv."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from inferctl.cli import app as cli_app
from inferctl.controller.config import parse_config
from inferctl.controller.router_launch import UPSTREAM_KEY_ENV, RouterSpec, router_argv, upstream_key
from inferctl.router.config import ConfigError, EngineSpec, RouterConfig, load_config_file, upstream_key_from_env

KEY = "sk-fleet-0123"


def test_the_key_comes_from_the_named_variable_stripped():
    assert upstream_key_from_env("K", {"K": KEY + "\n"}) == KEY


@pytest.mark.parametrize("var, env, expected", [
    ("K", {}, "environment variable K is not set or empty"),
    ("K", {"K": "  "}, "environment variable K is not set or empty"),
    ("not a name", {}, "is not an environment variable name"),
    ("K", {"K": "two words"}, "--upstream-api-key-env: $K:"),
])
def test_a_bad_variable_or_key_is_refused_naming_the_flag_never_the_value(var, env, expected):
    with pytest.raises(ConfigError, match="--upstream-api-key-env") as err:
        upstream_key_from_env(var, env)
    assert expected in str(err.value) and "two words" not in str(err.value)


def test_config_file_key_and_repr_never_shows_the_key(tmp_path):
    f = tmp_path / "router.yaml"
    f.write_text("engines: [{name: a, url: 'http://127.0.0.1:1'}]\nupstream_api_key_env: FLEET_KEY\n")
    loaded = load_config_file(str(f), env={"FLEET_KEY": KEY})
    assert loaded["upstream_api_key"] == KEY
    with pytest.raises(ConfigError, match="upstream_api_key_env: environment variable FLEET_KEY is not set"):
        load_config_file(str(f), env={})
    cfg = RouterConfig(engines=(EngineSpec("a", "http://127.0.0.1:1"),), upstream_api_key=KEY)
    assert KEY not in repr(cfg)


def test_cli_refuses_an_unset_variable_with_exit_2(monkeypatch):
    monkeypatch.delenv("NO_SUCH_FLEET_KEY", raising=False)
    res = CliRunner().invoke(cli_app, ["router", "--engine", "a=http://127.0.0.1:1",
                                       "--upstream-api-key-env", "NO_SUCH_FLEET_KEY"])
    assert res.exit_code == 2
    assert "--upstream-api-key-env: environment variable NO_SUCH_FLEET_KEY is not set" in res.output


def launched(*keys):
    return parse_config({"engines": [{"name": f"e{i}", "launch": {"port": 9100 + i, "api_key": k}}
                                     for i, k in enumerate(keys)]})


def test_up_hands_the_engines_key_to_the_router_by_variable_name_only():
    assert upstream_key(launched(KEY, KEY), environ={}) == KEY
    assert upstream_key(launched(None, None), environ={}) is None
    # INFERCTL_API_KEY=... inferctl up --replicas N: every engine inherits it, so the router needs it
    assert upstream_key(launched(None, None), environ={"INFERCTL_API_KEY": KEY}) == KEY
    argv = router_argv(RouterSpec(), [("e0", "http://h:1")], "http://c:1", UPSTREAM_KEY_ENV)
    assert argv[argv.index("--upstream-api-key-env") + 1] == UPSTREAM_KEY_ENV and KEY not in " ".join(argv)
    assert "--upstream-api-key-env" not in router_argv(RouterSpec(), [("e0", "http://h:1")], "http://c:1")


def test_up_refuses_engines_with_different_keys_behind_one_router():
    with pytest.raises(RuntimeError, match="different API keys"):
        upstream_key(launched(KEY, "sk-other-key"), environ={})


def test_up_sets_the_routers_keys_explicitly_one_key_at_the_front_door():
    from inferctl.controller.router_launch import router_env

    shell = "sk-shell-key-9"
    # the shell's key is the front door; engines with their own launch key are reached with it
    assert router_env(launched(KEY, KEY), environ={"INFERCTL_API_KEY": shell}) == {
        "INFERCTL_API_KEY": shell, UPSTREAM_KEY_ENV: KEY}
    # INFERCTL_API_KEY=K inferctl up --replicas N: every engine inherits K, and so does the router, now explicitly
    assert router_env(launched(None, None), environ={"INFERCTL_API_KEY": shell}) == {
        "INFERCTL_API_KEY": shell, UPSTREAM_KEY_ENV: shell}
    # engines with a key and no shell key: the router guards /v1 with the engines' key (never open)
    assert router_env(launched(KEY, None), environ={}) == {"INFERCTL_API_KEY": KEY, UPSTREAM_KEY_ENV: KEY}
    assert router_env(launched(None, None), environ={}) == {}
    assert router_env(launched(None, None), environ={"INFERCTL_API_KEY": ""}) == {}


@pytest.mark.parametrize("bad", ["   ", "two words", "ключ"])
def test_up_refuses_a_shell_key_no_client_could_send_naming_the_variable_never_the_value(bad):
    from inferctl.controller.router_launch import router_env

    with pytest.raises(RuntimeError, match=r"router: \$INFERCTL_API_KEY: the API key") as err:
        router_env(launched(KEY), environ={"INFERCTL_API_KEY": bad})
    assert bad.strip() == "" or bad not in str(err.value)


def test_up_starts_its_router_with_the_keys_in_its_environment_never_argv(monkeypatch, tmp_path):
    from inferctl.controller import up

    started = []

    class FakeSupervisor:
        def __init__(self, name, argv, url, env=None, **kw):
            started.append((argv, env))

        def start(self):
            pass

    monkeypatch.setattr(up, "EngineSupervisor", FakeSupervisor)
    monkeypatch.setenv("INFERCTL_API_KEY", "sk-shell-key-9")
    cfg = parse_config({"engines": [{"name": "e0", "launch": {"port": 9100, "api_key": KEY}}]})
    up._start_router(RouterSpec(port=0), cfg, "http://127.0.0.1:8900", tmp_path)
    argv, env = started[0]
    assert env == {"INFERCTL_API_KEY": "sk-shell-key-9", UPSTREAM_KEY_ENV: KEY}
    assert argv[argv.index("--upstream-api-key-env") + 1] == UPSTREAM_KEY_ENV
    assert KEY not in " ".join(argv) and "sk-shell-key-9" not in " ".join(argv) and "--api-key" not in argv
