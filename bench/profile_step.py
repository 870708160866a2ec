"""Where an engine step's time goes: a cProfile of batch-1 decode or of the 32-mixed workload (issue 12).

    python -m bench.profile_step [--model stories260K] [--precision full] [--threads 2]
                                 [--mixed] [--sort tottime] [--top 18]

* default: one request (16 prompt tokens, greedy, EOS ignored) on an engine of ``max_num_seqs=1``;
  prints the best-of-3 decode rate over 128 tokens (wall time, first step excluded), then the
  profile of a 64-token run;
* ``--mixed``: ``bench.common.make_workload(32, vocab)`` (the peer benchmark's 32 mixed requests)
  on an engine of ``max_num_seqs=32``: prints tok/s, steps and mean batch of a warm run, then the
  profile of a second run.

cProfile adds per-call overhead to Python functions (not to the C++/ATen ops it calls), so the
Python parts read larger than they are: compare profiles with each other, not with wall rates.
Reading one is described in docs/performance.md.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time


def _batch1(eng, n: int) -> float:
    """Decode ``n`` greedy tokens of one request; tok/s over the steps after the first (prefill)."""
    from inferctl.engine.sampling_params import SamplingParams

    eng.add_request(f"r{time.monotonic_ns()}", list(range(3, 19)),
                    SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    stamps = []
    while eng.has_unfinished_requests():
        eng.step()
        stamps.append(time.perf_counter())
    return (len(stamps) - 2) / (stamps[-1] - stamps[1]) if len(stamps) > 2 else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_step", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="stories260K", help="A bench.models name (stories260K, synthetic, …).")
    ap.add_argument("--precision", default="full", help="full | int8 | int4 (as the engine's --precision).")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mixed", action="store_true", help="Profile the 32 mixed requests instead of batch 1.")
    ap.add_argument("--sort", default="tottime", help="pstats sort key (tottime, cumulative, …).")
    ap.add_argument("--top", type=int, default=18, help="Rows of the profile to print.")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.top < 1:
        ap.error("--threads and --top must be >= 1")

    import torch

    from bench.common import make_workload
    from bench.models import model_dir
    from bench.runners import load_engine, run_engine

    torch.set_num_threads(a.threads)
    mdir = model_dir(a.model)
    prof = cProfile.Profile()
    if a.mixed:
        eng = load_engine(mdir, a.threads, a.precision, max_num_seqs=32)
        work = make_workload(32, eng.model.args.vocab_size)
        r = run_engine(mdir, work, a.threads, a.precision, engine=eng)
        print(f"{a.model} {a.precision} 32 mixed: {r.tok_s:,.0f} tok/s, {r.extra}")
        prof.enable()
        run_engine(mdir, work, a.threads, a.precision, engine=eng, warmup=False)
        prof.disable()
    else:
        eng = load_engine(mdir, a.threads, a.precision, max_num_seqs=1)
        _batch1(eng, 8)
        print(f"{a.model} {a.precision} batch 1: {max(_batch1(eng, 128) for _ in range(3)):,.0f} tok/s")
        prof.enable()
        _batch1(eng, 64)
        prof.disable()
    pstats.Stats(prof, stream=sys.stdout).sort_stats(a.sort).print_stats(a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
