"""A supervised router process killed with SIGKILL is started again by ``RouterWatch`` (as
``inferctl up --replicas N`` wires it): a real subprocess on a real port stands in for the
router (the watch only needs its ``/health``)."""

from __future__ import annotations

import os
import signal
import sys
import time

import httpx

from inferctl.controller.router_watch import RouterWatch
from inferctl.controller.supervisor import EngineSupervisor
from tests.server_helpers import free_port

SERVER = ("import http.server, sys\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
          "        self.wfile.write(b'ok')\n"
          "    def log_message(self, *a): pass\n"
          "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def test_a_router_killed_with_sigkill_is_restarted_and_answers_again():
    port = free_port()
    sup = EngineSupervisor("router", [sys.executable, "-c", SERVER, str(port)], f"http://127.0.0.1:{port}",
                           health_timeout_seconds=20, stop_timeout_seconds=5)
    lines: list[str] = []
    watch = RouterWatch(sup, None, lines.append, interval_seconds=0.1)
    sup.start()
    watch.start()
    try:
        first = sup.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (sup.pid != first and sup.running and lines):
            time.sleep(0.05)
        assert sup.pid != first and sup.running
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        assert lines and "restarted" in lines[0] and "code -9" in lines[0]
    finally:
        watch.stop()
        sup.stop()
    time.sleep(0.3)
    assert not sup.running and watch.check() is None          # a stop by us is not a crash
