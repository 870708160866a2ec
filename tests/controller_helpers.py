"""Test helpers for the controller's actions, reset, loop, API and CLI tests."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from pathlib import Path

from inferctl.controller.types import EngineSnapshot, GpuReading, GpuSnapshot
from inferctl.tools.drill.fleet import free_block

FAKE_BIN = Path(__file__).resolve().parent / "fake_bin"
GIB = 1024 ** 3


class StaticGpuSource:
    """A GPU source double whose readings the test edits (``gpus`` by index)."""

    name = "static"
    simulated = False

    def __init__(self, gpus: dict[int, GpuSnapshot] | None = None, ok: bool = True,
                 delay: float = 0.0, fail: Exception | None = None) -> None:
        self.gpus = gpus if gpus is not None else {0: gpu(0), 1: gpu(1)}
        self.ok = ok
        self.delay = delay
        self.fail = fail
        self.polls = 0
        self._lock = threading.Lock()

    def poll(self, now: float) -> GpuReading:
        with self._lock:
            self.polls += 1
        if self.delay:
            time.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        if not self.ok:
            return GpuReading(source="static", ok=False, error="telemetry down", time=now)
        return GpuReading(source="static", ok=True, time=now,
                          gpus={s.uuid: s for s in self.gpus.values()})


def gpu(index: int, *, lost: bool = False, total: int | None = 80 * GIB,
        persistence: bool | None = True, processes=None) -> GpuSnapshot:
    return GpuSnapshot(uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000", index=index,
                       name="NVIDIA H100 80GB HBM3", pci_bus_id=f"00000000:{0x3B + index:02X}:00.0",
                       memory_total_bytes=total, memory_used_bytes=0 if total else None,
                       lost=lost, persistence_mode=persistence, processes=list(processes or []))


class FakeNvidiaSmi:
    """Writes the fake nvidia-smi state file and reads its argv log."""

    def __init__(self, tmp_path: Path, monkeypatch, gpus: dict[int, dict] | None = None) -> None:
        self.state_path = tmp_path / "nvsmi-state.json"
        self.log_path = tmp_path / "nvsmi-argv.log"
        state = {"gpus": {}}
        for idx, spec in (gpus or {0: {}, 1: {}}).items():
            g = {"bus_id": f"00000000:{0x3B + idx:02X}:00.0", "uuid": f"GPU-{idx:08d}-0000-0000-0000-000000000000",
                 "mode": "success", "persistence": True, "processes": []}
            g.update(spec)
            state["gpus"][str(idx)] = g
        self.state_path.write_text(json.dumps(state))
        monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.setenv("FAKE_NVSMI_STATE", str(self.state_path))
        monkeypatch.setenv("FAKE_NVSMI_LOG", str(self.log_path))

    def calls(self) -> list[list[str]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]

    def state(self, idx: int) -> dict:
        return json.loads(self.state_path.read_text())["gpus"][str(idx)]


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, outside the ephemeral range (see ``free_block``)."""
    return free_block(1)


def port_is_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:``port`` and a server could bind it again
    (SO_REUSEADDR, as uvicorn sets it, so TIME_WAIT leftovers do not count)."""
    with socket.socket() as s:
        s.settimeout(1.0)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def engine_snapshot(name: str = "main", **kw) -> EngineSnapshot:
    base = dict(name=name, kind="bundled", ok=True, time=time.time(), precision="full",
                draining=False, running=0, waiting=0)
    base.update(kw)
    return EngineSnapshot(**base)


# A stand-in engine process for EngineSupervisor tests: serves GET /health 200 on argv[1];
# argv[2] == "ignore-term" ignores SIGTERM (to test SIGKILL), "exit" exits at once with 3.
FAKE_ENGINE_SRC = r'''
import http.server, signal, sys
port, mode = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "")
if mode == "exit":
    sys.exit(3)
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"status":"ok"}' if self.path == "/health" else b"{}"
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


class FakeEngineClient:
    """An engine client double with the EngineClient admin surface and a tiny state machine:
    precision switches apply at the next poll; ``running`` drops by one per poll while
    draining (in-flight work finishing)."""

    def __init__(self, name: str = "main", running: int = 0, apply_precision: bool = True,
                 fail: Exception | None = None) -> None:
        self.name = name
        self.precision = "full"
        self.pending: str | None = None
        self.draining = False
        self.running = running
        self.apply_precision = apply_precision
        self.fail = fail
        self.calls: list[tuple] = []
        self.routes: dict[str, str] = {}
        self.stuck = False
        self.ok = True
        self.faults: list[dict] = []
        self.memory: dict = {}
        self.delay = 0.0
        self.polls = 0

    def poll(self, now: float) -> EngineSnapshot:
        self.polls += 1
        if self.delay:
            time.sleep(self.delay)
        if self.pending and self.apply_precision:
            self.precision, self.pending = self.pending, None
        if self.draining and self.running > 0 and not self.stuck:
            self.running -= 1
        if not self.ok:
            return EngineSnapshot(name=self.name, kind="bundled", ok=False, time=now, error="down")
        return engine_snapshot(self.name, ok=True, precision=self.precision, draining=self.draining,
                               running=self.running, waiting=0, time=now, faults=list(self.faults),
                               oom_total=float(len(self.faults)), **self.memory)

    def set_precision(self, mode: str) -> dict:
        self.calls.append(("precision", mode))
        if self.fail:
            raise self.fail
        self.pending = mode
        return {"requested": mode, "current": self.precision}

    def drain(self, draining: bool) -> dict:
        self.calls.append(("drain", draining))
        if self.fail:
            raise self.fail
        self.draining = draining
        return {"draining": draining}

    def route(self, model: str, to: str) -> dict:
        self.calls.append(("route", model, to))
        self.routes[model] = to
        return {"model": model, "to": to}

    def inject_fault(self, kind: str = "oom", count: int = 1) -> dict:
        self.calls.append(("fault", kind, count))
        return {"kind": kind, "count": count}


def wait_for_line(path: Path, pattern: str, proc, timeout: float):
    """Poll the output file ``path`` of the process ``proc`` (a ``subprocess.Popen``) every 0.1 s
    until a line matches ``pattern`` (``re.MULTILINE``); returns the match. Raises
    AssertionError, with the output, when ``proc`` exits first or after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = path.read_text() if path.exists() else ""
        m = re.search(pattern, text, re.MULTILINE)
        if m:
            return m
        if proc.poll() is not None:
            raise AssertionError(f"the process exited with {proc.returncode}:\n{text}")
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} within {timeout} s:\n{path.read_text() if path.exists() else ''}")


