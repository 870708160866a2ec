"""The stack the drill starts (``inferctl up`` in a subprocess) or finds (a controller's ``/status``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferctl.contract.http import generate_admin_token
from inferctl.tools.drill.config import STORIES_BUDGET, STORIES_ENGINE_ARGS, DrillError


@dataclass
class Stack:
    """An ``inferctl up`` the drill started (stopped by :meth:`stop`)."""

    proc: subprocess.Popen
    engine_url: str
    controller_url: str
    token: str
    workdir: Path
    log: Path

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stack_config(model: str | None, workdir: Path, memory_budget: str | None, engine_args: list[str] | None,
                 hold_seconds: float, poll_seconds: float) -> dict:
    """The controller configuration of the stack the drill starts: one launched bundled engine
    (the stories260K calibration when the model is stories260K and nothing else is given),
    the simulated GPU, the precision policy with a short hold, fast polls."""
    is_stories = model is not None and Path(model).name == "stories260K.bin"
    budget = memory_budget or (str(STORIES_BUDGET) if is_stories else None)
    args = list(engine_args) if engine_args else (list(STORIES_ENGINE_ARGS) if is_stories else [])
    launch: dict[str, Any] = {"port": _free_port(), "args": args, "health_timeout_seconds": 120}
    if model:
        launch["model"] = str(Path(model).resolve())
    if budget:
        launch["memory_budget"] = budget
    timeout = min(0.8 * poll_seconds, 0.5)
    return {
        "listen": {"host": "127.0.0.1", "port": _free_port()},
        "event_log": str(workdir / "events.db"),
        "engines": [{"name": "main", "kind": "bundled", "launch": launch}],
        "gpu": {"kind": "sim"},
        "policies": {"precision": {"hold_seconds": hold_seconds, "margin_ratio": 0.0,
                                   "confirm_timeout_seconds": 5, "max_switches_per_hour": 20},
                     "fragmentation": {"enabled": False}},
        "intervals": {"engine_poll_seconds": poll_seconds, "gpu_poll_seconds": max(0.5, poll_seconds),
                      "reconcile_seconds": 0.5, "call_timeout_seconds": timeout, "max_backoff_seconds": 2},
    }


def start_stack(config: dict, workdir: Path, timeout: float = 150.0) -> Stack:
    """Run ``inferctl up --config`` (this interpreter, own session) and wait for its URLs.

    Raises:
        DrillError: it exited or printed no URLs within ``timeout`` (the log is named).
    """
    import yaml

    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "drill-stack.yaml"
    cfg_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    token = generate_admin_token()
    log = workdir / "inferctl-up.log"
    env = {**os.environ, "INFERCTL_ADMIN_TOKEN": token}
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "inferctl", "up", "--config", str(cfg_path),
                                 "--engine-log-dir", str(workdir)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=str(workdir), start_new_session=True)
    deadline = time.time() + timeout
    engine = controller = None
    while time.time() < deadline:
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        m1 = re.search(r"^engine:\s+(\S+)", text, re.M)
        m2 = re.search(r"^controller:\s+(\S+)", text, re.M)
        engine, controller = (m1.group(1) if m1 else None), (m2.group(1) if m2 else None)
        if engine and controller:
            return Stack(proc, engine, controller, token, workdir, log)
        if proc.poll() is not None:
            raise DrillError(f"inferctl up exited with code {proc.returncode} before it was ready; log {log}:\n"
                             + text[-2000:])
        time.sleep(0.2)
    Stack(proc, "", "", token, workdir, log).stop()
    raise DrillError(f"inferctl up did not print its URLs within {timeout:g} s (log {log})")


def discover(controller_url: str, engine: str | None) -> tuple[str, str]:
    """``(engine name, engine URL)`` from the controller's ``/status``.

    Raises:
        DrillError: unreachable, or the engine is unknown / ambiguous.
    """
    import httpx

    try:
        doc = httpx.get(f"{controller_url.rstrip('/')}/status", timeout=5.0).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise DrillError(f"--url: controller not reachable at {controller_url}: {exc}") from None
    engines = doc.get("engines") or {}
    bundled = {n: e for n, e in engines.items() if e.get("kind") in ("bundled", None)}
    if engine is None:
        if len(bundled) != 1:
            raise DrillError(f"--engine: the controller has {len(bundled)} bundled engines "
                             f"({', '.join(sorted(bundled)) or 'none'}); name one")
        engine = next(iter(bundled))
    if engine not in engines or not engines[engine].get("url"):
        raise DrillError(f"--engine: {engine!r} is not an engine of {controller_url} "
                         f"(engines: {', '.join(sorted(engines)) or 'none'})")
    return engine, engines[engine]["url"]

