"""Engine vs Hugging Face static batching on the mixed workload, side by side in one run.

    python -m bench.throughput [--models stories260K,synthetic] [--n 32] [--threads 2]

For each model: HF ``generate`` with static batches of 1 and of ``n`` (left padding), HF's own
continuous batching (``ContinuousBatchingManager``, a stronger peer per docs/performance.md), then
the engine (continuous batching, all ``n`` requests at once), same weights (a Hugging Face
directory, see :mod:`bench.models`), same requests (:func:`bench.common.make_workload`,
seed 1234). Reports useful output tok/s, P50/P99 latency, padding ratio, KV waste and the
engine / HF-static ratio, and writes the section ``throughput`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json

from bench.common import fmt, machine_facts, make_workload, md_table, section, write_section
from bench.models import model_dir
from bench.runners import RunResult, best_of, run_engine, run_hf_continuous, run_hf_static

#: Targets (docs/performance.md, earlier baseline): engine >= 3x HF static at n mixed requests; padding <= 1 %;
#: KV waste <= 4 %.
TARGET_RATIO = 3.0
TARGET_PADDING = 0.01
TARGET_KV_WASTE = 0.04


def run(models: list[str], n: int, threads: int, hf_batches: list[int], quick: bool = False,
        hf_continuous: bool = True, repeats: int = 1) -> list[RunResult]:
    """Run every side on every model; returns the results in table order."""
    import torch

    torch.manual_seed(0)
    out: list[RunResult] = []
    for name in models:
        d = model_dir(name)
        vocab = json.loads((d / "config.json").read_text())["vocab_size"]
        reqs = make_workload(n, vocab, output_range=(4, 16) if quick else (16, 256),
                             prompt_range=(4, 32) if quick else (16, 256))
        for b in hf_batches:
            out.append(best_of(repeats, run_hf_static, d, reqs, b, threads, name=name))
        if hf_continuous:
            out.append(best_of(repeats, run_hf_continuous, d, reqs, threads, name=name))
        out.append(best_of(repeats, run_engine, d, reqs, threads, name=name))
    return out


def render(results: list[RunResult]) -> str:
    """The markdown table with ratios and the target verdicts."""
    rows = []
    base: dict[str, RunResult] = {}
    for r in results:
        if r.side == "hf-static" and (r.model not in base or (r.batch or 0) > (base[r.model].batch or 0)):
            base[r.model] = r
    for r in results:
        ref = base.get(r.model)
        ratio = r.tok_s / ref.tok_s if ref is not None else None
        side = {"hf-static": f"HF static, batch {r.batch}", "hf-continuous": "HF continuous batching (sdpa)"}.get(
            r.side, f"engine (continuous, max {r.batch} seqs)")
        rows.append([r.model, side, fmt(r.tok_s), fmt(ratio, 2) + "×" if ratio else "-", fmt(r.p50, 2),
                     fmt(r.p99, 2), fmt(100 * r.padding_ratio, 1) + " %" if r.padding_ratio is not None else "-",
                     fmt(100 * r.prefill_pad_ratio, 0) + " / " + fmt(100 * r.finished_slot_ratio, 0) + " %"
                     if r.prefill_pad_ratio is not None else "-",
                     fmt(100 * r.kv_waste_ratio, 1) + " %" if r.kv_waste_ratio is not None else "-"])
    table = md_table(["model", "side", "useful tok/s", "vs HF static (largest batch)", "P50 s", "P99 s",
                      "padding", "prefill pad / finished slots", "KV waste"], rows)
    verdicts = []
    for r in results:
        if r.side != "engine":
            continue
        ref = base.get(r.model)
        ratio = r.tok_s / ref.tok_s if ref else None
        ok_ratio = ratio is not None and ratio >= TARGET_RATIO
        ok_pad = r.padding_ratio is not None and r.padding_ratio <= TARGET_PADDING
        ok_kv = r.kv_waste_ratio is not None and r.kv_waste_ratio <= TARGET_KV_WASTE
        verdicts.append(f"- {r.model}: throughput ratio {fmt(ratio, 2)}× (target ≥ {TARGET_RATIO:g}×: "
                        f"{'met' if ok_ratio else 'NOT met'}); padding {fmt(100 * (r.padding_ratio or 0), 2)} % "
                        f"(≤ 1 %: {'met' if ok_pad else 'NOT met'}); KV waste "
                        f"{fmt(100 * (r.kv_waste_ratio or 0), 2)} % (≤ 4 %: {'met' if ok_kv else 'NOT met'}); "
                        f"mean batch {fmt(r.extra.get('mean_batch'), 1)}, {r.extra.get('steps')} steps, "
                        f"{r.extra.get('preemptions')} preemptions.")
    return table + "\n\n" + "\n".join(verdicts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="stories260K,synthetic")
    ap.add_argument("--n", type=int, default=32, help="requests (default 32)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hf-batches", default="1,32", help="HF static batch sizes (default 1,32)")
    ap.add_argument("--repeats", type=int, default=2, help="best of N runs per side (default 2)")
    ap.add_argument("--no-hf-continuous", action="store_true", help="skip HF's ContinuousBatchingManager")
    ap.add_argument("--quick", action="store_true", help="tiny lengths (smoke test), no doc write")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args(argv)
    facts = machine_facts()
    results = run(a.models.split(","), a.n, a.threads, [int(b) for b in a.hf_batches.split(",")], a.quick,
                  hf_continuous=not a.no_hf_continuous, repeats=a.repeats)
    body = (f"Best of {a.repeats} runs per side (every run's tok/s in the JSON output, `--json`).\n\n"
            + render(results))
    print(json.dumps([r.to_dict() for r in results], indent=1) if a.json else body)
    if not (a.quick or a.no_write):
        write_section("throughput", section("throughput", f"Throughput: engine vs HF static batching, {a.n} mixed "
                                            "requests", body, facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
