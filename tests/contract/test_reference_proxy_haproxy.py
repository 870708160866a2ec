"""bench/reference_proxy.py with the real HAProxy (Debian package ``haproxy``; .ci/run installs it in
its second stage, before the contract tests): the generated configuration passes ``haproxy -c`` and
HAProxy started by ``start_haproxy`` forwards a JSON POST unchanged. Without the binary these fail,
as the Prometheus tests do without promtool."""

import json
import os
import shutil
import socket
import subprocess
import threading
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import reference_proxy
from bench.reference_proxy import haproxy_config, haproxy_version, server_times, start_haproxy, timings_seen


@pytest.fixture
def haproxy_bin():
    binary = shutil.which("haproxy") or reference_proxy.DEBIAN_PATH
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.fail("haproxy not installed (the Debian haproxy package; .ci/run installs it)")
    return binary


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_real_haproxy_accepts_the_generated_config(haproxy_bin, tmp_path):
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy_config(_free_port(), "http://127.0.0.1:9031"), encoding="utf-8")
    check = subprocess.run([haproxy_bin, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_real_haproxy_version_reads_haproxy_2(haproxy_bin):
    version = haproxy_version(haproxy_bin)
    assert version.startswith("HAProxy 2.") and len(version.split()) == 2


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"                           # keep-alive, as the engine

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        out = json.dumps({"path": self.path, "length": len(body), "model": json.loads(body)["model"]}).encode()
        self.send_response(207)                             # unusual on purpose: passed on unchanged
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Upstream", "echo")
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def _post(port, path, body):
    conn = HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("X-Upstream"), resp.read()
    finally:
        conn.close()


def test_start_haproxy_forwards_a_json_post_and_returns_the_upstreams_status_and_body(haproxy_bin, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    upstream = f"http://127.0.0.1:{server.server_address[1]}"
    body = json.dumps({"model": "stories260K", "prompt": "Once upon a time é" * 400, "max_tokens": 4}).encode()
    port = _free_port()
    proc = None
    try:
        proc = start_haproxy(haproxy_bin, port, upstream, tmp_path)
        assert (tmp_path / "haproxy.cfg").read_text(encoding="utf-8") == haproxy_config(port, upstream)
        assert proc.poll() is None                          # start_haproxy returns once it listens
        direct = _post(server.server_address[1], "/v1/completions?x=1", body)
        for _ in range(2):                                  # the second over a reused upstream connection
            status, header, got = _post(port, "/v1/completions?x=1", body)
            assert (status, header, got) == direct
            assert status == 207 and header == "echo"
            assert json.loads(got) == {"path": "/v1/completions?x=1", "length": len(body), "model": "stories260K"}
        # one timing line a request, read back as the engine's time (%Tr, whole ms, ≥ 0)
        # start_haproxy's readiness check left a line too ("-1": no request), which server_times leaves out
        times = server_times(tmp_path / "haproxy.log", 0, 2)
        assert len(times) == 2 and all(0 <= t < 10_000 for t in times), times
        assert timings_seen(tmp_path / "haproxy.log") == 3
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        server.shutdown()
        server.server_close()
