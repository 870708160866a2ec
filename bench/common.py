"""Shared pieces of the benchmark commands: the workload, statistics, machine facts, and the
writer that puts each command's results (with its command line) into ``docs/benchmarks.md``.

Workload (docs/performance.md): ``n`` requests, prompt lengths uniform in ``[16, 256]`` and output
lengths uniform in ``[16, 256]`` tokens from ``numpy.random.default_rng(seed)`` (seed 1234:
the ``n`` prompt lengths, then the ``n`` output lengths, then the prompt ids), prompt token ids
uniform over the vocabulary minus the special ids 0..2, EOS ignored, greedy. With n = 32 this
reproduces the static-batch waste of docs/performance.md's earlier baseline: 38 % padded
prefill, 51 % of decode slots on finished requests. "Useful" tokens are each request's own output tokens only.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("INFERCTL_SHARED", ROOT.parent / "shared"))
STORIES_BIN = Path(os.environ.get("INFERCTL_STORIES260K", SHARED / "models" / "stories260K")) / "stories260K.bin"
GUTENBERG = SHARED / "data" / "gutenberg"
FIXTURES = SHARED / "fixtures"
DOC = ROOT / "docs" / "benchmarks.md"
SEED = 1234


@dataclass(frozen=True)
class Request:
    """One benchmark request: prompt token ids and the number of tokens to generate."""

    prompt: tuple[int, ...]
    max_tokens: int


def make_workload(n: int = 32, vocab_size: int = 512, seed: int = SEED, prompt_range: tuple[int, int] = (16, 256),
                  output_range: tuple[int, int] = (16, 256), first_id: int = 3) -> list[Request]:
    """The mixed workload (see the module doc). Same arguments → same requests.

    Raises ValueError for ``n < 1``, an empty range, or ``vocab_size <= first_id``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    for name, (lo, hi) in (("prompt_range", prompt_range), ("output_range", output_range)):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} must satisfy 1 <= lo <= hi, got {(lo, hi)}")
    if vocab_size <= first_id:
        raise ValueError(f"vocab_size {vocab_size} must exceed first_id {first_id}")
    import numpy as np

    rng = np.random.default_rng(seed)
    plens = rng.integers(prompt_range[0], prompt_range[1] + 1, n)
    olens = rng.integers(output_range[0], output_range[1] + 1, n)
    return [Request(tuple(int(t) for t in rng.integers(first_id, vocab_size, int(p))), int(o))
            for p, o in zip(plens, olens)]


def fixed_workload(n: int, prompt_len: int, output_len: int, vocab_size: int, seed: int = SEED,
                   first_id: int = 3) -> list[Request]:
    """``n`` requests of exactly ``prompt_len`` prompt and ``output_len`` output tokens."""
    return make_workload(n, vocab_size, seed, (prompt_len, prompt_len), (output_len, output_len), first_id)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation (numpy's default method);
    None for no values."""
    vals = sorted(float(v) for v in values)
    if not vals:
        return None
    if len(vals) == 1:
        return vals[0]
    pos = (len(vals) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def machine_facts() -> dict:
    """Load average, CPU count, torch version and threads, Python, platform."""
    import torch

    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {"load_1m": round(load[0], 2), "load_5m": round(load[1], 2), "load_15m": round(load[2], 2),
            "cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "machine": platform.machine(),
            "cpu": _cpu_name()}


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def command_line() -> str:
    """How this command was run, as a shell line (``python -m bench.x ...``)."""
    mod = sys.modules["__main__"].__spec__
    head = ["python", "-m", mod.name] if mod is not None and mod.name else ["python", sys.argv[0]]
    return " ".join(shlex.quote(a) for a in head + sys.argv[1:])


def fmt(x: float | None, digits: int = 1) -> str:
    """A number for a table; ``-`` for no data."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def section(name: str, title: str, body: str, facts: dict | None = None, cmd: str | None = None) -> str:
    """A results section: title, command line, when, machine load, body."""
    f = facts or machine_facts()
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"### {title}\n\nCommand: `{cmd or command_line()}`  \n"
            f"Finished {when}; load average at the start {f['load_1m']} / {f['load_5m']} / {f['load_15m']}"
            " (1/5/15 min) on "
            f"{f['cpus']} CPUs ({f['cpu']}), torch {f['torch']}.\n\n")
    return f"<!-- bench:{name}:start -->\n{head}{body.rstrip()}\n<!-- bench:{name}:end -->"


def write_section(name: str, text: str, doc: Path = DOC) -> Path:
    """Replace section ``name`` of ``doc`` (between its start/end markers) or append it.

    Raises ValueError if ``text`` is not a section named ``name`` (see :func:`section`).
    """
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    if not (text.startswith(start) and text.endswith(end)):
        raise ValueError(f"text is not the section {name!r}")
    doc.parent.mkdir(parents=True, exist_ok=True)
    old = doc.read_text(encoding="utf-8") if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(old):
        new = pattern.sub(lambda _m: text, old, count=1)
    else:
        new = old.rstrip() + "\n\n" + text + "\n"
    doc.write_text(new, encoding="utf-8")
    return doc
