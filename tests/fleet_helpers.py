"""Helpers for the fleet e2e tests: start ``inferctl up --replicas N`` (engines, router,
controller) and drive ``CLIENTS`` concurrent clients through the router."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from inferctl.tools.drill.fleet import free_block

#: issue 9's done-means: 64 concurrent clients through the router (measured: no slower than 16 here)
CLIENTS = 64
TOKEN = "e2e-fleet-token-0123456789abcdef"


@dataclass
class Up:
    proc: subprocess.Popen
    lines: list
    router: str
    controller: str


def start_up(model: Path, tmp: Path, replicas: int = 3, config: dict | None = None) -> Up:
    """Start ``inferctl up --replicas`` with ``config`` (a controller config mapping; the event log
    is added) and wait until every replica is routable through the router. Fails the test if
    it does not start within 150 s."""
    (tmp / "c.yaml").write_text(yaml.safe_dump({"event_log": str(tmp / "ev.db"), **(config or {})}))
    base, ctl, rport = free_block(replicas), free_block(1), free_block(1)
    cmd = [sys.executable, "-m", "inferctl", "up", "--replicas", str(replicas), "--model", str(model),
           "--config", str(tmp / "c.yaml"), "--engine-port", str(base), "--controller-port", str(ctl),
           "--router-port", str(rport), "--engine-log-dir", str(tmp / "logs"),
           "--engine-arg=--max-model-len=512", "--engine-arg=--memory-budget=512MiB"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERCTL_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith("Ctrl-C to stop"):
            break
    if not lines or not lines[-1].startswith("Ctrl-C"):
        proc.kill()
        pytest.fail("inferctl up did not start:\n" + "\n".join(lines))
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()   # keep the pipe drained
    u = Up(proc, lines, f"http://127.0.0.1:{rport}", f"http://127.0.0.1:{ctl}")
    deadline = time.monotonic() + 30          # every replica routable through the router
    while len([r for r in httpx.get(u.router + "/replicas").json().values() if r["routable"]]) < replicas:
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("not every replica became routable: " + httpx.get(u.router + "/replicas").text)
        time.sleep(0.2)
    return u


def status(u: Up) -> dict:
    """The controller's ``/status`` engines by name."""
    return httpx.get(u.controller + "/status", timeout=5).json()["engines"]


class Load:
    """``CLIENTS`` threads sending streamed and plain completions through the router until stopped.
    Each result: ``stream``, ``ok``, ``started`` (a token arrived), ``replica`` (the router's
    ``x-inferctl-replica``), ``error``, ``t0``/``t1`` (wall-clock start and end, seconds)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.results: list[dict] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.worker, args=(i,)) for i in range(CLIENTS)]

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def one(self, client: httpx.Client, stream: bool, i: int = 0) -> dict:
        # one session per client: the same prompt would otherwise pin every request to one replica
        # (prefix affinity), and the killed or restarted replica would see almost none of the load
        headers = {"X-Session-Id": f"client-{i}"}
        body = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 24, "stream": stream}
        out = {"stream": stream, "ok": False, "started": False, "replica": None, "error": None,
               "t0": time.time(), "t1": None}
        try:
            if not stream:
                r = client.post(self.url + "/v1/completions", json=body, headers=headers)
                out["replica"] = r.headers.get("x-inferctl-replica")
                out["ok"] = r.status_code == 200 and bool(r.json()["choices"][0]["text"])
                out["error"] = None if out["ok"] else f"HTTP {r.status_code}: {r.text[:200]}"
                return out
            with client.stream("POST", self.url + "/v1/completions", json=body, headers=headers) as r:
                out["replica"] = r.headers.get("x-inferctl-replica")
                if r.status_code != 200:
                    out["error"] = f"HTTP {r.status_code}: {r.read()[:200]!r}"
                    return out
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        out["ok"] = out["error"] is None
                        return out
                    doc = json.loads(line[6:])
                    if "error" in doc:
                        out["error"] = f"SSE error: {doc['error']}"
                    else:
                        out["started"] = True
                out["error"] = out["error"] or "stream ended without [DONE]"
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            out["t1"] = time.time()
        return out

    def worker(self, i: int) -> None:
        with httpx.Client(timeout=60) as client:
            n = 0
            while not self.stop.is_set():
                res = self.one(client, stream=(i + n) % 2 == 0, i=i)
                n += 1
                with self.lock:
                    self.results.append(res)

    def failed(self) -> list[dict]:
        with self.lock:
            return [r for r in self.results if not r["ok"]]
