"""End to end, real sockets: ``inferctl engine serve`` bound to 127.0.0.1 refuses a foreign
``Host`` (DNS rebinding) and ``text/plain`` bodies, serves probes and scrapes addressed to
127.0.0.1:PORT, and takes its admin token from a file; a short admin token is refused at start."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.server_helpers import free_port, start_inferctl, stop_all

pytestmark = pytest.mark.e2e

TOKEN = "hostile-e2e-admin-token-0123"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    tmp = tmp_path_factory.mktemp("hostile")
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    log = tmp / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "INFERCTL_ADMIN_TOKEN"}
    env["OMP_NUM_THREADS"] = "1"
    base = f"http://127.0.0.1:{port}"
    proc = start_inferctl(["engine", "serve", "--port", str(port), "--host", "127.0.0.1",
                           "--admin-token-file", str(token_file), "--memory-budget", "512MiB", "--no-access-log"],
                          log, env=env, ready_url=f"{base}/health")
    yield {"base": base, "port": port}
    stop_all([proc])


def test_foreign_host_is_refused_and_loopback_hosts_pass(server):
    base, port = server["base"], server["port"]
    r = httpx.post(f"{base}/v1/completions", json={"prompt": "Once", "max_tokens": 2},
                   headers={"Host": "evil.example"}, timeout=10)
    assert r.status_code == 421
    assert r.json()["error"]["param"] == "Host" and "evil.example" in r.json()["error"]["message"]
    assert httpx.get(f"{base}/metrics", headers={"Host": f"evil.example:{port}"}, timeout=10).status_code == 421
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):       # Prometheus scrape, kubelet-style probe
        assert httpx.get(f"{base}/metrics", headers={"Host": host}, timeout=10).status_code == 200
        assert httpx.get(f"{base}/health", headers={"Host": host}, timeout=10).status_code == 200
    r = httpx.post(f"{base}/v1/completions", json={"prompt": "Once", "max_tokens": 2, "temperature": 0},
                   timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_text_plain_is_refused_on_a_real_socket(server):
    r = httpx.post(f"{server['base']}/v1/completions", content=b'{"prompt": "Once", "max_tokens": 2}',
                   headers={"Content-Type": "text/plain"}, timeout=10)
    assert r.status_code == 415 and r.json()["error"]["param"] == "Content-Type"


def test_admin_token_comes_from_the_file(server):
    url = f"{server['base']}/admin/precision"
    assert httpx.post(url, json={"mode": "full"}, timeout=10).status_code == 401
    r = httpx.post(url, json={"mode": "full"}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("args, words", [
    (["--admin-token", "short"], "--admin-token (or $INFERCTL_ADMIN_TOKEN): the admin token is 5 characters"),
    (["--admin-token", "--port"], "starts with '-'"),
])
def test_bad_admin_tokens_are_refused_at_start(args, words):
    env = {k: v for k, v in os.environ.items() if k != "INFERCTL_ADMIN_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "inferctl", "engine", "serve", "--port", str(free_port()), *args],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-1000:]
    assert words in r.stderr


def test_help_says_flags_show_in_ps():
    r = subprocess.run([sys.executable, "-m", "inferctl", "engine", "serve", "--help"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    text = " ".join(r.stdout.split())
    assert "--admin-token-file" in text and "ps" in text and "--allowed-host" in text
