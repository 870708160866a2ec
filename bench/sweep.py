"""Batch sweep 1 → 64: throughput must not fall as the batch grows.

    python -m bench.sweep [--models stories260K,synthetic] [--batches 1,2,4,8,16,32,64]
                          [--prompt 64] [--output 128]

For each batch size B: B requests of exactly ``--prompt`` prompt and ``--output`` output
tokens, all at once, on the engine (``max_num_seqs`` = B) and on HF static batching (one batch
of B; equal lengths, so no padding: the best case for static batching). Useful tok/s per B;
the verdict says whether the engine's throughput ever fell from one batch size to the next
(a fall within the run-to-run noise of ±5 % is reported as such, with the numbers). The
design notes' reference engine fell from 9.73 tok/s at batch 8 to 4.39 at batch 32.
Writes the section ``sweep`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json

from bench.common import fixed_workload, fmt, machine_facts, md_table, section, write_section
from bench.models import model_dir
from bench.runners import RunResult, best_of, run_engine, run_hf_static

NOISE = 0.05


def run(models: list[str], batches: list[int], prompt: int, output: int, threads: int,
        hf: bool = True, repeats: int = 3) -> dict[str, dict[str, list[RunResult]]]:
    """``{model: {"engine": [...], "hf-static": [...]}}`` in batch order."""
    out: dict[str, dict[str, list[RunResult]]] = {}
    for name in models:
        d = model_dir(name)
        vocab = json.loads((d / "config.json").read_text())["vocab_size"]
        res: dict[str, list[RunResult]] = {"engine": [], "hf-static": []}
        for b in batches:
            reqs = fixed_workload(b, prompt, output, vocab)
            res["engine"].append(best_of(repeats, run_engine, d, reqs, threads, name=name, max_num_seqs=b))
            if hf:
                res["hf-static"].append(best_of(repeats, run_hf_static, d, reqs, b, threads, name=name))
        out[name] = res
    return out


def falls(values: list[float], noise: float = NOISE) -> list[tuple[int, float]]:
    """Indices i where ``values[i] < values[i-1]`` and by how much (relative); a fall within
    ``noise`` is included too — the caller reports it as noise."""
    return [(i, 1 - values[i] / values[i - 1]) for i in range(1, len(values)) if values[i] < values[i - 1]]


def render(results: dict[str, dict[str, list[RunResult]]], batches: list[int]) -> str:
    parts = []
    for name, res in results.items():
        rows = []
        for i, b in enumerate(batches):
            e = res["engine"][i]
            h = res["hf-static"][i] if res["hf-static"] else None
            rows.append([b, fmt(e.tok_s), fmt(e.p99, 2), fmt(h.tok_s) if h else "-",
                         fmt(e.tok_s / h.tok_s, 2) + "×" if h else "-"])
        parts.append(f"**{name}**\n\n" + md_table(["batch", "engine tok/s", "engine P99 s", "HF static tok/s",
                                                     "engine / HF"], rows))
        tps = [r.tok_s for r in res["engine"]]
        fl = falls(tps)
        real = [(i, d) for i, d in fl if d > NOISE]
        if not fl:
            parts.append(f"- {name}: engine throughput never falls from batch {batches[0]} to {batches[-1]} "
                         f"({fmt(tps[0])} → {fmt(tps[-1])} tok/s): target met.")
        elif not real:
            parts.append(f"- {name}: small dips within the ±{NOISE:.0%} run-to-run noise: "
                         + ", ".join(f"batch {batches[i - 1]}→{batches[i]} −{d:.1%}" for i, d in fl)
                         + f"; {fmt(tps[0])} → {fmt(tps[-1])} tok/s overall: target met within noise.")
        else:
            parts.append(f"- {name}: engine throughput FALLS: "
                         + ", ".join(f"batch {batches[i - 1]}→{batches[i]} −{d:.1%}" for i, d in real)
                         + ": target NOT met.")
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="stories260K,synthetic")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-hf", action="store_true", help="engine only")
    ap.add_argument("--repeats", type=int, default=3, help="best of N runs per point (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke test: no doc write")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    facts = machine_facts()
    batches = [int(b) for b in a.batches.split(",")]
    results = run(a.models.split(","), batches, a.prompt, a.output, a.threads, hf=not a.no_hf, repeats=a.repeats)
    body = (f"B requests of {a.prompt} prompt + {a.output} output tokens each, all at once; best of {a.repeats} "
            "runs per point.\n\n"
            + render(results, batches))
    print(body)
    if not (a.quick or a.no_write):
        write_section("sweep", section("sweep", "Batch sweep", body, facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
