"""Helpers for the observability end-to-end test: real processes on loopback and a webhook sink.

- :class:`Proc` runs one server process with its output in a log file and waits for a URL.
- :class:`WebhookReceiver` is Alertmanager's webhook target: a ``http.server`` thread that keeps
  every JSON body it gets, by path.
- :func:`prometheus_config` / :func:`controller_config` write the configurations the test uses.
- :func:`prom_query` runs an instant query against Prometheus' HTTP API.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml
from inferctl.tools.drill.fleet import free_block


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, outside the ephemeral range (see ``free_block``)."""
    return free_block(1)


@contextlib.contextmanager
def lock_held_elsewhere(lock: Any, timeout: float = 10.0):
    """Hold ``lock`` in another thread for the ``with`` block (a step, a start in progress):
    entered once the thread holds it; the thread lets go at the block's end."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(timeout)
    t = threading.Thread(target=hold, daemon=True)
    t.start()
    if not held.wait(timeout):
        raise TimeoutError("the lock was not taken in the other thread")
    try:
        yield
    finally:
        release.set()
        t.join(timeout)


def wait_until(pred: Callable[[], Any], timeout: float, interval: float = 0.25, what: str = "condition") -> Any:
    """Call ``pred`` until it returns something truthy; return it. Raises TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}"
                       + (f" (last error: {last_exc!r})" if last_exc else ""))


class Proc:
    """One server process: ``argv`` started with stdout+stderr in ``log``; :meth:`stop` ends it."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.name, self.argv, self.log = name, argv, log
        self._fh = open(log, "wb")
        full_env = dict(os.environ, **(env or {}))
        self.popen = subprocess.Popen(argv, stdout=self._fh, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                                      start_new_session=True)

    def tail(self, n: int = 40) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- {self.name} log ({self.log}) ---\n" + "\n".join(lines[-n:])

    def wait_http(self, url: str, timeout: float) -> None:
        """Wait until GET ``url`` answers 200. Raises RuntimeError (with the log) if the process
        exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}\n{self.tail()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready at {url} after {timeout:g}s\n{self.tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=timeout)
        self._fh.close()


class WebhookReceiver:
    """Alertmanager webhook sink on 127.0.0.1: ``received`` is a list of ``(path, body)``."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.received.append((self.path, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def alerts(self, path: str) -> list[dict]:
        """Every alert (with its notification's ``status`` copied in as ``_status``) posted to ``path``."""
        with self._lock:
            bodies = [b for p, b in self.received if p == path]
        return [dict(a, _notification_status=b.get("status")) for b in bodies for a in b.get("alerts", [])]

    def find(self, path: str, alertname: str, status: str) -> dict | None:
        for a in self.alerts(path):
            if a["labels"].get("alertname") == alertname and a.get("status") == status:
                return a
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def prometheus_config(path: Path, rules: Path, alertmanager_port: int, engine_port: int,
                      controller_port: int, interval: str = "1s", router_port: int | None = None) -> Path:
    """A Prometheus configuration with the scrape jobs of docs/observability.md (the router's
    only with ``router_port``)."""
    cfg = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": "900ms"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
        "scrape_configs": [
            {"job_name": "inferctl-engine", "static_configs": [{"targets": [f"127.0.0.1:{engine_port}"]}]},
            {"job_name": "inferctl-controller", "static_configs": [{"targets": [f"127.0.0.1:{controller_port}"]}]},
        ],
    }
    if router_port is not None:
        cfg["scrape_configs"].append(
            {"job_name": "inferctl-router", "static_configs": [{"targets": [f"127.0.0.1:{router_port}"]}]})
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def controller_config(path: Path, port: int, engine_port: int, engine_token: str, admin_token: str,
                      event_log: Path, hold_seconds: float) -> Path:
    """The controller watches one bundled engine (``main``) with the simulated GPU source."""
    engine = f"http://127.0.0.1:{engine_port}"
    cfg = {
        "listen": {"host": "127.0.0.1", "port": port},
        "admin_token": admin_token,
        "event_log": str(event_log),
        "engines": [{"name": "main", "kind": "bundled", "url": engine, "admin_token": engine_token}],
        "gpu": {"kind": "sim", "options": {"engine_stats_url": f"{engine}/stats"}},
        "policies": {"precision": {"hold_seconds": hold_seconds}},
        "intervals": {"engine_poll_seconds": 0.5, "gpu_poll_seconds": 0.5, "reconcile_seconds": 0.5,
                      "call_timeout_seconds": 0.4},
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def prom_query(base: str, expr: str) -> list[dict]:
    """Instant query; returns the result vector. Raises RuntimeError when Prometheus says error."""
    resp = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10.0)
    doc = resp.json()
    if doc.get("status") != "success":
        raise RuntimeError(f"query failed: {expr!r}: {doc.get('errorType')}: {doc.get('error')}")
    return doc["data"]["result"]


def prom_query_range(base: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    """Range query (what a Grafana time-series panel runs); returns the result matrix."""
    resp = httpx.get(f"{base}/api/v1/query_range",
                     params={"query": expr, "start": start, "end": end, "step": step}, timeout=20.0)
    doc = resp.json()
    if doc.get("status") != "success":
        raise RuntimeError(f"query failed: {expr!r}: {doc.get('errorType')}: {doc.get('error')}")
    return doc["data"]["result"]


def python_cli(*args: str) -> list[str]:
    """argv running the inferctl CLI with this interpreter (no dependence on PATH)."""
    return [sys.executable, "-m", "inferctl", *args]
