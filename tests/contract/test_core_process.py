"""The engine core in a child process (``--core-process``): the same answers as one process.

A real child (multiprocessing's spawn context) runs stories260K; the server app is the one
``inferctl engine serve`` builds, over :class:`~inferctl.engine.core_client.CoreClient` instead of
``AsyncLLMEngine``. The in-process app serves the same model beside it for the byte comparisons.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import pytest

from inferctl.engine.async_engine import EngineDeadError
from inferctl.engine.cli import build_core
from inferctl.engine.core_client import CoreClient, CoreStartError
from inferctl.engine.core_process import CoreSpec, PackedError
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.scheduler import AdmissionError
from tests.server_helpers import (  # noqa: F401 - stories_*_fixture are the in-process engine and app
    REFERENCE,
    STORIES,
    auth,
    http_get,
    http_post,
    make_app,
    run,
    sse_events,
    stories_app_fixture,
    stories_engine_fixture,
)

PROMPT = "Once upon a time"


def _spec(stories_dir, **config) -> CoreSpec:
    return CoreSpec(model=str(stories_dir / "stories260K.bin"), tokenizer=None, device="cpu", dtype="auto",
                    config={"max_num_seqs": 8, **config}, served_model_name=STORIES, precision="full",
                    builder=build_core)


@pytest.fixture(scope="module")
def core(stories_dir):
    client = CoreClient(_spec(stories_dir))
    yield client
    client.shutdown()


@pytest.fixture
def core_app(core):
    return make_app({STORIES: core})


def _until(predicate, timeout: float) -> bool:
    """Poll ``predicate`` (every 5 ms) until true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _normalised(text: str) -> str:
    text = re.sub(r'"id":"(chat)?cmpl-[0-9a-f]+"', '"id":"X"', text)
    return re.sub(r'"created":\d+', '"created":0', text)


def test_the_core_reports_the_models_numbers(core):
    info = core.model_info
    assert info["name"] == STORIES and info["max_model_len"] == 512 and info["vocab_size"] == 512
    assert info["tokenizer"].encode(PROMPT, bos=True)[0] == 1          # BOS, then the pieces
    assert core.precision == "full" and core.is_running and core.pid != os.getpid()


@pytest.mark.parametrize("body", [
    {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True},
    {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}},
    {"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "stream": True, "logprobs": 2},     # general path
    {"prompt": PROMPT, "max_tokens": 60, "temperature": 0, "stop": [" the"]},
])
def test_completions_are_the_in_process_servers_bytes(core_app, app, body):
    got, want = http_post(core_app, "/v1/completions", body), http_post(app, "/v1/completions", body)
    assert got.status_code == want.status_code == 200
    assert _normalised(got.text) == _normalised(want.text)
    if body.get("stream"):
        text = "".join(e["choices"][0]["text"] for e in sse_events(got.text)[:-1] if e["choices"])
    else:
        text = got.json()["choices"][0]["text"]
    assert text and (REFERENCE.startswith(text) or text.startswith(REFERENCE) or body.get("stop"))


def test_chat_stream_is_the_in_process_servers_bytes(core_app, app):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 30, "temperature": 0, "stream": True}
    got, want = http_post(core_app, "/v1/chat/completions", body), http_post(app, "/v1/chat/completions", body)
    assert got.status_code == 200 and _normalised(got.text) == _normalised(want.text)


@pytest.mark.parametrize("body", [
    {"prompt": PROMPT, "max_tokens": 100000},                  # beyond max_model_len: checked in the core
    {"prompt": PROMPT, "max_tokens": 5, "temperature": -1},    # the request model's 400
])
def test_bad_requests_get_the_in_process_servers_4xx(core_app, app, body):
    got, want = http_post(core_app, "/v1/completions", body), http_post(app, "/v1/completions", body)
    assert got.status_code == want.status_code == 400
    assert got.json() == want.json()


def test_an_admission_error_crosses_the_process_as_itself(core):
    async def go():
        ids = core.model_info["tokenizer"].encode(PROMPT, bos=True)
        with pytest.raises(AdmissionError) as info:
            async for _ in core.generate("too-long", ids, SamplingParams(max_tokens=100000)):
                pass
        return info.value
    err = run(go())
    assert err.status == 400 and err.field == "max_tokens" and "512" in str(err)


def test_packed_errors_round_trip_and_degrade_to_runtime_error():
    back = PackedError.pack(AdmissionError(503, "prompt", "no room")).unpack()
    assert type(back) is AdmissionError and (back.status, back.field, str(back)) == (503, "prompt", "no room")
    gone = PackedError("no.such.module", "Error", ("boom",)).unpack()
    assert type(gone) is RuntimeError and "no.such.module.Error: boom" in str(gone)


def test_precision_switch_reaches_the_api_process_within_a_second(core, core_app):
    try:
        t0 = time.monotonic()
        core.request_precision("int8")
        assert _until(lambda: core.precision == "int8", timeout=1.0)
        assert time.monotonic() - t0 < 1.0
        assert http_get(core_app, "/stats").json()["engine"]["precision"] == "int8"
        with pytest.raises(ValueError):
            core.request_precision("fp3")       # validated in the API process, nothing sent
    finally:
        core.request_precision("full")
        assert _until(lambda: core.precision == "full", timeout=5.0)


