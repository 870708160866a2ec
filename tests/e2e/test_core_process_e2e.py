"""``inferctl engine serve --core-process`` as a real server: the official openai client, SIGTERM,
and a core process that never outlives its server."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import openai
import pytest

from inferctl.controller.supervisor import descendants
from tests.server_helpers import REFERENCE, STORIES, free_port, start_inferctl, stop_all


def _core_pid(server_pid: int) -> int:
    """The engine core: the child of the server that runs ``multiprocessing``'s spawn main."""
    for child in descendants(server_pid):
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"spawn_main" in cmdline:
            return child
    raise AssertionError(f"no engine core process under {server_pid}: {descendants(server_pid)}")


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":          # exited, not yet reaped by its (dead) parent's reaper
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def server(stories_dir, tmp_path):
    port = free_port()
    proc = start_inferctl(["engine", "serve", "--model", str(stories_dir / "stories260K.bin"), "--port", str(port),
                           "--core-process", "--device", "cpu"], tmp_path / "serve.log",
                          ready_url=f"http://127.0.0.1:{port}/ready")
    yield proc, port, tmp_path / "serve.log"
    stop_all([proc])


def test_openai_client_and_sigterm_through_a_core_process_server(server):
    proc, port, log = server
    core = _core_pid(proc.pid)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=STORIES, prompt="Once upon a time", max_tokens=24, temperature=0)
    assert REFERENCE.startswith(done.choices[0].text) and done.usage.completion_tokens == 24
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=STORIES, prompt="Once upon a time", max_tokens=24, temperature=0, stream=True) if c.choices)
    assert streamed == done.choices[0].text
    chat = client.chat.completions.create(model=STORIES, messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
    assert chat.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=STORIES, prompt="x", max_tokens=100000)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, log.read_text()[-2000:]
    assert _gone(core, 10)


def test_the_core_exits_when_its_server_is_killed(server):
    proc, _, _ = server
    core = _core_pid(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert _gone(core, 15)          # the pipe closed: no orphan holding the model's memory


def test_a_bad_model_exits_2_with_the_clis_message(tmp_path):
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"not a model")
    proc = start_inferctl(["engine", "serve", "--model", str(bad), "--port", str(free_port()), "--core-process"],
                          tmp_path / "serve.log")
    assert proc.wait(120) == 2
    text = (tmp_path / "serve.log").read_text()
    assert "error:" in text and "Traceback" not in text


def test_a_stopped_core_dies_with_its_killed_server(server):
    """A stopped core reads no pipe: only the kernel's parent-death signal ends it."""
    proc, _, _ = server
    core = _core_pid(proc.pid)
    os.kill(core, signal.SIGSTOP)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _gone(core, 10)
    finally:
        try:
            os.kill(core, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_the_server_exits_1_when_its_core_dies(server):
    """The supervisor (controller, Kubernetes) restarts a crashed engine: a server whose core
    died must not stay up answering 503 for ever."""
    proc, port, log = server
    os.kill(_core_pid(proc.pid), signal.SIGKILL)
    assert proc.wait(60) == 1, log.read_text()[-2000:]
    text = log.read_text()
    assert "the engine core process failed" in text and "exit code -9" in text and "Traceback" not in text


def test_a_core_stopped_while_it_imports_torch_dies_with_its_killed_server(stories_dir, tmp_path):
    """The parent-death signal is asked for before the engine is imported
    (inferctl.engine.core_boot): a core stopped in the middle of importing torch — before it had
    been tied to its parent, it outlived a killed server as an orphan in state T."""
    proc = start_inferctl(["engine", "serve", "--model", str(stories_dir / "stories260K.bin"),
                           "--port", str(free_port()), "--core-process", "--device", "cpu"], tmp_path / "serve.log")
    core = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                core = _core_pid(proc.pid)
                if b"libtorch" in Path(f"/proc/{core}/maps").read_bytes():
                    break
            except (AssertionError, FileNotFoundError, ProcessLookupError):
                pass
            time.sleep(0.005)
        else:
            pytest.fail("the core never loaded torch")
        os.kill(core, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _gone(core, 10)
    finally:
        if core is not None:
            try:
                os.kill(core, signal.SIGCONT)
            except ProcessLookupError:
                pass
        stop_all([proc])
