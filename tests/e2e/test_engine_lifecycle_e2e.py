"""End to end: ``inferctl engine serve`` in a subprocess, stopped by signals mid-stream.

SIGTERM drains (``/ready`` 503 ``stopping``, new requests 503 with ``Retry-After``, the open
stream finishes with its finish_reason, exit 0); past ``--shutdown-grace-seconds`` the stream
ends with an error event instead of hanging, and the exit is still 0; a second signal forces
the exit (code 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server_helpers import STORIES, free_port, sse_events

pytestmark = pytest.mark.e2e

PROMPT = "Once upon a time"


class Served:
    """One ``engine serve`` process on a free port, its log, and a streaming client thread."""

    def __init__(self, stories_dir: Path, log: Path, grace: float) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "inferctl", "engine", "serve", "--model", str(stories_dir / "stories260K.bin"),
               "--port", str(self.port), "--max-model-len", "2048", "--allow-long-max-model-len",  # > trained 512
               "--shutdown-grace-seconds", str(grace), "--log-level", "info"]
        self._err = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.stream_text = ""
        self.stream_status: int | None = None
        self.stream_error: Exception | None = None
        self.first_chunk = threading.Event()
        deadline = time.monotonic() + 90
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.close()
                pytest.fail(f"server did not become ready: {log.read_text()[-2000:]}")
            time.sleep(0.1)

    def start_stream(self, max_tokens: int) -> threading.Thread:
        """Stream a completion of ``max_tokens`` tokens (no early EOS) on a thread."""
        def go() -> None:
            body = {"model": STORIES, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            try:
                with httpx.stream("POST", f"{self.base}/v1/completions", json=body, timeout=60) as r:
                    self.stream_status = r.status_code
                    for line in r.iter_lines():
                        if line:
                            self.stream_text += line + "\n\n"
                            self.first_chunk.set()
            except httpx.HTTPError as exc:   # the connection was cut (a forced exit)
                self.stream_error = exc
            self.first_chunk.set()
        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        assert self.first_chunk.wait(30), "the stream did not start"
        return thread

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._err.close()


@pytest.fixture()
def serve(stories_dir, tmp_path):
    started: list[Served] = []

    def start(grace: float) -> Served:
        served = Served(stories_dir, tmp_path / f"serve{len(started)}.log", grace)
        started.append(served)
        return served

    yield start
    for served in started:
        served.close()


def test_sigterm_mid_stream_drains_then_exits_0(serve):
    srv = serve(30)
    # 2,000 tokens (max-model-len 2048) keep the stream open across the drain's checks: since the
    # engine got faster (session 7), 400 tokens could end within the 0.3 s wait (CI saw it)
    thread = srv.start_stream(2000)
    sent = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)                      # the drain starts on uvicorn's next 0.1 s tick
    ready = httpx.get(f"{srv.base}/ready", timeout=5)
    refused = httpx.post(f"{srv.base}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=5)
    assert thread.is_alive(), "the stream ended before the drain could be observed; make it longer"
    assert ready.status_code == 503 and ready.json()["reason"] == "stopping" and ready.headers["retry-after"]
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "engine_draining"
    assert httpx.get(f"{srv.base}/health", timeout=5).status_code == 200      # still live while draining
    thread.join(60)
    events = sse_events(srv.stream_text)
    assert srv.stream_error is None and srv.stream_status == 200 and events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 2000  # every token arrived ...
    assert events[-3]["choices"][0]["finish_reason"] == "length"   # ... and the stream finished normally
    assert srv.proc.wait(30) == 0
    assert time.monotonic() - sent < 30
    log = srv.log.read_text()
    assert "drained: every in-flight request finished" in log and "Traceback" not in log


def test_sigterm_past_a_short_grace_aborts_with_an_error_and_exits_0(serve):
    srv = serve(0.5)
    thread = srv.start_stream(2000)      # far longer than the grace period
    sent = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    thread.join(30)
    assert not thread.is_alive(), "the stream hung past the grace period"
    events = sse_events(srv.stream_text)
    assert events[-1] == "[DONE]"
    err = events[-2]["error"]
    assert err["code"] == "engine_unavailable" and "grace period (0.5 s)" in err["message"]
    assert events[-3]["usage"] is None                       # cut short: no final usage chunk
    assert srv.proc.wait(30) == 0
    assert time.monotonic() - sent < 15          # 0.5 s grace + the error's flush + the process exit
    assert "shutdown grace period of 0.5 s exceeded" in srv.log.read_text()


def test_idle_sigint_exits_0_and_a_second_signal_forces_exit_1(serve):
    idle = serve(30)
    idle.proc.send_signal(signal.SIGINT)
    assert idle.proc.wait(30) == 0
    busy = serve(30)
    thread = busy.start_stream(2000)
    busy.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    busy.proc.send_signal(signal.SIGTERM)
    assert busy.proc.wait(30) == 1
    thread.join(30)
    assert isinstance(busy.stream_error, httpx.RemoteProtocolError)   # forced: the open stream is cut
    assert "second stop signal" in busy.log.read_text()
