"""bench.profile_step: argument checks and a real profile (batch 1 and 32 mixed) of the 2-layer synthetic model."""

from __future__ import annotations

import pytest

from bench import profile_step


@pytest.mark.parametrize("args", [["--threads", "0"], ["--top", "0"]])
def test_bad_arguments_exit_2(args, capsys):
    with pytest.raises(SystemExit) as exc:
        profile_step.main(args)
    assert exc.value.code == 2
    assert "must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("mixed", [False, True])
def test_profile_of_a_real_engine(mixed, capsys):
    argv = ["--model", "synthetic-tiny", "--threads", "1", "--top", "5", "--sort", "cumulative"]
    argv += ["--mixed"] if mixed else []
    assert profile_step.main(argv) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("synthetic-tiny full " + ("32 mixed" if mixed else "batch 1"))
    rate = float(first.split(": ")[1].split(" tok/s")[0].replace(",", ""))
    assert rate > 0
    if mixed:
        assert "'steps':" in first        # the run's steps and mean batch are printed
    assert "function calls" in out
    assert "engine.py" in out          # the profile reaches the engine's step


def test_parts_times_each_part_of_real_steps_and_unwraps(capsys):
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.runner import ModelRunner

    step, execute = LLMEngine.step, ModelRunner.execute
    assert profile_step.main(["--model", "synthetic-tiny", "--threads", "1", "--parts", "--requests", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("synthetic-tiny full batch 1, 1 threads")
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert int(rows["LLMEngine.step"][1]) >= 2 * 64      # every step of both requests was timed
    assert float(rows["LLMEngine.step"][4]) >= float(rows["ModelRunner.execute"][4]) > 0   # nested: step ⊇ execute
    assert LLMEngine.step is step and ModelRunner.execute is execute   # the wrappers are gone
    with pytest.raises(SystemExit):
        profile_step.main(["--parts", "--requests", "0"])
