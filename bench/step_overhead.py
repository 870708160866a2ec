"""Per-step engine overhead, A/B against another source tree in the same run (issue 12).

    python -m bench.step_overhead [--model stories260K] [--precision full] [--rounds 3]
                                  [--against DIR] [--output 128] [--write]

Measures, at 1 thread, on the current tree (and on ``--against DIR``, a source tree of another
commit made with ``git archive <commit> | tar -x -C DIR``, run in a subprocess whose
``inferctl`` package is that tree), alternating sides ``--rounds`` times:

* batch 1: one request (16 prompt tokens, ``--output`` greedy tokens, EOS ignored), the CPU
  time of each decode step (``time.thread_time`` around ``LLMEngine.step``): p10 and p50 of
  the steps, best over rounds. CPU time, not wall time: the machine is shared and only the
  same-run ratio counts (docs/performance.md);
* batch 32: ``bench.common.make_workload(32)`` (mixed prompt and output lengths, greedy, EOS
  ignored) run to completion: CPU time per step, best over rounds;
* aten ops of one decode step at batch 1 and at batch 32 (``torch.profiler``, every op
  counted, nested ones included): a count that load cannot blur;
* a hash of every generated token, so "outputs unchanged" is checked in the same run.

Writes the section ``step_overhead`` of docs/benchmarks.md with ``--write``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import fmt, make_workload, md_table, section, write_section
from bench.models import model_dir

PARTS = ("engine", "contract", "controller", "router", "dashboards", "tools")


def measure(model: str, precision: str, output: int) -> dict:
    """One side's figures (see the module doc), in this process's ``inferctl``."""
    import torch
    from torch.profiler import profile

    from bench.runners import load_engine
    from inferctl.engine.sampling_params import SamplingParams

    eng = load_engine(model_dir(model), 1, precision, max_num_seqs=32)
    greedy = dict(temperature=0.0, ignore_eos=True)
    res: dict = {}

    def drain(tag: str) -> tuple[list[float], dict[str, list[int]]]:
        per, out = [], {}
        while eng.has_unfinished_requests():
            c0 = time.thread_time()
            outs = eng.step()
            per.append(time.thread_time() - c0)
            for o in outs:
                out.setdefault(o.request_id, []).extend(o.new_token_ids)
        return per, out

    eng.add_request("warm", list(range(3, 19)), SamplingParams(max_tokens=8, **greedy))
    drain("warm")
    eng.add_request("b1", list(range(3, 19)), SamplingParams(max_tokens=output, **greedy))
    eng.step()
    eng.step()                                     # prefill and first decode out of the figures
    per, out = drain("b1")
    per.sort()
    res["b1_p10_ms"], res["b1_p50_ms"] = per[len(per) // 10] * 1e3, per[len(per) // 2] * 1e3
    tokens = {"b1": out["b1"]}
    reqs = make_workload(32, vocab_size=eng.args.vocab_size)
    for i, r in enumerate(reqs):
        eng.add_request(f"m{i}", list(r.prompt), SamplingParams(max_tokens=min(r.max_tokens, output), **greedy))
    per, out = drain("b32")
    res["b32_ms_per_step"] = sum(per) / len(per) * 1e3
    tokens.update(out)
    for b in (1, 32):
        for i in range(b):
            eng.add_request(f"ops{b}-{i}", list(range(3, 19 + 7 * i)), SamplingParams(max_tokens=12, **greedy))
        for _ in range(4):
            eng.step()
        with profile() as prof:
            eng.step()
        res[f"b{b}_aten_ops"] = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
        drain("ops")
    res["tokens_sha1"] = hashlib.sha1(json.dumps(tokens, sort_keys=True).encode()).hexdigest()[:12]
    res["torch_threads"] = torch.get_num_threads()
    return res


def _shim(tree: Path) -> Path:
    """A folder whose ``inferctl`` package is ``tree`` (symlinks to its parts)."""
    shim = Path(tempfile.mkdtemp(prefix="inferctl-shim-"))
    pkg = shim / "inferctl"
    pkg.mkdir()
    for f in (tree / "inferctl").glob("*.py"):
        (pkg / f.name).write_text(f.read_text())
    for part in PARTS:
        if (tree / part).is_dir():
            (pkg / part).symlink_to((tree / part).resolve())
    return shim


def run_side(tree: Path | None, args) -> dict:
    """``measure`` in a subprocess on ``tree`` (None: the installed ``inferctl``)."""
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[1]
    if tree is not None:
        env["PYTHONPATH"] = str(_shim(tree))
    code = (f"import sys, json; sys.path.append({str(root)!r}); from bench.step_overhead import measure; "
            f"print(json.dumps(measure({args.model!r}, {args.precision!r}, {args.output})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def best(runs: list[dict]) -> dict:
    """Lowest time of each figure over rounds; op counts and hash from the first (they do not vary)."""
    out = dict(runs[0])
    for k in ("b1_p10_ms", "b1_p50_ms", "b32_ms_per_step"):
        out[k] = min(r[k] for r in runs)
    out["hashes"] = sorted({r["tokens_sha1"] for r in runs})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="stories260K")
    ap.add_argument("--precision", default="full")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--against", type=Path, default=None, help="source tree of the other side")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    sides = {"this tree": None} | ({f"{args.against}": args.against} if args.against else {})
    runs: dict[str, list[dict]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for name, tree in sides.items():
            runs[name].append(run_side(tree, args))
    rows = []
    for name in sides:
        b = best(runs[name])
        rows.append([name, fmt(b["b1_p10_ms"], 2), fmt(b["b1_p50_ms"], 2), fmt(b["b32_ms_per_step"], 2),
                     b["b1_aten_ops"], b["b32_aten_ops"], ", ".join(b["hashes"])])
    table = md_table(["side", "batch-1 step p10 (ms CPU)", "p50", "32 mixed: ms CPU/step", "aten ops/step b1",
                      "b32", "tokens sha1"], rows)
    print(table)
    if args.write:
        body = (f"{args.model}, {args.precision}, 1 thread, best of {args.rounds} alternating rounds.\n\n"
                + table + "\n")
        print(write_section("step_overhead", section("step_overhead", "Per-step overhead (A/B)", body)))


if __name__ == "__main__":
    main()
