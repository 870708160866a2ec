"""End to end with the real SmolLM2-135M-Instruct GGUF: `inferctl engine serve --model X.gguf`
and `inferctl up --model X.gguf` answer "What is the capital of France?" through the official
``openai`` client with the model's own chat template (temperature 0: "Paris", ending on the
template's <|im_end|>), and `inferctl generate --model X.gguf` prints the engine's greedy text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.controller_helpers import wait_for_line
from tests.gguf_helpers import require_smollm
from tests.server_helpers import free_port, start_inferctl, stop_all, wait_ready

ROOT = Path(__file__).resolve().parents[2]
#: loading dequantizes 272 tensors and builds a 49k-token BPE: seconds on a quiet machine, minutes on a busy one
LOAD_TIMEOUT = 600

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]


def _ask_capital(base_url: str) -> tuple[str, str]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=300, max_retries=0)
    r = client.chat.completions.create(model=client.models.list().data[0].id, temperature=0, max_tokens=48,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    return r.choices[0].message.content, r.choices[0].finish_reason


def test_engine_serve_gguf_chat_answers_paris(tmp_path):
    gguf = require_smollm()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_inferctl(["engine", "serve", "--model", str(gguf), "--port", str(port), "--max-model-len", "1024"],
                          tmp_path / "engine.log")
    try:
        wait_ready(f"{url}/ready", proc, tmp_path / "engine.log", timeout=LOAD_TIMEOUT)
        text, finish = _ask_capital(url)
        assert "Paris" in text
        assert finish == "stop"                 # ended on <|im_end|> (EOS id 2), not on max_tokens
        assert "<|im_end|>" not in text and "<|im_start|>" not in text
    finally:
        stop_all([proc])


def test_up_with_a_gguf_model_answers_paris(tmp_path):
    gguf = require_smollm()
    engine_port, controller_port = free_port(), free_port()
    out = tmp_path / "up.out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # the config only lengthens the engine's health timeout (60 s by default): on a shared, busy
    # machine the load alone can take longer; --model applies to its launched engine
    cfg = tmp_path / "up.yaml"
    cfg.write_text(yaml.safe_dump({"engines": [{"name": "main", "kind": "bundled",
                                                "launch": {"health_timeout_seconds": LOAD_TIMEOUT}}]}))
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "inferctl", "up", "--config", str(cfg), "--model", str(gguf),
                                 "--engine-port", str(engine_port), "--controller-port", str(controller_port),
                                 "--engine-log-dir", str(tmp_path / "logs")],
                                cwd=tmp_path, stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        m = wait_for_line(out, r"^engine:\s+(http://127\.0\.0\.1:\d+)", proc, LOAD_TIMEOUT)
        wait_ready(f"{m.group(1)}/ready", proc, out, timeout=LOAD_TIMEOUT)
        text, _finish = _ask_capital(m.group(1))
        assert "Paris" in text
    finally:
        stop_all([proc], grace=60)
    assert "Traceback" not in out.read_text()


def test_generate_with_a_gguf_model_prints_the_greedy_text():
    gguf = require_smollm()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "inferctl", "generate", "--model", str(gguf),
                        "--prompt", "The capital of France is", "--max-tokens", "48", "--temperature", "0"],
                       capture_output=True, text=True, env=env, timeout=LOAD_TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(" Paris"), r.stdout
    assert "prompt_tokens=5]" in r.stderr        # "The capital of France is": 5 tokens, no BOS (add_bos_token false)
