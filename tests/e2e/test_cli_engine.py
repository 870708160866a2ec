"""engine/cli.py: ``inferctl generate`` (stdout is only the completion) and ``engine serve`` options."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from inferctl.engine.cli import parse_size
from tests.server_helpers import REFERENCE, STORIES, client, engines_running, make_app, run, stories_engine

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _inferctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferctl", *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout)


def test_generate_prints_only_the_completion_and_matches_the_api(stories_dir):
    proc = _inferctl("generate", "--model", str(stories_dir / "stories260K.bin"), "--prompt", "Once upon a time",
                     "--max-tokens", "40", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    # stdout is exactly the completion (not a tty: no newline added); logs go to stderr
    assert proc.stdout == REFERENCE[:len(proc.stdout)]
    assert proc.stdout.startswith(", there was a little girl named Lily.")
    assert "finish_reason=length" in proc.stderr and "finish_reason" not in proc.stdout

    eng = stories_engine(stories_dir)
    with engines_running(eng):
        app = make_app({STORIES: eng})

        async def go():
            async with client(app) as c:
                return await c.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 40,
                                                             "temperature": 0})
        api_text = run(go()).json()["choices"][0]["text"]
    assert api_text == proc.stdout


def test_generate_without_model_uses_the_demo_model():
    proc = _inferctl("generate", "--prompt", "Hello", "--max-tokens", "7", "--seed", "3", "--temperature", "0.8")
    assert proc.returncode == 0, proc.stderr
    assert "prompt_tokens=6" in proc.stderr  # BOS + 5 bytes of the demo ByteTokenizer
    # the same seeded request on the built-in demo model, in-process
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.loader import build_demo_model
    from inferctl.engine.sampling_params import SamplingParams

    bundle = build_demo_model()
    llm = LLMEngine(bundle, EngineConfig(num_threads=1))
    llm.add_request("x", bundle.tokenizer.encode("Hello", bos=True),
                    SamplingParams(max_tokens=7, temperature=0.8, seed=3))
    text = ""
    while llm.has_unfinished_requests():
        text += "".join(o.new_text for o in llm.step())
    assert proc.stdout == text


@pytest.mark.parametrize("args, words", [
    (["--temperature", "3"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--prompt", ""], "--prompt"),
    (["--model", "/nonexistent/model.bin"], "model not found"),
])
def test_generate_bad_options_fail_cleanly(args, words):
    base = ["generate", "--prompt", "Hi", "--max-tokens", "2"]
    proc = _inferctl(*base, *args)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text, value", [
    ("8000000", 8_000_000), ("64MiB", 64 * 1024**2), ("1.5GiB", int(1.5 * 1024**3)), ("500MB", 500_000_000),
    ("2k", 2000), ("3 KiB", 3072),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "12XB", "-5MiB", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(typer.BadParameter, match="--memory-budget"):
        parse_size(text)


def test_help_is_fast_and_lists_the_engine_commands():
    proc = _inferctl("--help", timeout=30)
    assert proc.returncode == 0
    assert "generate" in proc.stdout and "engine" in proc.stdout
    serve = _inferctl("engine", "serve", "--help", timeout=30)
    for option in ("--model", "--light-model", "--memory-budget", "--max-model-len", "--max-num-seqs",
                   "--max-num-batched-tokens", "--block-size", "--num-kv-blocks", "--kv-cache-dtype",
                   "--precision", "--device", "--admin-token", "--served-model-name", "--host", "--port"):
        assert option in serve.stdout, option
    # heavy modules stay out of the CLI's import path
    check = subprocess.run([sys.executable, "-c", "import sys, inferctl.cli; "
                            "print(sorted(m for m in ('torch', 'fastapi', 'uvicorn') if m in sys.modules))"],
                           capture_output=True, text=True, env=ENV, timeout=30)
    assert check.stdout.strip() == "[]"


@pytest.mark.parametrize("args, words", [
    (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype"),
    (["--precision", "int3"], "--precision"),
    (["--memory-budget", "lots"], "--memory-budget"),
    (["--chat-template", "chatml"], "--chat-template"),
])
def test_serve_rejects_bad_options_before_loading(args, words):
    proc = _inferctl("engine", "serve", "--port", "0", *args)
    assert proc.returncode != 0
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr
