"""Helpers for the server and CLI tests: real engines, the ASGI client, SSE parsing.

Engines are real: stories260K (``load_model`` on the llama2.c checkpoint) or the built-in demo
model, each an ``LLMEngine`` wrapped in a started ``AsyncLLMEngine`` with one torch thread.
Tests drive the FastAPI app in-process through ``httpx.ASGITransport`` (the ASGI transport
buffers whole responses, so streaming bodies arrive complete) and run each coroutine with
``asyncio.run``; the engine's stepping thread serves any event loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from inferctl.engine.async_engine import AsyncLLMEngine
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import build_demo_model, load_model
from inferctl.engine.entrypoints.app import create_app
from inferctl.tools.drill.fleet import free_block

STORIES = "stories260K"
ADMIN_TOKEN = "test-admin-token"
#: llama2.c's documented greedy continuation of "Once upon a time" (models/stories260K/README.md).
REFERENCE = (", there was a little girl named Lily. She loved to play outside in the park. One day, she "
             "saw a big, red ball. She wanted to play with it, but it was too high.")


def stories_engine(stories_dir: Path, name: str = STORIES, **config) -> AsyncLLMEngine:
    """A started AsyncLLMEngine over the real stories260K checkpoint (fp32, CPU)."""
    bundle = load_model(str(Path(stories_dir) / "stories260K.bin"))
    cfg = EngineConfig(num_threads=1, served_model_name=name, **config)
    engine = AsyncLLMEngine(LLMEngine(bundle, cfg))
    engine.start()
    return engine


def demo_engine(name: str = "light", **config) -> AsyncLLMEngine:
    """A started AsyncLLMEngine over the built-in seeded demo model."""
    bundle = build_demo_model(max_seq_len=512)
    cfg = EngineConfig(num_threads=1, served_model_name=name, **config)
    engine = AsyncLLMEngine(LLMEngine(bundle, cfg))
    engine.start()
    return engine


@contextmanager
def engines_running(*engines: AsyncLLMEngine):
    """Shut the engines down on exit."""
    try:
        yield engines
    finally:
        for engine in engines:
            engine.shutdown()


def make_app(engines: dict, default: str | None = None, admin_token: str | None = ADMIN_TOKEN, **kwargs):
    """``create_app`` with the test admin token and the first engine as default."""
    return create_app(engines, admin_token=admin_token, default_model=default or next(iter(engines)), **kwargs)


def client(app) -> httpx.AsyncClient:
    """An in-process ASGI client (no network)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine.test",
                             timeout=60.0)


def run(coro):
    """Run one coroutine to completion on a fresh event loop."""
    return asyncio.run(coro)


def http_post(app, path: str, body, **kwargs) -> httpx.Response:
    """POST ``body`` as JSON to ``path`` of ``app`` in-process; ``kwargs`` go to httpx (``headers=``)."""
    async def go():
        async with client(app) as c:
            return await c.post(path, json=body, **kwargs)
    return run(go())


def http_post_bytes(app, path: str, content: bytes, headers: dict | None = None) -> httpx.Response:
    """POST raw ``content`` labelled ``application/json`` (plus ``headers``) to ``path`` of ``app``."""
    async def go():
        async with client(app) as c:
            return await c.post(path, content=content,
                                headers={"content-type": "application/json", **(headers or {})})
    return run(go())


def http_get(app, path: str, **kwargs) -> httpx.Response:
    """GET ``path`` of ``app`` in-process; ``kwargs`` go to httpx (``headers=``, ``params=``)."""
    async def go():
        async with client(app) as c:
            return await c.get(path, **kwargs)
    return run(go())


# Fixtures for test modules that serve stories260K alone. pytest finds a fixture through the
# module's names, so a test module imports these functions (the fixture names are ``engine``
# and ``app``; the function names differ so that test arguments do not shadow the imports).


@pytest.fixture(scope="module", name="engine")
def stories_engine_fixture(stories_dir):
    """``engine``: stories260K in a started AsyncLLMEngine, one per test module, shut down after it."""
    eng = stories_engine(stories_dir)
    with engines_running(eng):
        yield eng


@pytest.fixture(name="app")
def stories_app_fixture(engine):
    """``app``: a fresh server (test admin token) over the module's ``engine`` alone."""
    return make_app({STORIES: engine})


def auth(token: str = ADMIN_TOKEN) -> dict:
    return {"Authorization": f"Bearer {token}"}


def strict_json(text: str):
    """``json.loads`` that refuses NaN/Infinity literals (RFC 8259 strict JSON)."""
    def refuse(const: str):
        raise ValueError(f"non-standard JSON constant {const}")
    return json.loads(text, parse_constant=refuse)


def sse_events(text: str) -> list:
    """Parse an SSE body into its ``data:`` payloads: dicts, and the string "[DONE]"."""
    events = []
    for block in text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        if not block.startswith("data: "):
            raise ValueError(f"not an SSE data event: {block[:80]!r}")
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else strict_json(payload))
    return events


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.01):
    """Poll an async predicate until it returns a truthy value; raise TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s (last value {value!r})")
        await asyncio.sleep(interval)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, outside the ephemeral range (see ``free_block``)."""
    return free_block(1)


def metric_series(text: str) -> list[str]:
    """The series lines (name + labels) of a Prometheus text exposition, comments excluded."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            out.append(line.rsplit(" ", 1)[0])
    return out


# --------------------------------------------------------------------------- real processes
def wait_ready(url: str, proc, log: Path, timeout: float = 90, interval: float = 0.1) -> None:
    """Wait until ``GET url`` answers 200; fail the test (with the log's tail) when ``proc``
    exits first or ``timeout`` seconds pass (the process is then killed)."""
    import subprocess  # noqa: F401 - proc is a subprocess.Popen
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"not ready in {timeout:g} s: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(interval)


def start_inferctl(args: list[str], log: Path, env: dict | None = None, ready_url: str | None = None,
                   timeout: float = 90, stdout=None, cwd: Path | None = None):
    """Start ``python -m inferctl ARGS`` (in ``cwd``) with stderr to ``log`` (stdout discarded
    unless given) and, with ``ready_url``, wait for it (:func:`wait_ready`). Returns the ``Popen``."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if env is None else env
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "inferctl", *args],
                                stdout=subprocess.DEVNULL if stdout is None else stdout, stderr=err, env=env,
                                cwd=cwd)
    if ready_url is not None:
        wait_ready(ready_url, proc, log, timeout)
    return proc


def stop_all(procs, grace: float = 30) -> None:
    """SIGTERM every process still running, wait up to ``grace`` s each, then kill."""
    import subprocess
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def serve_without_listening(monkeypatch, args: list[str], env: dict | None = None):
    """Run ``inferctl engine serve --port 0 --device cpu ARGS`` through the real CLI with the
    server built but not listening (``GracefulServer.run`` stubbed). Returns ``(result, seen)``:
    the click result and ``{"app": the ASGI app, "engines": the served engines by name}``."""
    from typer.testing import CliRunner

    from inferctl.cli import app
    from inferctl.engine import server as engine_server
    from inferctl.engine.entrypoints.lifecycle import GracefulServer

    seen: dict = {}

    def no_serving(self):   # the server is built with the app; it does not listen
        seen["app"] = self.config.app
        self.started = True

    monkeypatch.setattr(GracefulServer, "run", no_serving)
    real = engine_server.create_app

    def capture(engines, **kw):
        seen["engines"] = engines
        return real(engines, **kw)

    monkeypatch.setattr(engine_server, "create_app", capture)
    res = CliRunner().invoke(app, ["engine", "serve", "--port", "0", "--device", "cpu", *args], env=env)
    return res, seen
