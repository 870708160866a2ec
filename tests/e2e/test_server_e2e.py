"""End to end: ``inferctl engine serve`` in a subprocess on 127.0.0.1, driven by the official
``openai`` client (completions, chat, streaming, errors), a real-socket client disconnect,
and a clean SIGTERM shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import openai
import pytest

from tests.server_helpers import ADMIN_TOKEN, REFERENCE, STORIES, free_port, sse_events, start_inferctl, strict_json

pytestmark = pytest.mark.e2e

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server(stories_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERCTL_ADMIN_TOKEN": ADMIN_TOKEN}
    base = f"http://127.0.0.1:{port}"
    proc = start_inferctl(["engine", "serve", "--model", str(stories_dir / "stories260K.bin"), "--light-model", "demo",
                           "--light-served-model-name", "light", "--port", str(port), "--max-model-len", "2048",
                           "--allow-long-max-model-len", "--memory-budget", "512MiB", "--log-level", "info"],
                          log, env=env, ready_url=f"{base}/health", timeout=60, stdout=subprocess.PIPE)
    yield {"base": base, "proc": proc, "log": log}
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_openai_completions_greedy_reference(oai):
    resp = oai.completions.create(model=STORIES, prompt=PROMPT, max_tokens=60, temperature=0)
    assert resp.model == STORIES
    assert resp.choices[0].text[:100] == REFERENCE[:100]
    assert resp.usage.prompt_tokens == 5 and resp.usage.completion_tokens <= 60


def test_openai_streaming_completions_and_chat(oai):
    plain = oai.completions.create(model=STORIES, prompt=PROMPT, max_tokens=30, temperature=0).choices[0].text
    stream = oai.completions.create(model=STORIES, prompt=PROMPT, max_tokens=30, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == plain

    chat = oai.chat.completions.create(model=STORIES, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=30, temperature=0)
    assert chat.choices[0].message.content == plain and chat.choices[0].message.role == "assistant"
    chunks = list(oai.chat.completions.create(model=STORIES, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=30, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert "".join((c.choices[0].delta.content or "") for c in chunks if c.choices) == plain
    assert chunks[-1].usage.completion_tokens == 30 and chunks[-1].usage.prompt_tokens == 5


def test_openai_light_model_and_errors(oai):
    light = oai.completions.create(model="light", prompt=PROMPT, max_tokens=5, temperature=0)
    assert light.model == "light" and light.usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=STORIES, prompt=PROMPT, max_tokens=10**12)
    assert info.value.status_code == 400 and info.value.body["param"] == "max_tokens"
    assert "2043 = max_model_len 2048 - prompt 5" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=STORIES, messages=[], max_tokens=3)
    with pytest.raises(openai.NotFoundError) as info:
        oai.completions.create(model="m-unknown", prompt=PROMPT, max_tokens=3)
    assert info.value.body["code"] == "model_not_found"
    models = sorted(m.id for m in oai.models.list())
    assert models == sorted([STORIES, "light"])


def test_real_socket_disconnect_frees_blocks(server):
    base = server["base"]
    before = strict_json(httpx.get(f"{base}/stats").text)
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", f"{base}/v1/completions", json={
                "model": STORIES, "prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True}) as r:
            assert r.status_code == 200
            got = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got.append(line)
                if len(got) >= 3:
                    break
    assert sse_events("\n\n".join(got))[0]["object"] == "text_completion"
    deadline = time.monotonic() + 10
    while True:
        s = strict_json(httpx.get(f"{base}/stats").text)
        if (s["kv_cache"]["blocks_used"] == 0 and s["scheduler"]["running"] == 0
                and s["requests"]["by_finish_reason"]["abort"] == before["requests"]["by_finish_reason"]["abort"] + 1):
            break
        assert time.monotonic() < deadline, s["kv_cache"]
        time.sleep(0.02)
    assert s["requests"]["recent"][-1]["finish_reason"] == "abort"
    assert s["requests"]["recent"][-1]["completion_tokens"] < 2000


def test_admin_and_health_over_http(server):
    base = server["base"]
    assert httpx.post(f"{base}/admin/drain", json={"draining": True}).status_code == 401
    r = httpx.post(f"{base}/admin/route", json={"model": STORIES, "to": "light"},
                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200
    assert httpx.get(f"{base}/health").json()["status"] == "degraded"
    httpx.post(f"{base}/admin/route", json={"model": STORIES, "to": None},
               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert httpx.get(f"{base}/health").json() ["status"] == "ok"


def test_sigterm_shuts_down_cleanly(server):
    proc = server["proc"]
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(20)
    # the engine drains on SIGTERM and exits 0 (plain uvicorn would re-raise the signal: -15)
    assert rc == 0
    log = server["log"].read_text()
    assert "Traceback" not in log
    assert "Application shutdown complete" in log
    assert f"engines stopped: {STORIES}, light" in log
