"""``inferctl drill fleet``: N replicas behind the router under load; degrade one, restart one, kill one.

:func:`start_fleet` runs ``inferctl up --replicas N`` as a subprocess (as :mod:`stack` does for
``drill oom``: this interpreter, its own session, the admin token in the environment, SIGINT to
stop) and waits for the router to route to every replica. :class:`FleetLoad` is the clients:
threads sending streamed and plain ``/v1/completions`` through the router, one at a time each.
:func:`run_fleet_drill` runs the phases (:data:`fleet_report.FLEET_PHASES`):

1. ``baseline``: load only;
2. ``degrade``: ``POST /actions/degrade`` main-0 (int8, live, no drain), rolled back at the end;
3. ``restart``: ``POST /actions/restart`` main-1, the controller's rolling path (out of rotation,
   drained, restarted, back in rotation) — the same steps as the fragmentation policy's
   ``drain_restart``; a fragmentation trigger cannot be forced under load (the policy acts only
   on a replica it sees idle), so the drill asks as an operator (without ``force``: the rails
   apply);
4. ``kill``: SIGKILL of main-2's process (pid from the controller's ``/status``).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from inferctl.tools.drill.config import DrillError
from inferctl.tools.drill.fleet_report import FleetRequest, PhaseMark, summarize
from inferctl.tools.drill.stack import Stack

PROMPT = "Once upon a time there was a little girl who"


@dataclass
class FleetStack(Stack):
    """An ``inferctl up --replicas N`` the drill started; ``router_url`` is the URL clients use
    (``engine_url`` holds it too)."""

    router_url: str = ""
    replicas: int = 0


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections
    (``/proc/sys/net/ipv4/ip_local_port_range``; Linux's default 32768–60999 where unreadable)."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_block(n: int) -> int:
    """A base port with ``n`` consecutive ports free on 127.0.0.1 now, chosen outside the kernel's
    ephemeral range: a port the OS handed out for ``bind(0)`` is also what it hands to the next
    outgoing connection as its source port, so under load (64 clients through a router) a port
    picked that way was taken before the server bound it ("port … is in use"). Ports 20000 and
    up below the ephemeral range (or above it, where it starts lower) are never given to clients.

    Raises:
        DrillError: no block of ``n`` free ports found in 200 random tries.
    """
    lo, hi = _ephemeral_range()
    start, end = (20000, lo - n) if lo - n > 21000 else (hi + 1, 65535 - n)
    if end <= start:
        start, end = 1024, 65535 - n
    rng = random.Random()
    for _ in range(200):
        base = rng.randint(start, end)
        socks = []
        try:
            for i in range(n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise DrillError(f"no block of {n} free ports on 127.0.0.1 in {start}–{end + n}")


def start_fleet(model: str, replicas: int, workdir: Path, engine_args: list[str], token: str,
                timeout: float = 180.0) -> FleetStack:
    """Start ``inferctl up --replicas N --model PATH`` and wait until the router has every replica
    routable (``GET /replicas``).

    Raises:
        DrillError: it exited, printed no URLs, or the replicas were not routable within ``timeout`` s.
    """
    import httpx

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "fleet.yaml").write_text(f"event_log: {workdir / 'events.db'}\n", encoding="utf-8")
    base, ctl, rport = free_block(replicas), free_block(1), free_block(1)
    cmd = [sys.executable, "-m", "inferctl", "up", "--replicas", str(replicas), "--model", str(Path(model).resolve()),
           "--config", str(workdir / "fleet.yaml"), "--engine-port", str(base), "--controller-port", str(ctl),
           "--router-port", str(rport), "--engine-log-dir", str(workdir)] + [f"--engine-arg={a}" for a in engine_args]
    log = workdir / "inferctl-up.log"
    env = {**os.environ, "INFERCTL_ADMIN_TOKEN": token}
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=str(workdir), start_new_session=True)
    deadline = time.time() + timeout
    stack = None
    while time.time() < deadline:
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        if proc.poll() is not None:
            raise DrillError(f"inferctl up exited with code {proc.returncode}; log {log}:\n{text[-2000:]}")
        if stack is None:
            m1 = re.search(r"^router:\s+(\S+)", text, re.M)
            m2 = re.search(r"^controller:\s+(\S+)", text, re.M)
            if m1 and m2:
                stack = FleetStack(proc, m1.group(1), m2.group(1), token, workdir, log, m1.group(1), replicas)
        if stack is not None:
            try:
                reps = httpx.get(stack.router_url + "/replicas", timeout=2).json()
                if sum(1 for r in reps.values() if r.get("routable")) >= replicas:
                    return stack
            except (httpx.HTTPError, ValueError):
                pass
        time.sleep(0.3)
    (stack or Stack(proc, "", "", token, workdir, log)).stop()
    raise DrillError(f"inferctl up --replicas {replicas}: not every replica routable within {timeout:g} s (log {log})")


class FleetLoad:
    """``clients`` threads, each sending one request at a time through the router until stopped:
    even turns stream (SSE), odd ones do not; ``max_tokens`` tokens each."""

    def __init__(self, router_url: str, clients: int, max_tokens: int = 24, timeout: float = 60.0) -> None:
        self.url = router_url.rstrip("/")
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.requests: list[FleetRequest] = []
        self.threads = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> "FleetLoad":
        for t in self.threads:
            t.start()
        return self

    def stop(self, join_seconds: float = 90.0) -> None:
        """Stop sending; wait up to ``join_seconds`` for the requests in flight (those still
        unanswered stay ``end`` None: lost)."""
        self.stop_event.set()
        deadline = time.time() + join_seconds
        for t in self.threads:
            t.join(max(0.0, deadline - time.time()))

    def _one(self, client: Any, rec: FleetRequest) -> None:
        import httpx

        body = {"model": "stories260K", "prompt": PROMPT, "max_tokens": self.max_tokens, "stream": rec.stream}
        try:
            if not rec.stream:
                r = client.post(self.url + "/v1/completions", json=body)
                rec.replica = r.headers.get("x-inferctl-replica")
                rec.ok = r.status_code == 200 and bool(r.json()["choices"][0]["text"])
                rec.error = None if rec.ok else f"HTTP {r.status_code}: {r.text[:200]}"
                return
            with client.stream("POST", self.url + "/v1/completions", json=body) as r:
                rec.replica = r.headers.get("x-inferctl-replica")
                if r.status_code != 200:
                    rec.error = f"HTTP {r.status_code}: {r.read()[:200]!r}"
                    return
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        rec.ok = rec.error is None
                        return
                    doc = json.loads(line[6:])
                    if "error" in doc:
                        rec.error = f"SSE error: {doc['error']}"
                    else:
                        rec.started = True
                rec.error = rec.error or "stream ended without [DONE]"
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"

    def _worker(self, i: int) -> None:
        import httpx

        with httpx.Client(timeout=self.timeout) as client:
            n = 0
            while not self.stop_event.is_set():
                with self.lock:
                    rec = FleetRequest(len(self.requests), (i + n) % 2 == 0, time.time())
                    self.requests.append(rec)
                self._one(client, rec)
                rec.end = time.time()
                n += 1


def _action(ctl: str, token: str, action: str, engine: str, timeout: float = 180.0) -> dict[str, Any]:
    import httpx

    try:
        r = httpx.post(f"{ctl}/actions/{action}", json={"engine": engine}, timeout=timeout,
                       headers={"Authorization": f"Bearer {token}"})
        doc = r.json() if r.headers.get("content-type", "").startswith("application/json") else {"text": r.text}
        return {"status": r.status_code, "answer": doc}
    except (httpx.HTTPError, ValueError) as exc:
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}


def _engine_status(ctl: str, name: str) -> dict[str, Any]:
    import httpx

    try:
        return (httpx.get(f"{ctl}/status", timeout=5).json().get("engines") or {}).get(name) or {}
    except (httpx.HTTPError, ValueError):
        return {}


def _wait_routable(router: str, name: str, timeout: float) -> bool:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if (httpx.get(router + "/replicas", timeout=2).json().get(name) or {}).get("routable"):
                return True
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    return False


@dataclass
class FleetResult:
    """What :func:`run_fleet_drill` recorded: every request, the phase marks, the summary."""

    requests: list[FleetRequest]
    marks: list[PhaseMark]
    summary: dict[str, Any]
    started: float
    notes: list[str] = field(default_factory=list)


def run_fleet_drill(router: str, ctl: str, token: str, *, replicas: int, clients: int, phase_seconds: float,
                    max_tokens: int = 24, log: Callable[[str], None] = lambda s: None) -> FleetResult:
    """Run the four phases against a running fleet (module docstring) and summarize.

    ``replicas`` >= 3 (one replica per fault: main-0 degraded, main-1 restarted, main-2 killed).
    Raises DrillError for fewer replicas or a kill target without a pid in ``/status``.
    """
    if replicas < 3:
        raise DrillError(f"--replicas: the fleet drill needs >= 3 (one per fault), got {replicas}")
    t0 = time.time()
    notes: list[str] = []
    marks = [PhaseMark("baseline", t0)]
    load = FleetLoad(router, clients, max_tokens).start()
    killed = None
    try:
        time.sleep(phase_seconds)
        log("degrade main-0 (int8)")
        marks.append(PhaseMark("degrade", time.time(), "main-0"))
        marks[-1].detail["degrade"] = _action(ctl, token, "degrade", "main-0")
        time.sleep(phase_seconds)
        marks[-1].detail["rollback"] = _action(ctl, token, "rollback", "main-0")
        log("restart main-1 (rolling: out of rotation, drain, restart, in rotation)")
        marks.append(PhaseMark("restart", time.time(), "main-1"))
        pid_before = _engine_status(ctl, "main-1").get("pid")
        marks[-1].detail["restart"] = _action(ctl, token, "restart", "main-1")
        marks[-1].detail["back_in_rotation"] = _wait_routable(router, "main-1", 60)
        marks[-1].detail["pid_before"], marks[-1].detail["pid_after"] = \
            pid_before, _engine_status(ctl, "main-1").get("pid")
        time.sleep(phase_seconds / 2)
        killed = "main-2"
        pid = _engine_status(ctl, killed).get("pid")
        if not pid:
            raise DrillError(f"controller /status gives no pid for {killed}")
        log(f"SIGKILL {killed} (pid {pid})")
        marks.append(PhaseMark("kill", time.time(), killed, {"pid": pid}))
        os.kill(int(pid), signal.SIGKILL)
        time.sleep(phase_seconds)
        marks[-1].detail["pid_at_end"] = _engine_status(ctl, killed).get("pid")   # a relaunch shows here
    finally:
        load.stop()
    if marks[1].detail.get("degrade", {}).get("status") != 200:
        notes.append(f"degrade answered {marks[1].detail.get('degrade')}")
    summary = summarize(load.requests, marks, killed=killed, t0=t0)
    return FleetResult(load.requests, marks, summary, t0, notes)
