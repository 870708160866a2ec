"""The engine's CLI with the real stories260K (trained context 512): a ``--max-model-len``
above it exits 2 at start naming the limit and the override; the override serves it
(hostile-input E2: ``--max-model-len 99999999999999999999999`` was accepted)."""

from __future__ import annotations

from typer.testing import CliRunner

from inferctl.cli import app

HUGE = "99999999999999999999999"


def test_serve_refuses_a_length_past_the_model_before_it_serves(stories_dir):
    res = CliRunner().invoke(app, ["engine", "serve", "--model", str(stories_dir / "stories260K.bin"), "--port", "0",
                                   "--max-model-len", HUGE])
    assert res.exit_code == 2, res.output
    assert f"--max-model-len: {HUGE} is above the model's maximum of 512 tokens" in res.output
    assert "INFERCTL_ALLOW_LONG_MAX_MODEL_LEN=1" in res.output and "serving" not in res.output


def test_generate_refuses_it_and_the_env_override_allows_it(stories_dir):
    argv = ["generate", "--model", str(stories_dir / "stories260K.bin"), "--prompt", "Once", "--max-tokens", "4",
            "--max-model-len", "1024"]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2 and "--max-model-len: 1024 is above the model's maximum of 512 tokens" in res.output
    res = CliRunner().invoke(app, argv, env={"INFERCTL_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert res.exit_code == 0, res.output
    assert "finish_reason=length prompt_tokens=2" in res.output
