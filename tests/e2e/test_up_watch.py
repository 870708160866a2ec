"""The runtime assembly watching an engine it did not start (a vLLM URL) with a replayed GPU."""

from __future__ import annotations

import http.server
import threading

import pytest

from inferctl.controller.config import parse_config
from inferctl.controller.runtime import build_runtime

VLLM_METRICS = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="M"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="M"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="M"} 0.41
"""


@pytest.fixture
def fake_vllm():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = VLLM_METRICS if self.path == "/metrics" else b"not found"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_watch_a_vllm_engine_with_a_replayed_gpu(tmp_path, fake_vllm, fixtures_dir):
    from prometheus_client import generate_latest

    capture = fixtures_dir / "gpu" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load__querygpu.csv"
    cfg = parse_config({"event_log": str(tmp_path / "ev.db"),
                        "engines": [{"name": "vllm-a", "kind": "vllm", "url": fake_vllm}],
                        "gpu": {"kind": "replay", "options": {"path": str(capture)}}})
    rt = build_runtime(cfg, "tok")
    try:
        assert rt.supervisors == {}
        # no admin API: no precision; liveness (outage events) watches every engine
        assert set(rt.controller.policies["vllm-a"]) == {"fragmentation", "liveness"}
        rt.controller.tick()
        st = rt.controller.status()
        e = st["engines"]["vllm-a"]
        assert (e["up"], e["running"], e["waiting"], e["kv_usage_ratio"]) == (True, 3, 1, 0.41)
        assert e["supervised"] is False
        [gpu] = st["gpus"]["devices"]
        assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["lost"] is False
        text = generate_latest(rt.controller.registry).decode()
        assert 'inferctl_kv_cache_usage_ratio{engine="vllm-a"} 0.41' in text
        assert 'inferctl_engine_up{engine="vllm-a"} 1.0' in text
        res = rt.controller.manual("restart", "vllm-a")
        assert res.refused and "not launched by the controller" in res.message
    finally:
        rt.close()
    assert rt.closed


def test_auto_gpu_without_driver_or_bundled_engine_is_a_clear_error(tmp_path, fake_vllm, monkeypatch):
    from inferctl.controller.gpu import nvml

    monkeypatch.setattr(nvml, "probe_nvml", lambda module=None: "no driver (test)")
    cfg = parse_config({"event_log": str(tmp_path / "ev.db"),
                        "engines": [{"name": "vllm-a", "kind": "vllm", "url": fake_vllm}]})
    with pytest.raises(ValueError, match="gpu.kind: auto found no NVIDIA driver"):
        build_runtime(cfg, "tok")


@pytest.mark.e2e
def test_controller_run_watches_and_stops_on_sigterm(tmp_path, fake_vllm, fixtures_dir):
    import os
    import re
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx
    import yaml

    from tests.controller_helpers import free_port, port_is_free

    port = free_port()
    capture = fixtures_dir / "gpu" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__idle__querygpu.csv"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "listen": {"port": port}, "event_log": str(tmp_path / "ev.db"),
        "engines": [{"name": "vllm-a", "kind": "vllm", "url": fake_vllm}],
        "gpu": {"kind": "replay", "options": {"path": str(capture)}}}))
    out = tmp_path / "out.txt"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "INFERCTL_ADMIN_TOKEN": "tok-up-watch-e2e-0123"}
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "inferctl", "controller", "run", "--config",
                                 str(tmp_path / "c.yaml")], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.time() + 60
        while "controller:" not in out.read_text():
            assert proc.poll() is None and time.time() < deadline, out.read_text()
            time.sleep(0.1)
        text = out.read_text()
        assert re.search(r"^watching:\s+http://127\.0\.0\.1:\d+\s+\(vllm-a, vllm\)$", text, re.MULTILINE)
        assert "admin token: from --token / $INFERCTL_ADMIN_TOKEN" in text   # never printed when given
        assert "tok-up-watch-e2e-0123" not in text
        base = f"http://127.0.0.1:{port}"
        for _ in range(50):
            st = httpx.get(f"{base}/status", timeout=5).json()
            if st["engines"]["vllm-a"]["up"]:
                break
            time.sleep(0.1)
        assert st["engines"]["vllm-a"]["kv_usage_ratio"] == 0.41
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert port_is_free(port)
