"""The bind address of the engine, the router and the controller (hostile-input E1/R3): one
validator, :func:`inferctl.contract.hosts.check_bind_host`; a bad ``--host`` exits 2 naming the
flag before anything loads or binds (it said "port 8000 is in use on bad host!" / exited 3)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.contract.hosts import check_bind_host

BAD_MESSAGE = "--host: 'bad host!' is not a host name or address"


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1%eth0", "localhost",
                                  "my-box.example.com", "example.com.", "a" * 63])
def test_addresses_and_host_names_pass(host):
    assert check_bind_host(host) == host


@pytest.mark.parametrize("host", ["bad host!", "", " ", "-lead.example", "trail-.example", "a..b", "a" * 64,
                                  "x_y", "[::1]", "http://127.0.0.1", "127.0.0.1:80", ".".join(["a" * 60] * 5)])
def test_anything_else_is_refused_naming_the_source(host):
    with pytest.raises(ValueError) as e:
        check_bind_host(host, "listen.host")
    assert str(e.value) == f"listen.host: {host!r} is not a host name or address"


@pytest.mark.parametrize("argv", [["engine", "serve", "--host", "bad host!"],
                                  ["router", "--host", "bad host!", "--engine", "e0=http://127.0.0.1:8000"]])
def test_engine_and_router_exit_2_naming_the_flag(argv):
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    assert BAD_MESSAGE in res.output and "in use" not in res.output


def test_controller_config_refuses_a_bad_listen_host():
    from inferctl.controller.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as e:
        parse_config({"listen": {"host": "bad host!"}})
    assert "listen.host" in str(e.value) and "'bad host!' is not a host name or address" in str(e.value)
    assert parse_config({"listen": {"host": "0.0.0.0"}}).listen.host == "0.0.0.0"


def test_controller_config_refuses_a_bad_launch_host():
    from inferctl.controller.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as e:
        parse_config({"engines": [{"name": "e", "launch": {"host": "bad host!", "port": 8001}}]})
    assert "launch.host: 'bad host!' is not a host name or address" in str(e.value)


def test_engine_serve_says_a_host_name_that_does_not_resolve_instead_of_port_in_use():
    res = CliRunner().invoke(app, ["engine", "serve", "--host", "nosuchhost.invalid"])   # RFC 6761: never resolves
    assert res.exit_code == 2, res.output
    assert "--host: 'nosuchhost.invalid' does not resolve" in res.output and "in use" not in res.output
