"""router/dataplane.py without HAProxy: the configuration it writes, the Host rule against the
Python one, weights, the runtime pushes, ``show stat`` into the router's series (a real capture of
HAProxy 2.6.12's ``show stat``, tests/data/haproxy_2.6_show_stat.csv: two replicas, 6 answers of
2xx and one 400, taken from ``inferctl router --data-plane haproxy`` on 2026-12-04), and the CLI's
refusals. tests/contract/test_router_dataplane_haproxy.py runs the real binary."""

import asyncio
import json
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.contract.hosts import host_allowed
from inferctl.router import dataplane as dp
from inferctl.router.config import ConfigError, RouterConfig, parse_engine
from inferctl.router.metrics import build_router_registry
from inferctl.router.replicas import ReplicaSet
from inferctl.router.ratelimit import KeyLimit

STAT = Path(__file__).resolve().parents[1] / "data" / "haproxy_2.6_show_stat.csv"


def _config(**kw) -> RouterConfig:
    engines = kw.pop("engines", ("e0=http://127.0.0.1:9001", "e1=http://[::1]:9002"))
    return RouterConfig(engines=tuple(parse_engine(e) for e in engines), **kw).validate()


def _render(config=None, **kw) -> str:
    args = dict(bind_host="127.0.0.1", port=8080, control_port=8081, socket_path="/run/x/h.sock", files="/run/x")
    args.update(kw)
    return dp.render_config(config or _config(), **args)


# --- configuration ------------------------------------------------------------------------------------

def test_config_has_one_disabled_server_per_engine_named_as_the_engine():
    text = _render()
    servers = [line.split() for line in text.splitlines() if line.strip().startswith("server ")]
    assert servers == [["server", "e0", "127.0.0.1:9001", "disabled", "weight", "100", "maxconn", "1000"],
                       ["server", "e1", "[::1]:9002", "disabled", "weight", "100", "maxconn", "1000"],
                       ["server", "control", "127.0.0.1:8081"]]


def test_config_carries_the_router_settings():
    text = _render(_config(epsilon=0.5, max_retries=3, max_body_bytes=1000, affinity_chars=100,
                           affinity_min_chars=10, upstream_timeout_seconds=90, retry_after_seconds=4))
    assert "    hash-balance-factor 150" in text                # 100 x (1 + epsilon): the Python ring's bound
    assert "    retries 3" in text
    assert "gt 1000 }" in text                                  # 413 above --max-body-bytes
    assert "bytes(0,100)" in text and "length ge 10 }" in text  # --affinity-chars / --affinity-min-chars
    assert "    timeout server 90s" in text
    assert "hdr retry-after 4 if { nbsrv lt 1 }" in text
    assert "retry-on conn-failure empty-response 503" in text   # never a status sent after bytes
    assert "stats socket /run/x/h.sock mode 600 level admin" in text
    assert "bind 127.0.0.1:8080" in text


def test_config_binds_an_ipv6_host_in_brackets():
    assert "    bind [::1]:8080" in _render(bind_host="::1")


def test_config_refuses_bad_ports_naming_them():
    with pytest.raises(ValueError, match="control_port must be 1..65535"):
        _render(control_port=0)
    with pytest.raises(ValueError, match="port must be 1..65535"):
        _render(port=70000)


def test_server_address_needs_plain_http():
    assert dp.server_address("http://10.0.0.5") == "10.0.0.5:80"
    with pytest.raises(ValueError, match="http://host"):
        dp.server_address("https://10.0.0.5:443")


def test_the_hot_paths_are_the_python_routers_post_routes():
    from inferctl.router.app import create_app
    fast = create_app(_config()).fast_routes
    assert sorted(fast) == sorted(dp.HOT_PATHS)


# --- the Host rule ----------------------------------------------------------------------------------------

HOSTS = ["localhost", "LOCALHOST:8080", "localhost.", "127.0.0.1", "127.9.8.7:1", "[::1]", "[::1]:80",
         "[0:0:0:0:0:0:0:1]", "evil.com", "evil.com:80", "localhost.evil.com", "10.0.0.5", "10.0.0.5:8080",
         "[fe80::1]", "api.example.com", "x.api.example.com", "example.com", "api.example.com.", "xapi.example.com",
         "127.0.0.1.evil.com", "127.0.0.1.", "localhost:99999999", "localhost:abc", "127.999.1.1", "127.0.0.01",
         "[::1]garbage", "localhost:1:2", "10.0.0.5.", "[fe80::1]:8080", "300.1.1.1", "api.example.com:443"]


