"""Batch-1 decode with the engine's CPU kernels on and off, side by side in one run (issue 12).

    python -m bench.kernels_ab [--models synthetic] [--precisions full,int8] [--output 64] [--threads 1] [--rounds 3]

For each model and precision, ``--rounds`` rounds each load the engine once with
``INFERCTL_CPU_KERNELS=0`` (plain PyTorch: the [in, out] layout, torch's BLAS, the bf16 int8
kernel) and once with the kernels (engine.cpu_kernels), the sides taking turns, and time one
request's decode (16 prompt tokens, ``--output`` greedy tokens, EOS ignored; ``bench.decode``'s
``engine_decode``). Reported: best wall tok/s of each side, the weight bytes read per token, the
GB/s that implies, that as a fraction of the copy bandwidth measured in the same run
(``bench.decode.bandwidth``), and whether both sides produced the same tokens. Prints a Markdown
table; writes nothing (the numbers go to docs/performance.md by hand, with the load average).
``--ops`` instead times the linear kernels alone on the shapes of ``--models`` (synthetic 99.5 MB model:
384→640 QKV, 384→2048 gate/up, 1024→384 down, 384→32000 output; stories260K; smollm2 = SmolLM2-135M),
per row count in ``--rows`` (default 1-64), at
``--threads``: ``gemv_f32`` on ``[out, in]`` against torch (MKL) on ``[in, out]`` and on ``W.T`` and
oneDNN's GEMM on ``[out, in]`` (``engine.onednn``, where this torch has it), and ``gemv_int8`` against
torch's int8 kernel (``engine.quant.int8_matmul``); alternating, best of ``--rounds`` × enough calls for
~0.2 GB of weight reads, wall µs, CPU µs, weight GB/s and GFLOP/s — the reading that sets
``cpu_kernels.GEMV_F32_MAX_BYTES``, ``MAX_BATCH``/``MAX_BATCH_MT``, ``onednn.GEMV_MAX_ROWS`` (the predicate
``f32_kernel_wins``) and ``MAX_BATCH_INT8``.
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


#: (N, K) of each model's linears: QKV, gate/up, down, output layer (bench/models.py; SmolLM2-135M: dim 576,
#: 9/3 heads × 64, FFN 1536, vocab 49152)
OPS_SHAPES = {"synthetic": ((640, 384), (2048, 384), (384, 1024), (32000, 384)),
              "stories260K": ((128, 64), (344, 64), (64, 172), (512, 64)),
              "smollm2": ((960, 576), (3072, 576), (576, 1536), (49152, 576))}


def time_call(fn, nbytes: int, rounds: int) -> tuple[float, float]:
    """Best (wall s, CPU s) per call of ``fn`` over ``rounds`` batches of calls (~0.2 GB read each)."""
    reps = max(3, int(2e8 // max(nbytes, 1)))
    fn()
    best_w = best_c = float("inf")
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(reps):
            fn()
        best_w = min(best_w, (time.perf_counter() - t) / reps)
        best_c = min(best_c, (time.process_time() - c) / reps)
    return best_w, best_c


def ops_table(threads: int, rows: list[int], rounds: int, models: list[str] | None = None) -> None:
    """Print the per-kernel Markdown table of ``--ops`` (see the module doc)."""
    import torch

    from inferctl.engine import cpu_kernels as ck
    from inferctl.engine import onednn
    from inferctl.engine.quant import int8_matmul, quantize_per_channel

    ops = ck.ops_for("cpu", torch.float32)
    if ops is None:
        raise SystemExit("the engine's CPU kernels are not built here (INFERCTL_CPU_KERNELS, compiler)")
    torch.set_num_threads(threads)
    print(f"| N×K | rows | kernel | wall µs | CPU µs | weight GB/s | GFLOP/s |   (f32_kernel_wins: gemv_f32 up to "
          f"{max(b for b in range(1, 65) if ck.f32_kernel_wins(b))} rows at {threads} thread(s); oneDNN "
          f"{'on' if onednn.available() else 'off'})")
    print("|---|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for n, k in [shape for m in (models or ["synthetic"]) for shape in OPS_SHAPES[m]]:
            w = torch.randn(n, k, generator=g)
            wt = w.t().contiguous()
            q = quantize_per_channel(w)
            for b in rows:
                x = torch.randn(b, k, generator=g)
                runs = {"torch [in, out]": (lambda: x @ wt, 4 * n * k), "torch W.T": (lambda: x @ w.t(), 4 * n * k),
                        "torch int8 (bf16 act.)": (lambda: int8_matmul(x, q), n * k)}
                if onednn.available():
                    runs["oneDNN W (engine.onednn)"] = (lambda: onednn.linear(x, w), 4 * n * k)
                if b <= ck.MAX_DECODE_BATCH:
                    runs["gemv_f32"] = (lambda: ops.gemv_f32(x, w), 4 * n * k)
                    runs["gemv_int8 (Q8_0 act.)"] = (lambda: ops.gemv_int8(x, q.qweight, q.scales, k), n * k)
                for name, (fn, nbytes) in runs.items():
                    wall, cpu = time_call(fn, nbytes, rounds)
                    gbps = nbytes / wall / 1e9
                    print(f"| {n}×{k} | {b} | {name} | {wall * 1e6:.0f} | {cpu * 1e6:.0f} | {gbps:.1f} | "
                          f"{2 * b * n * k / wall / 1e9:.0f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="synthetic")
    ap.add_argument("--precisions", default="full,int8")
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", action="store_true", help="time the linear kernels alone (see the module doc)")
    ap.add_argument("--rows", default="1,4,8,16,32,64", help="row counts for --ops")
    a = ap.parse_args(argv)
    bw = bandwidth(threads=a.threads)
    print(f"load average {os.getloadavg()[0]:.2f}; copy bandwidth {bw['copy_gbps']:.1f} GB/s "
          f"({a.threads} thread(s)); read {bw['read_gbps']:.1f} GB/s")
    if a.ops:
        ops_table(a.threads, [int(r) for r in a.rows.split(",")], a.rounds, a.models.split(","))
        return 0
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
