"""`inferctl up`: starts the engine and the controller, prints both URLs, stops both on SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.controller_helpers import free_port, port_is_free, wait_for_line

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_up_prints_urls_serves_status_and_stops_cleanly(tmp_path, sig):
    engine_port, controller_port = free_port(), free_port()
    out = tmp_path / "up.out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("INFERCTL_ADMIN_TOKEN", None)
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "inferctl", "up",
                                 "--engine-port", str(engine_port), "--controller-port", str(controller_port),
                                 "--engine-log-dir", str(tmp_path / "logs")],
                                cwd=tmp_path, stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        m = wait_for_line(out, r"^engine:\s+(http://127\.0\.0\.1:(\d+))\s+\(main, pid (\d+)\)", proc, 90)
        assert int(m.group(2)) == engine_port
        engine_pid = int(m.group(3))
        c = wait_for_line(out, r"^controller:\s+(http://127\.0\.0\.1:(\d+))", proc, 30)
        assert int(c.group(2)) == controller_port
        token = wait_for_line(out, r"^admin token: (\S+)$", proc, 5).group(1)
        status = None
        deadline = time.time() + 20
        while time.time() < deadline:
            status = httpx.get(f"{c.group(1)}/status", timeout=5).json()
            if status["engines"]["main"]["up"]:
                break
            time.sleep(0.3)
        assert status["engines"]["main"]["up"] is True
        assert status["engines"]["main"]["supervised"] is True
        assert status["engines"]["main"]["pid"] == engine_pid
        assert status["gpus"]["source"] in ("sim", "nvml")
        assert httpx.get(f"{m.group(1)}/health", timeout=5).status_code == 200
        # the generated token drives the actions; none is 401
        assert httpx.post(f"{c.group(1)}/actions/drain", json={"engine": "main"}, timeout=5).status_code == 401
        r = httpx.post(f"{c.group(1)}/actions/drain", json={"engine": "main"},
                       headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 200 and r.json()["ok"] is True
        proc.send_signal(sig)
        assert proc.wait(timeout=40) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert "stopped" in text and "Traceback" not in text
    assert not alive(engine_pid)
    assert port_is_free(engine_port) and port_is_free(controller_port)
    assert (tmp_path / "inferctl-events.db").exists()


@pytest.mark.e2e
def test_up_reports_a_bad_config_in_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("intervals:\n  engine_poll_seconds: 1\n  call_timeout_seconds: 2\n")
    r = subprocess.run([sys.executable, "-m", "inferctl", "up", "--config", str(bad)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2
    assert "intervals.call_timeout_seconds" in r.stderr and "Traceback" not in r.stderr