def test_metrics_come_from_the_core_and_count_the_http_layers_errors(core, core_app):
    before = http_get(core_app, "/metrics").text
    http_post(core_app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
    core.metrics["inferctl_engine_request_errors_total"].labels(model=STORIES, reason="internal").inc()
    after = http_get(core_app, "/metrics").text

    def value(text: str, series: str) -> float:
        line = next((s for s in text.splitlines() if s.startswith(series + " ")), None)
        return float(line.rsplit(" ", 1)[1]) if line else 0.0

    done = 'inferctl_engine_requests_total{finish_reason="length",model="stories260K"}'
    assert value(after, done) == value(before, done) + 1
    errors = 'inferctl_engine_request_errors_total{model="stories260K",reason="internal"}'
    assert value(after, errors) == value(before, errors) + 1


def test_draining_in_the_core_makes_readiness_503(core, core_app):
    try:
        assert http_get(core_app, "/ready").status_code == 200
        r = http_post(core_app, "/admin/drain", {"draining": True}, headers=auth())
        assert r.status_code == 200
        assert http_get(core_app, "/ready").status_code == 503
        assert http_get(core_app, "/stats").json()["engine"]["draining"] is True
    finally:
        http_post(core_app, "/admin/drain", {"draining": False}, headers=auth())
    assert http_get(core_app, "/ready").status_code == 200


def test_a_closed_stream_aborts_the_request_in_the_core(core):
    aborted = {"finish_reason": "abort", "model": STORIES}

    async def aborts() -> float:
        await core.refresh_metrics()
        return core.registry.get_sample_value("inferctl_engine_requests_total", aborted) or 0.0

    async def go():
        before = await aborts()
        ids = core.model_info["tokenizer"].encode(PROMPT, bos=True)
        agen = core.generate("cut", ids, SamplingParams(max_tokens=400, ignore_eos=True))
        first = await anext(agen)
        await agen.aclose()                     # the client went away after one token
        for _ in range(500):
            if await aborts() == before + 1:
                break
            await asyncio.sleep(0.01)
        stats = await core.get_stats()
        return first, before, await aborts(), stats
    first, before, after, stats = run(go())
    assert first.request_id == "cut" and not first.finished
    assert after == before + 1                  # finished as "abort", not after its 400 tokens
    assert stats["scheduler"]["running"] == 0


def test_a_killed_core_fails_open_streams_and_readiness(stories_dir):
    client = CoreClient(_spec(stories_dir))
    app = make_app({STORIES: client})

    async def go():
        ids = client.model_info["tokenizer"].encode(PROMPT, bos=True)
        agen = client.generate("victim", ids, SamplingParams(max_tokens=400, ignore_eos=True))
        await anext(agen)
        os.kill(client.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match="exit code -9"):
            async for _ in agen:
                pass
        with pytest.raises(EngineDeadError):
            async for _ in client.generate("after", ids, SamplingParams(max_tokens=4)):
                pass
    try:
        run(go())
        assert not client.is_running
        assert http_get(app, "/ready").status_code == 503
        r = http_post(app, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 503
    finally:
        client.shutdown()


def test_shutdown_ends_the_child_and_open_streams(stories_dir):
    client = CoreClient(_spec(stories_dir))

    async def go():
        ids = client.model_info["tokenizer"].encode(PROMPT, bos=True)
        agen = client.generate("open", ids, SamplingParams(max_tokens=400, ignore_eos=True))
        await anext(agen)
        await asyncio.get_running_loop().run_in_executor(None, client.shutdown)
        with pytest.raises(EngineDeadError):
            async for _ in agen:
                pass
    run(go())
    assert not client.is_running and client._proc.exitcode == 0


def test_a_core_that_cannot_build_reports_the_clis_exit_code(tmp_path):
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"not a model")
    with pytest.raises(CoreStartError) as info:
        CoreClient(CoreSpec(model=str(bad), tokenizer=None, device="cpu", dtype="auto", config={},
                            served_model_name=None, precision="full", builder=build_core))
    assert info.value.exit_code == 2


def test_a_stopped_core_times_calls_out_and_answers_again_once_resumed(stories_dir):
    client = CoreClient(_spec(stories_dir))
    client.CALL_TIMEOUT = 0.5
    try:
        os.kill(client.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="did not answer 'stats' within"):
            run(client.get_stats())
        with pytest.raises(TimeoutError, match="did not answer 'set_draining'"):
            client.set_draining(True)
        assert time.monotonic() - t0 < 5 and client._waiters == {}    # nothing left waiting
        os.kill(client.pid, signal.SIGCONT)
        client.CALL_TIMEOUT = 10
        assert run(client.get_stats())["engine"]["core_process"]["alive"] is True
    finally:
        os.kill(client.pid, signal.SIGCONT)
        client.shutdown()
