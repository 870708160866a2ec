"""Batch-1 decode with the weights in huge pages vs 4 KiB pages, in one process (engine.hugepages).

Two engines over the same model are loaded in one process, one with ``INFERCTL_HUGEPAGES=0`` and one
with it on; each round measures the copy bandwidth (``bench.decode.bandwidth``, 256 MiB, best of 3) and
then one greedy batch-1 request on each engine, the order alternating per round. Prints per side the
median and best tok/s, the median process CPU ms a step, the decode's weight stream
(tok/s × weight bytes) as % of the same round's copy bandwidth, the paired ratios and /proc/loadavg.

``python -m bench.hugepages_ab --threads 2 --rounds 12 --tokens 96`` (model ``synthetic`` by default).
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import time


def _run(eng, tag: str, n: int) -> tuple[float, float, list[int]]:
    from inferctl.engine.sampling_params import SamplingParams

    eng.add_request(tag, list(range(3, 19)), SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    times, cpus, toks = [], [], []
    while eng.has_unfinished_requests():
        outs = eng.step()
        if any(o.new_token_ids for o in outs):
            times.append(time.perf_counter())
            cpus.append(time.process_time())
            for o in outs:
                toks += list(o.new_token_ids)
    steps = len(times) - 1
    if steps < 1:
        raise RuntimeError(f"engine produced {len(times)} tokens, need at least 2")
    return steps / (times[-1] - times[0]), (cpus[-1] - cpus[0]) / steps * 1e3, toks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--tokens", type=int, default=96)
    a = p.parse_args(argv)
    import torch

    from bench.decode import bandwidth
    from bench.models import model_dir
    from bench.runners import load_engine

    torch.set_num_threads(a.threads)
    engs = {}
    for flag in ("0", "1"):
        os.environ["INFERCTL_HUGEPAGES"] = flag
        engs[flag] = load_engine(model_dir(a.model), a.threads, "full", max_num_seqs=1)
    os.environ.pop("INFERCTL_HUGEPAGES")
    wb = engs["1"].model.weight_bytes()
    for e in engs.values():
        _run(e, "warm", 8)
    res: dict[str, list[tuple[float, float, float]]] = {"0": [], "1": []}
    cps: list[float] = []
    ref: list[int] | None = None
    same = True
    for r in range(a.rounds):
        cps.append(bandwidth(256, 3, a.threads)["copy_gbps"])
        for flag in (("0", "1") if r % 2 == 0 else ("1", "0")):
            tok_s, cpu_ms, toks = _run(engs[flag], f"r{r}{flag}", a.tokens)
            ref = ref if ref is not None else toks
            same &= toks == ref
            res[flag].append((tok_s, cpu_ms, cps[-1]))
    for f, name in (("0", "4 KiB pages"), ("1", "huge pages")):
        ts = [x[0] for x in res[f]]
        pct = [100 * x[0] * wb / 1e9 / x[2] for x in res[f]]
        print(f"{name}: tok/s median {st.median(ts):.1f} best {max(ts):.1f}; CPU ms/step median "
              f"{st.median(x[1] for x in res[f]):.2f}; % of same-round copy median {st.median(pct):.1f}, "
              f"best tok/s vs best copy {100 * max(ts) * wb / 1e9 / max(cps):.1f}")
    ratio = [b[0] / a_[0] for a_, b in zip(res["0"], res["1"])]
    cratio = [a_[1] / b[1] for a_, b in zip(res["0"], res["1"])]
    print("paired tok/s huge/4K", [round(x, 2) for x in ratio], "median", round(st.median(ratio), 3))
    print("paired CPU a step 4K/huge", [round(x, 2) for x in cratio], "median", round(st.median(cratio), 3))
    print("copy GB/s", [round(c, 1) for c in cps], f"weights {wb / 1e6:.1f} MB; greedy tokens equal: {same}; "
          f"loadavg {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
