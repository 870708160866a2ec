"""``inferctl generate``'s output: the text on stdout exactly as generated (no newline added when
stdout is not a terminal), the ``[finish_reason=… prompt_tokens=…]`` footer on stderr, and on a line
of its own when both go to one file (``2>&1``), where it used to be glued to the text's last word."""

from __future__ import annotations

import os
import subprocess
import sys


def _generate(stories_dir, tmp_path, merged: bool) -> tuple[str, str]:
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    argv = [sys.executable, "-m", "inferctl", "generate", "--model", str(stories_dir / "stories260K.bin"),
            "--prompt", "Once upon a time", "--max-tokens", "12", "--temperature", "0"]
    env = {**os.environ, "INFERCTL_CPU_KERNELS": "0"}
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.run(argv, stdout=fo, stderr=fo if merged else fe, env=env, timeout=120)
    assert proc.returncode == 0, (out.read_text(), err.read_text())
    return out.read_text(), err.read_text()


def test_footer_on_its_own_line_when_merged_and_text_untouched_alone(stories_dir, tmp_path):
    text, err = _generate(stories_dir, tmp_path, merged=False)
    assert text and not text.endswith("\n")                  # the generated text, nothing added
    assert err.strip().endswith("[finish_reason=length prompt_tokens=5]"), err
    merged, _ = _generate(stories_dir, tmp_path, merged=True)
    lines = merged.rstrip("\n").split("\n")
    assert lines[-1] == "[finish_reason=length prompt_tokens=5]", merged
    assert "\n".join(lines[:-1]).endswith(text)               # same greedy text, then the footer's line