@pytest.mark.parametrize("bind,allowed", [
    ("127.0.0.1", ()), ("::1", ()), ("localhost", ()),
    ("127.0.0.1", ("api.example.com",)), ("127.0.0.1", ("*.api.example.com",)),
    ("0.0.0.0", ()), ("0.0.0.0", ("api.example.com",)), ("10.0.0.5", ("*.example.com", "example.com")),
    ("0.0.0.0", ("*",)),
])
def test_host_regex_accepts_exactly_what_host_allowed_accepts(bind, allowed):
    pattern = dp.host_regex(bind, allowed)
    for host in HOSTS:
        want = host_allowed(host, bind, allowed)
        got = True if pattern is None else re.search(pattern, host.lower()) is not None
        assert got == want, (host, bind, allowed, pattern)


def test_host_regex_refuses_a_pattern_that_is_not_a_host_name():
    for bad in ("evil.com' || true", "[::1", "a b"):
        with pytest.raises(ConfigError, match="--allowed-host"):
            dp.host_regex("127.0.0.1", (bad,))


def test_a_missing_or_blank_host_is_allowed_as_in_the_python_rule():
    assert host_allowed("", "127.0.0.1") and host_allowed("   ", "127.0.0.1")
    line = next(x for x in _render().splitlines() if "acl host_given" in x)
    given = re.search(r"-m reg '(.*)'", line).group(1)
    assert [bool(re.search(given, v)) for v in ("", "   ", "\t", "a")] == [False, False, False, True]


def test_the_hot_path_rule_needs_post_and_the_path_together():
    text = _render()
    assert "acl hot_method method POST" in text and "acl hot_path path /v1/completions" in text
    assert "    use_backend replicas if hot_method hot_path" in text
    assert " hot " not in text and not re.search(r"if hot($|\s)", text)      # no OR-ed one-name ACL


def test_the_replicas_get_their_own_host_not_the_clients():
    assert "    http-request set-header host 127.0.0.1" in _render(_config(engines=("a=http://127.0.0.1:1",
                                                                                   "b=http://127.0.0.1:2")))
    assert "    http-request set-header host localhost" in _render()      # 127.0.0.1 and ::1: no common name
    assert "    http-request set-header host [::1]" in _render(_config(engines=("a=http://[::1]:1",)))


def test_the_421_body_is_the_python_routers_with_the_host_filled_in():
    from inferctl.contract.hosts import HostRefused
    body = dp.error_bodies(_config(), "127.0.0.1", ("api.example.com",))["host_not_allowed.json"]
    want = HostRefused("evil.com", "127.0.0.1", ("api.example.com",)).message
    filled = json.loads(body.replace("%%", "%").replace(dp.HOST_PLACEHOLDER, "evil.com"))
    assert filled["error"]["message"] == want and filled["error"]["code"] == "host_not_allowed"


def test_haproxys_own_errors_are_openai_json_with_a_right_length():
    bodies = dp.error_bodies(_config(), "127.0.0.1", ())
    for status in (400, 408, 502, 504):
        head, _, body = bodies[f"error-{status}.http"].partition("\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status} ")
        assert f"content-length: {len(body.encode())}" in head
        assert json.loads(body)["error"]["code"]
    assert "errorfile 504 /run/x/error-504.http" in _render()


# --- weights and pushes -------------------------------------------------------------------------------------

def test_weight_follows_kv_use_in_quarter_steps():
    replicas = ReplicaSet.from_specs(_config().engines)
    r = replicas["e0"]
    seen = []
    for kv in (None, 0.0, 0.1, 0.25, 0.5, 0.74, 1.0, 7.0, -1.0):
        r.kv_usage_ratio = kv
        seen.append(dp.weight_for(r))
    assert seen == [100, 100, 100, 80, 67, 57, 50, 50, 100]


class _Runtime:
    def __init__(self, answers=None):
        self.sent = []
        self.answers = answers or {}

    async def command(self, text):
        self.sent.append(text)
        return self.answers.get(text, "\n")


def _sync(runtime, proc=None):
    replicas = ReplicaSet.from_specs(_config().engines)
    _registry, metrics = build_router_registry()
    return dp.DataPlaneSync(runtime, replicas, metrics, proc=proc), replicas, metrics


