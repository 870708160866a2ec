"""Batch-1 decode with the weights in huge pages vs 4 KiB pages, in one process, against the copy bound.

    python -m bench.hugepages_ab [--model synthetic] [--precision full] [--threads 2] [--rounds 12] [--output 64]

Two engines of the same model are loaded in this process, one with ``INFERCTL_HUGEPAGES=0`` and one with
``INFERCTL_HUGEPAGES=1`` (the loader's switch for moving the full-precision weights into a
``MADV_HUGEPAGE`` buffer; on a tree without that switch both sides are the same and the ratio reads ~1).
Each round measures the copy bandwidth (``bench.decode.bandwidth``, 256 MiB, best of 3) and then one
batch-1 greedy decode per side (16 prompt ids, ``--output`` tokens, EOS ignored; tok/s over the tokens
after the first, as ``bench.peer`` counts), the order of the sides flipped every round. Printed per round:
tok/s, process CPU ms per token, the fraction of that round's copy bound (tok/s × weight bytes ÷ copy
bytes/s), whether both sides produced the same tokens, the 1-minute load; then paired medians. Memory
bandwidth moves with the other cores' load, so read the paired ratios, not the absolute rates.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def anon_huge_kb() -> int | None:
    """This process's ``AnonHugePages`` (KiB) from ``/proc/self/smaps_rollup``; None where absent."""
    try:
        with open("/proc/self/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def decode(eng, output: int) -> tuple[float, tuple[int, ...], float]:
    """One batch-1 greedy request: (tok/s after the first token, tokens, process CPU seconds per token)."""
    from inferctl.engine.sampling_params import SamplingParams

    eng.add_request(f"r{time.monotonic_ns()}", list(range(3, 19)),
                    SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True))
    times: list[float] = []
    toks: list[int] = []
    c0 = time.process_time()
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.new_token_ids:
                times.append(time.perf_counter())
                toks += list(o.new_token_ids)
    if len(times) < 2:
        raise RuntimeError(f"engine produced {len(times)} tokens, need at least 2")
    return (len(times) - 1) / (times[-1] - times[0]), tuple(toks), (time.process_time() - c0) / len(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="synthetic")
    ap.add_argument("--precision", default="full")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--output", type=int, default=64)
    a = ap.parse_args(argv)

    import torch

    from bench.decode import bandwidth
    from bench.models import model_dir
    from bench.runners import load_engine

    torch.set_num_threads(a.threads)
    engs = {}
    old = os.environ.get("INFERCTL_HUGEPAGES")
    try:
        for side, flag in (("4k", "0"), ("huge", "1")):
            os.environ["INFERCTL_HUGEPAGES"] = flag
            engs[side] = load_engine(model_dir(a.model), a.threads, a.precision, max_num_seqs=1)
            print(f"loaded {side}: AnonHugePages {anon_huge_kb()} kB", flush=True)
    finally:
        if old is None:
            os.environ.pop("INFERCTL_HUGEPAGES", None)
        else:
            os.environ["INFERCTL_HUGEPAGES"] = old
    wb = engs["4k"].model.weight_bytes()
    for e in engs.values():
        decode(e, 8)
    res: dict[str, list[tuple[float, tuple[int, ...], float, float]]] = {"4k": [], "huge": []}
    for rnd in range(a.rounds):
        bw = bandwidth(256, 3, a.threads)["copy_gbps"] * 1e9
        for side in (("4k", "huge") if rnd % 2 == 0 else ("huge", "4k")):
            tps, toks, cpu = decode(engs[side], a.output)
            res[side].append((tps, toks, cpu, tps * wb / bw))
        line = " ".join(f"{s} {r[-1][0]:.1f} tok/s cpu {r[-1][2] * 1e3:.2f} ms {100 * r[-1][3]:.0f} %"
                        for s, r in res.items())
        print(f"round {rnd}: copy {bw / 1e9:.1f} GB/s; {line}; tokens equal {res['4k'][-1][1] == res['huge'][-1][1]}; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
    for s, r in res.items():
        print(f"{s}: median {statistics.median(x[0] for x in r):.1f} tok/s, best {max(x[0] for x in r):.1f}, "
              f"median {100 * statistics.median(x[3] for x in r):.0f} % of the round's copy bound, "
              f"median CPU {statistics.median(x[2] for x in r) * 1e3:.2f} ms a token")
    ratio = [h[0] / n[0] for n, h in zip(res["4k"], res["huge"])]
    cpu = [h[2] / n[2] for n, h in zip(res["4k"], res["huge"])]
    print(f"paired huge / 4k: tok/s median {statistics.median(ratio):.3f} "
          f"(min {min(ratio):.3f}, max {max(ratio):.3f}); "
          f"CPU a token median {statistics.median(cpu):.3f}; weight bytes {wb}; {a.threads} threads, {a.precision}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
