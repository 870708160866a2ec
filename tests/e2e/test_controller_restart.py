"""End to end: a controller killed with SIGKILL while its engine serves int8, restarted on the
same config and event log, adopts the engine (same pid, no port clash, no "keeps exiting"),
writes one unclean-shutdown event, and leaves nothing behind on a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from inferctl.controller.supervisor import find_owned, owner_key
from tests.controller_helpers import free_port, wait_for_line

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "e2e-restart-token-0123456789"
pytestmark = pytest.mark.e2e


def _run(tmp_path: Path, cfg: Path, tag: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{tag}.out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "INFERCTL_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "inferctl", "controller", "run", "--config", str(cfg)],
                            cwd=tmp_path, stdout=open(out, "w"), stderr=subprocess.STDOUT, env=env)  # noqa: SIM115
    wait_for_line(out, r"^controller:\s+(\S+)", proc, 120)
    return proc, out


def test_sigkilled_controller_restarts_adopts_its_engine_and_marks_unclean(tmp_path, stories_dir):
    eport, cport = free_port(), free_port()
    cfg = {"listen": {"port": cport}, "event_log": str(tmp_path / "events.db"),
           "engines": [{"name": "main", "kind": "bundled",
                        "launch": {"model": str(stories_dir / "stories260K.bin"), "port": eport}}],
           "gpu": {"kind": "sim"}, "policies": {"precision": {"hold_seconds": 600}},
           "intervals": {"engine_poll_seconds": 0.2, "gpu_poll_seconds": 0.5, "reconcile_seconds": 0.5,
                         "call_timeout_seconds": 0.15, "max_backoff_seconds": 2}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ctl, engine = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{eport}"
    http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})
    owner = owner_key(tmp_path / "events.db", "main")
    first, _ = _run(tmp_path, path, "first")
    second = None
    try:
        pid = http.get(f"{ctl}/status").json()["engines"]["main"]["pid"]
        assert http.post(f"{ctl}/actions/degrade", json={"engine": "main"}).status_code == 200
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert [p.pid for p in find_owned(owner)] == [pid]             # the engine outlived it
        second, out = _run(tmp_path, path, "second")
        st = http.get(f"{ctl}/status").json()["engines"]["main"]
        assert st["pid"] == pid                                           # adopted, not relaunched
        deadline = time.time() + 5
        while http.get(f"{ctl}/status").json()["engines"]["main"]["precision"] != "int8":
            assert time.time() < deadline
            time.sleep(0.1)
        events = http.get(f"{ctl}/events", params={"limit": 1000}).json()["events"]
        assert sum(e["reason"].startswith("unclean shutdown") for e in events) == 1
        assert sum(e["reason"].startswith("engine main adopted") for e in events) == 1
        assert not [e for e in events if e["kind"] == "escalation"]
        assert http.get(f"{engine}/stats").json()["engine"]["precision"] == "int8"
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0
        assert find_owned(owner) == []                                    # nothing left behind
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
        for p in find_owned(owner):
            os.kill(p.pid, signal.SIGKILL)