#: Loop timing for tests: short polls, each call's timeout below every poll interval.
FAST_INTERVALS = {"engine_poll_seconds": 0.2, "gpu_poll_seconds": 0.5, "reconcile_seconds": 0.5,
                  "call_timeout_seconds": 0.15, "max_backoff_seconds": 5}


def loop_parts(tmp_path: Path, engines: list[dict], intervals: dict | None = None):
    """What every loop test builds first: the validated config for ``engines`` (with
    ``FAST_INTERVALS`` unless ``intervals`` is given), a fresh metrics registry and an event log
    in ``tmp_path/ev.db`` counting into it: (config, registry, metrics, event_log)."""
    from inferctl.controller.config import parse_config
    from inferctl.controller.events import EventLog
    from inferctl.controller.metrics import build_registry

    cfg = parse_config({"engines": engines, "intervals": intervals or FAST_INTERVALS})
    registry, metrics = build_registry()
    log = EventLog(tmp_path / "ev.db", metrics=metrics)
    return cfg, registry, metrics, log


def run_until(ctl, pred, t0: float, step: float = 1.0, n: int = 20) -> float:
    """Tick ``ctl`` at t0 + step, t0 + 2·step, ... (waiting for its actions after each) until
    ``pred()`` holds; returns that time. Raises AssertionError after ``n`` ticks."""
    t = t0
    for _ in range(n):
        t += step
        ctl.tick(t)
        ctl.wait_for_actions(10)
        if pred():
            return t
    raise AssertionError("condition not reached")


def make_controller(tmp_path: Path, clients: dict, gpu_source=None, intervals: dict | None = None,
                    policies: dict | None = None, resetter_opts: dict | None = None, clock=time.time,
                    hold_seconds: float = 2.0):
    """A real Controller over engine client doubles: (controller, registry, event_log)."""
    from inferctl.controller.actions import Actions
    from inferctl.controller.loop import Controller
    from inferctl.controller.policies.precision import PrecisionPolicy
    from inferctl.controller.reset import GpuResetter
    from inferctl.controller.signals import InvalidSampleCounter
    from inferctl.controller.state import ControllerState

    cfg, registry, metrics, log = loop_parts(
        tmp_path, [{"name": n, "url": f"http://127.0.0.1:{9000 + i}", "gpu": 0}
                   for i, n in enumerate(clients)], intervals)
    gpu_source = gpu_source or StaticGpuSource()
    resetter = GpuResetter(gpu_source=gpu_source, event_log=log, metrics=metrics, clock=clock,
                           verify_interval_seconds=0.0, **(resetter_opts or {}))
    counter = InvalidSampleCounter()
    state = ControllerState.for_config(cfg)
    acts = Actions(clients, event_log=log, metrics=metrics, resetter=resetter,
                   confirm_timeout_seconds=0.5, poll_interval_seconds=0.01, state=state)
    if policies is None:
        policies = {n: {"precision": PrecisionPolicy({"hold_seconds": hold_seconds,
                                                      "confirm_timeout_seconds": 5},
                                                     engine=n, counter=counter)} for n in clients}
    ctl = Controller(cfg, clients, gpu_source, policies, acts, log, metrics, registry=registry,
                     counter=counter, resetter=resetter, clock=clock, state=state)
    return ctl, registry, log


def api_setup(tmp_path: Path, token: str, **test_client_kw):
    """A controller over one ``FakeEngineClient`` "main" (fake clock, ticked once) and a
    ``TestClient`` on its API guarded by ``token``: (http, controller, client, event_log)."""
    from fastapi.testclient import TestClient

    from inferctl.controller.api import create_app

    client = FakeEngineClient()
    ctl, registry, log = make_controller(tmp_path, {"main": client}, clock=FakeClock())
    ctl.tick()
    return TestClient(create_app(ctl, token), **test_client_kw), ctl, client, log


def strict_json(text: str):
    """``text`` parsed as strict JSON: NaN/Infinity literals fail the test."""
    import pytest

    return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