def test_push_sends_state_changes_only():
    runtime = _Runtime()
    sync, replicas, _ = _sync(runtime)
    replicas["e0"].ready, replicas["e0"].reason = True, None
    asyncio.run(sync.push())
    assert runtime.sent == ["set server replicas/e0 weight 100", "set server replicas/e0 state ready",
                            "set server replicas/e1 weight 100", "set server replicas/e1 state maint"]
    runtime.sent.clear()
    asyncio.run(sync.push())
    assert runtime.sent == []                                       # nothing changed
    replicas["e0"].blocked = "draining"                             # the controller's view keeps it away
    replicas["e1"].kv_usage_ratio = 0.5
    asyncio.run(sync.push())
    assert runtime.sent == ["set server replicas/e0 weight 100", "set server replicas/e0 state maint",
                            "set server replicas/e1 weight 67", "set server replicas/e1 state maint"]


def test_a_refused_command_raises_and_the_next_push_resends_everything():
    runtime = _Runtime({"set server replicas/e1 state maint": "No such server.\n"})
    sync, replicas, _ = _sync(runtime)
    with pytest.raises(dp.RuntimeApiError, match="No such server"):
        asyncio.run(sync.push())
    runtime.answers.clear()
    runtime.sent.clear()
    asyncio.run(sync.push())
    assert len(runtime.sent) == 4                                   # e0 again too


def test_tick_raises_once_haproxy_has_exited():
    proc = subprocess.Popen(["true"])
    proc.wait()
    sync, _, _ = _sync(_Runtime(), proc=proc)
    with pytest.raises(dp.DataPlaneExited, match="exited with status 0"):
        asyncio.run(sync.tick())


# --- show stat into the router's series ------------------------------------------------------------------------

def test_parse_stat_reads_the_servers_of_the_replicas_backend():
    stats = dp.parse_stat(STAT.read_text())
    assert sorted(stats) == ["e0", "e1"]
    assert (stats["e0"]["hrsp_2xx"], stats["e0"]["hrsp_4xx"], stats["e1"]["hrsp_2xx"]) == ("2", "1", "4")


def _sample(metrics, name, **labels):
    from prometheus_client import generate_latest  # noqa: F401 - the metric's own samples
    for family in metrics[name].collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.labels == labels:
                return s.value
    return None


def test_apply_stats_counts_increments_and_a_restart():
    sync, replicas, metrics = _sync(_Runtime())
    stats = dp.parse_stat(STAT.read_text())
    dp.apply_stats(stats, replicas, metrics, sync.counters)
    assert _sample(metrics, "inferctl_router_requests_total", replica="e0", status="2xx") == 2
    assert _sample(metrics, "inferctl_router_requests_total", replica="e0", status="4xx") == 1
    assert _sample(metrics, "inferctl_router_requests_total", replica="e1", status="2xx") == 4
    assert _sample(metrics, "inferctl_router_requests_total", replica="e1", status="5xx") is None   # no data
    assert _sample(metrics, "inferctl_router_retries_total", replica="e0", reason="dataplane") is None
    later = {k: dict(v) for k, v in stats.items()}
    later["e1"]["hrsp_2xx"], later["e1"]["wredis"], later["e1"]["scur"] = "10", "3", "5"
    dp.apply_stats(later, replicas, metrics, sync.counters)
    assert _sample(metrics, "inferctl_router_requests_total", replica="e1", status="2xx") == 10
    assert _sample(metrics, "inferctl_router_retries_total", replica="e1", reason="dataplane") == 3
    assert replicas["e1"].outstanding == 5
    restarted = {k: dict(v) for k, v in stats.items()}
    restarted["e1"]["hrsp_2xx"] = "1"                           # HAProxy's totals started again
    dp.apply_stats(restarted, replicas, metrics, sync.counters)
    assert _sample(metrics, "inferctl_router_requests_total", replica="e1", status="2xx") == 11


def test_apply_stats_leaves_a_missing_server_or_empty_column_alone():
    sync, replicas, metrics = _sync(_Runtime())
    replicas["e0"].outstanding = 7
    dp.apply_stats({"e0": {"hrsp_2xx": "", "scur": ""}}, replicas, metrics, sync.counters)
    assert replicas["e0"].outstanding == 7
    assert _sample(metrics, "inferctl_router_requests_total", replica="e0", status="2xx") is None


# --- what the HAProxy plane does not carry --------------------------------------------------------------------

