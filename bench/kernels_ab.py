"""Batch-1 decode with the engine's CPU kernels on and off, side by side in one run (issue 12).

    python -m bench.kernels_ab [--models synthetic] [--precisions full,int8] [--output 64] [--threads 1] [--rounds 3]

For each model and precision, ``--rounds`` rounds each load the engine once with
``INFERCTL_CPU_KERNELS=0`` (plain PyTorch: the [in, out] layout, torch/numpy BLAS, the bf16 int8
kernel) and once with the kernels (engine.cpu_kernels), the sides taking turns, and time one
request's decode (16 prompt tokens, ``--output`` greedy tokens, EOS ignored; ``bench.decode``'s
``engine_decode``). Reported: best wall tok/s of each side, the weight bytes read per token, the
GB/s that implies, that as a fraction of the copy bandwidth measured in the same run
(``bench.decode.bandwidth``), and whether both sides produced the same tokens. Prints a Markdown
table; writes nothing (the numbers go to docs/performance.md by hand, with the load average).
"""

from __future__ import annotations

import argparse
import os
import time

from bench.decode import bandwidth
from bench.models import model_dir


def decode_once(model: str, precision: str, output: int, threads: int, kernels: bool) -> dict:
    """One engine load + one batch-1 request: ``{"tok_s", "cpu_s_per_tok", "weight_bytes", "tokens"}``."""
    from inferctl.engine.sampling_params import SamplingParams

    from bench.runners import load_engine

    os.environ["INFERCTL_CPU_KERNELS"] = "1" if kernels else "0"
    eng = load_engine(model_dir(model), threads, precision, max_num_seqs=1)
    prompt = list(range(3, 19))
    eng.add_request("warm", prompt[:4], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    eng.add_request("r", prompt, SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True))
    times, cpu, tokens = [], [], []
    while eng.has_unfinished_requests():
        outs = eng.step()
        for o in outs:
            if o.new_token_ids:
                times.append(time.perf_counter())
                cpu.append(time.process_time())
                tokens.extend(o.new_token_ids)
    n = len(times) - 1
    return {"tok_s": n / (times[-1] - times[0]), "cpu_s_per_tok": (cpu[-1] - cpu[0]) / n,
            "weight_bytes": eng.model.weight_bytes(), "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="synthetic")
    ap.add_argument("--precisions", default="full,int8")
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    bw = bandwidth(threads=a.threads)
    print(f"load average {os.getloadavg()[0]:.2f}; copy bandwidth {bw['copy_gbps']:.1f} GB/s "
          f"({a.threads} thread(s)); read {bw['read_gbps']:.1f} GB/s")
    print("| model | precision | side | best tok/s | CPU ms/tok | weight MB | GB/s | of copy bw | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in a.models.split(","):
        for prec in a.precisions.split(","):
            res: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(a.rounds):
                for side in (False, True):
                    res[side].append(decode_once(model, prec, a.output, a.threads, side))
            same = res[False][0]["tokens"] == res[True][0]["tokens"]
            for side in (False, True):
                best = max(r["tok_s"] for r in res[side])
                cpu = min(r["cpu_s_per_tok"] for r in res[side])
                wb = res[side][0]["weight_bytes"]
                gbps = best * wb / 1e9
                print(f"| {model} | {prec} | {'kernels' if side else 'torch'} | {best:.1f} | {cpu * 1e3:.2f} | "
                      f"{wb / 1e6:.1f} | {gbps:.1f} | {gbps / bw['copy_gbps']:.0%} | {same} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
