"""Issue 13, output as a newcomer meets it: piped rows are full (item 2), ``status --url`` at an
engine gets a hint (item 6). A small stand-in HTTP server plays the controller / the engine."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from typer.testing import CliRunner

from inferctl.cli import app

UUID = "GPU-3166d2c1-ffff-4a5e-9c1e-8d0b6a1c2e7f-" + "0123456789abcdef" * 4
POLICIES = {f"policy_with_a_long_name_{i}": {"state": "chugging_along_nicely"} for i in range(6)}
STATUS = {"controller": {"uptime_seconds": 12.0, "last_event_id": 3, "actions_in_flight": []},
          "engines": {"main": {"url": "http://127.0.0.1:8000", "up": True, "precision": "full", "draining": False,
                               "running": 1, "waiting": 0, "memory": {"free_bytes": 3 * 2**20},
                               "policies": POLICIES}},
          "gpus": {"source": "simulated", "simulated": True, "ok": True,
                   "devices": [{"index": 0, "uuid": UUID, "name": "Simulated GPU", "memory_used_bytes": 2**30,
                                "memory_total_bytes": 80 * 2**30, "lost": False, "health": "healthy"}]}}


@contextmanager
def _server(routes: dict[str, tuple[int, dict]]):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            code, doc = routes.get(self.path.split("?")[0], (404, {"detail": "Not Found"}))
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_status_piped_prints_full_rows():
    with _server({"/status": (200, STATUS)}) as url:
        res = CliRunner().invoke(app, ["status", "--url", url], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    assert UUID in res.output                          # 200 characters of uuid, not cut at 80
    row = next(line for line in res.output.splitlines() if line.lstrip("│┃ ").startswith("main"))
    for name in POLICIES:                              # every policy on the engine's one row
        assert f"{name}=chugging_along_nicely" in row


def test_status_at_an_engine_url_hints_at_the_controller_port():
    with _server({"/health": (200, {"status": "ok"})}) as url:
        res = CliRunner().invoke(app, ["status", "--url", url])
    assert res.exit_code == 1
    assert "this looks like an engine (GET /status 404): the controller listens on another port (default 8900)" \
        in res.output
