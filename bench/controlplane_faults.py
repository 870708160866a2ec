"""Drills of the control plane's own failures, through the real controller and engine.

    python -m bench.controlplane_faults [--skip-diskfull] [--skip-kill]

Both drills run ``inferctl controller run`` (stories260K engine launched by the controller,
simulated GPU, precision policy with 0.2 s polls, a configured admin token) as a subprocess.

**Disk full mid-run.** The event log lives on a 4 MiB tmpfs mounted for the drill (``mount -t
tmpfs``, root only); without mount rights the drill says so and stops. After the start, a
filler file takes every free byte (ENOSPC). Then: one OOM (``POST /admin/fault`` + one request:
the engine's next step runs out of memory for real) → measured: fault time → the first
``/stats`` answer showing int8 (target <= 1 s); an operator drain and undrain → their HTTP
status and ``event_note``; ``GET /events``'s ``buffered``. Then the filler is removed →
measured: how long until the buffered events are in the file (``buffered`` 0), and whether the
OOM's transition and action events and the outage record are there with their original times.

**SIGKILL during a degrade.** An OOM → int8, the controller is killed with SIGKILL while the
engine serves int8, then started again on the same config and event log → checked: the engine
process is the same pid (adopted, not relaunched, no port clash), ``/status`` shows the engine
in int8 and the precision policy in int8, exactly one unclean-shutdown event; then the
controller is stopped with SIGTERM → no process carrying the engine's owner key is left.

Writes the section ``controlplane_faults`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.common import STORIES_BIN, machine_facts, md_table, section, write_section

TOKEN = "drill-admin-token-0123456789"
POLL = 0.2
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(work: Path, event_log: Path) -> Path:
    cfg = {"listen": {"port": _free_port()}, "event_log": str(event_log),
           "engines": [{"name": "main", "kind": "bundled",
                        "launch": {"model": str(STORIES_BIN), "port": _free_port(),
                                   "args": ["--max-oom-retries", "8", "--oom-backoff-seconds", "0.05"]}}],
           "gpu": {"kind": "sim"},
           "policies": {"precision": {"hold_seconds": 600, "confirm_timeout_seconds": 5}},
           "intervals": {"engine_poll_seconds": POLL, "gpu_poll_seconds": 0.5, "reconcile_seconds": 0.5,
                         "call_timeout_seconds": 0.15, "max_backoff_seconds": 2}}
    path = work / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Stack:
    """One ``inferctl controller run`` subprocess and its URLs."""

    def __init__(self, work: Path, config: Path, tag: str) -> None:
        self.out = work / f"controller-{tag}.out"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "INFERCTL_ADMIN_TOKEN": TOKEN}
        self.file = open(self.out, "w")  # noqa: SIM115 - closed in wait
        self.proc = subprocess.Popen([sys.executable, "-m", "inferctl", "controller", "run", "--config",
                                      str(config)], cwd=work, stdout=self.file, stderr=subprocess.STDOUT, env=env)
        cfg = yaml.safe_load(config.read_text())
        self.ctl = f"http://127.0.0.1:{cfg['listen']['port']}"
        self.engine = f"http://127.0.0.1:{cfg['engines'][0]['launch']['port']}"
        self.http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if self.http.get(f"{self.ctl}/status").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"controller exited: {self.out.read_text()[-2000:]}")
            time.sleep(0.2)
        raise RuntimeError("controller not up in 120 s")

    def status(self) -> dict:
        return self.http.get(f"{self.ctl}/status").json()

    def action(self, name: str) -> httpx.Response:
        return self.http.post(f"{self.ctl}/actions/{name}", json={"engine": "main"})

    def oom(self) -> tuple[float, float | None]:
        """Inject one OOM and send a request; (fault sent at, seconds until /stats shows int8)."""
        t0 = time.time()
        self.http.post(f"{self.engine}/admin/fault", json={"kind": "oom", "count": 1})
        model = self.http.get(f"{self.engine}/v1/models").json()["data"][0]["id"]
        try:
            self.http.post(f"{self.engine}/v1/completions", timeout=0.3,
                           json={"model": model, "prompt": "Once upon a time", "max_tokens": 16})
        except httpx.HTTPError:
            pass
        while time.time() - t0 < 10:
            if self.http.get(f"{self.engine}/stats").json()["engine"]["precision"] == "int8":
                return t0, time.time() - t0
            time.sleep(0.02)
        return t0, None

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.file.close()
        return code


def drill_disk_full(work: Path) -> dict:
    mnt = work / "tmpfs"
    mnt.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        return {"skipped": f"mount -t tmpfs failed: {r.stderr.strip()}"}
    stack = None
    try:
        stack = Stack(work, _config(work, mnt / "events.db"), "diskfull")
        time.sleep(1.0)
        filler = mnt / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)     # take every free byte
        for chunk in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
        os.close(fd)
        t_fault, to_int8 = stack.oom()
        drain, undrain = stack.action("drain"), stack.action("undrain")
        time.sleep(1.0)
        buffered = stack.http.get(f"{stack.ctl}/events").json().get("buffered")
        metrics = stack.http.get(f"{stack.ctl}/metrics").text
        failures = next((float(line.split()[-1]) for line in metrics.splitlines()
                         if line.startswith("inferctl_event_log_write_failures_total ")), None)
        filler.unlink()
        t_free = time.time()
        while time.time() - t_free < 30:
            if stack.http.get(f"{stack.ctl}/events").json().get("buffered") == 0:
                break
            time.sleep(0.1)
        recovered_after = time.time() - t_free
        events = stack.http.get(f"{stack.ctl}/events", params={"limit": 1000}).json()["events"]
        after_fault = [e for e in events if e["time"] >= t_fault]
        code = stack.stop()
        stack = None
        return {"to_int8": to_int8, "drain": (drain.status_code, drain.json().get("event_note")),
                "undrain": (undrain.status_code, undrain.json().get("event_note")), "buffered": buffered,
                "write_failures": failures, "recovered_after": recovered_after,
                "transition": any(e["kind"] == "transition" and e["source"] == "precision" for e in after_fault),
                "degrade_action": any(e["kind"] == "action" and "int8" in e["reason"] for e in after_fault),
                "operator_actions": sum(e["kind"] == "action" and e["source"] == "operator" for e in after_fault),
                "outage_record": [e["reason"] for e in after_fault if e["source"] == "event_log"],
                "times_in_order": all(a["time"] <= b["time"] for a, b in zip(after_fault, after_fault[1:])),
                "exit_code": code}
    finally:
        if stack is not None:
            stack.stop(signal.SIGKILL)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def drill_kill(work: Path) -> dict:
    from inferctl.controller.supervisor import find_owned, owner_key

    work.mkdir(parents=True)
    config = _config(work, work / "events.db")
    first = Stack(work, config, "first")
    time.sleep(1.0)
    pid = first.status()["engines"]["main"].get("pid")
    _, to_int8 = first.oom()
    time.sleep(3 * POLL)
    first.stop(signal.SIGKILL)                            # killed while the engine serves int8
    alive_after_kill = find_owned(owner_key(work / "events.db", "main")) != []
    t0 = time.time()
    second = Stack(work, config, "second")
    restart_seconds = time.time() - t0
    time.sleep(3 * POLL)
    st = second.status()["engines"]["main"]
    events = second.http.get(f"{second.ctl}/events", params={"limit": 1000}).json()["events"]
    unclean = [e for e in events if e["reason"].startswith("unclean shutdown")]
    adopted = [e for e in events if e["reason"].startswith("engine main adopted")]
    escalations = [e for e in events if e["kind"] == "escalation"]
    code = second.stop()
    left = find_owned(owner_key(work / "events.db", "main"))
    return {"to_int8": to_int8, "pid_before": pid, "pid_after": st.get("pid"), "engine_alive_after_kill":
            alive_after_kill, "restart_seconds": restart_seconds, "precision_after": st.get("precision"),
            "policy_after": (st.get("policies") or {}).get("precision", {}).get("state"),
            "unclean_events": len(unclean), "adopted_events": len(adopted), "escalations": len(escalations),
            "left_behind": [p.pid for p in left], "exit_code": code}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-diskfull", action="store_true")
    ap.add_argument("--skip-kill", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write docs/benchmarks.md")
    args = ap.parse_args()
    facts = machine_facts()
    with tempfile.TemporaryDirectory() as tmp:
        disk = None if args.skip_diskfull else drill_disk_full(Path(tmp) / "a")
        kill = None if args.skip_kill else drill_kill(Path(tmp) / "b")
    print({"disk_full": disk, "kill": kill})
    body = []
    if disk is not None:
        body.append("**Disk full mid-run** (event log on a 4 MiB tmpfs, filled to ENOSPC):\n")
        if "skipped" in disk:
            body.append(f"skipped: {disk['skipped']}\n")
        else:
            body.append(md_table(["measure", "value"], [
                ["OOM fault → /stats shows int8 (target <= 1 s)", f"{disk['to_int8']:.3f} s" if disk["to_int8"]
                 else "never"],
                ["operator drain: HTTP status, event_note", f"{disk['drain'][0]}, {disk['drain'][1]}"],
                ["operator undrain: HTTP status", str(disk["undrain"][0])],
                ["events buffered in memory while full", str(disk["buffered"])],
                ["write failures counted", str(disk["write_failures"])],
                ["space back → buffer empty", f"{disk['recovered_after']:.2f} s"],
                ["OOM transition + int8 action events in the file afterwards",
                 f"{disk['transition']} / {disk['degrade_action']}"],
                ["operator action events in the file afterwards", str(disk["operator_actions"])],
                ["outage record (source event_log)", "; ".join(disk["outage_record"]) or "none"],
                ["original times, in order", str(disk["times_in_order"])],
                ["controller exit code (SIGTERM)", str(disk["exit_code"])]]))
    if kill is not None:
        body.append("\n**SIGKILL during a degrade, restart on the same event log:**\n")
        body.append(md_table(["measure", "value"], [
            ["OOM fault → int8 before the kill", f"{kill['to_int8']:.3f} s" if kill["to_int8"] else "never"],
            ["engine alive after the controller's SIGKILL", str(kill["engine_alive_after_kill"])],
            ["engine pid before / after the restart", f"{kill['pid_before']} / {kill['pid_after']}"],
            ["restart until /status answers", f"{kill['restart_seconds']:.2f} s"],
            ["engine precision / precision policy state after", f"{kill['precision_after']} / "
             f"{kill['policy_after']}"],
            ["unclean-shutdown events", str(kill["unclean_events"])],
            ["adoption events", str(kill["adopted_events"])],
            ["escalations (\"keeps exiting\")", str(kill["escalations"])],
            ["processes left after a clean stop", str(kill["left_behind"] or "none")],
            ["controller exit code (SIGTERM)", str(kill["exit_code"])]]))
    text = section("controlplane_faults", "Control-plane faults: disk full, controller SIGKILL", "\n".join(body),
                   facts, cmd="python -m bench.controlplane_faults")
    if not args.no_write:
        print(f"wrote {write_section('controlplane_faults', text)}")


if __name__ == "__main__":
    main()