def test_unsupported_names_each_setting():
    cfg = _config(engines=("a=http://h:1", "b=https://h:2"), api_key="k", upstream_api_key="u",
                  rate_default=KeyLimit("default", 10, None))
    got = dp.unsupported(cfg)
    assert got[:3] == ["--api-key", "--upstream-api-key-env (or the config file's upstream_api_key_env)",
                       "rate_limits (the --config file)"]
    assert got[3:] == ["--engine b=https://h:2 (https)"]
    assert dp.unsupported(_config()) == []


def test_find_haproxy_refuses_a_path_that_is_not_executable(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not an executable file"):
        dp.find_haproxy(str(tmp_path / "nothing"))


@pytest.mark.parametrize("args,needle", [
    (["--data-plane", "nginx"], "--data-plane: 'nginx' is not one of python, haproxy"),
    (["--data-plane", "haproxy", "--api-key", "k"], "--data-plane haproxy does not carry --api-key"),
    (["--data-plane", "haproxy", "--haproxy", "/no/such/haproxy"], "--haproxy: '/no/such/haproxy' is not an"),
    (["--data-plane", "haproxy", "--haproxy", "none"], "no HAProxy binary found"),
])
def test_cli_refuses_with_exit_2_naming_the_flag(args, needle):
    result = CliRunner().invoke(app, ["router", "--engine", "e0=http://127.0.0.1:9", "--port", "1", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output


# --- the driver: what a probe round's hook does with HAProxy's state -----------------------------------------------

class _Server:
    def __init__(self, signalled=0):
        self.signalled = signalled
        self.should_exit = False


class _State:
    def __init__(self):
        self.replicas = ReplicaSet.from_specs(_config().engines)
        _registry, self.metrics = build_router_registry()


def _exited():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc


def test_driver_stops_the_router_once_when_haproxy_dies_on_its_own(caplog):
    server = _Server()
    driver = dp.Driver(_Runtime(), _exited(), server=server)
    asyncio.run(driver.after_round(_State()))
    asyncio.run(driver.after_round(_State()))
    assert driver.died == "HAProxy exited with status 0" and server.should_exit
    assert sum("the router stops" in r.message for r in caplog.records) == 1


def test_driver_takes_the_soft_stop_after_a_signal_for_no_failure(caplog):
    server = _Server(signalled=1)                  # SIGTERM: HAProxy is being soft-stopped on purpose
    runtime = _Runtime()
    driver = dp.Driver(runtime, _exited(), server=server)
    asyncio.run(driver.after_round(_State()))
    assert driver.died is None and not server.should_exit and runtime.sent == []
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]


def test_driver_warns_once_per_runtime_failure_streak(caplog):
    class Down:
        async def command(self, text):
            raise dp.RuntimeApiError("HAProxy runtime socket /x: refused")

    caplog.set_level("INFO", logger="inferctl.router.dataplane")
    driver = dp.Driver(Down(), None, server=_Server())
    state = _State()
    for _ in range(3):
        asyncio.run(driver.after_round(state))
    assert driver.failing and sum(r.levelname == "WARNING" for r in caplog.records) == 1
    driver.runtime = driver.sync.runtime = _Runtime()
    asyncio.run(driver.after_round(state))
    assert not driver.failing and any("answers again" in r.message for r in caplog.records)


def test_the_python_planes_own_series_are_absent_not_zero():
    from prometheus_client import generate_latest
    registry, metrics = build_router_registry()
    before = generate_latest(registry).decode()
    assert "inferctl_router_overhead_seconds_count 0.0" in before        # what the HAProxy plane used to show
    dp.drop_python_plane_series(registry, metrics)
    after = generate_latest(registry).decode()
    assert "inferctl_router_overhead_seconds" not in after and "inferctl_router_affinity_keys" not in after
    assert "inferctl_router_replicas_ready" in after                     # the probes' gauges stay


def test_cli_refuses_a_bad_haproxy_environment_variable_and_shows_the_help_metavar():
    result = CliRunner().invoke(app, ["router", "--engine", "e0=http://127.0.0.1:9", "--data-plane", "haproxy"],
                                env={"INFERCTL_HAPROXY": "/no/such/haproxy"})
    assert result.exit_code == 2 and "$INFERCTL_HAPROXY: '/no/such/haproxy' is not an executable file" in result.output
    assert "--data-plane python|haproxy" in CliRunner().invoke(app, ["router", "--help"], terminal_width=200).output
