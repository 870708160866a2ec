"""Where an engine step's time goes: a cProfile of batch-1 decode or of the 32-mixed workload (issue 12).

    python -m bench.profile_step [--model stories260K] [--precision full] [--threads 2]
                                 [--mixed | --parts [--requests 10]] [--sort tottime] [--top 18]

* default: one request (16 prompt tokens, greedy, EOS ignored) on an engine of ``max_num_seqs=1``;
  prints the best-of-3 decode rate over 128 tokens (wall time, first step excluded), then the
  profile of a 64-token run;
* ``--mixed``: ``bench.common.make_workload(32, vocab)`` (the peer benchmark's 32 mixed requests)
  on an engine of ``max_num_seqs=32``: prints tok/s, steps and mean batch of a warm run, then the
  profile of a second run.

* ``--parts``: batch 1 without cProfile: the median and p10 wall µs of each part of a step
  (``LLMEngine.step`` down to the fused op's call, the sampler, the commit and the stats record)
  over ``--requests`` requests of 64 tokens, each part timed by a ``perf_counter_ns`` wrapper
  (~0.3 µs each; the parts nest, so they do not add up). Where a ~0.3 ms stories260K step goes
  (issue 12, wave 8).

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


#: (module, class or None, attribute) of each timed part in ``--parts``, in step order
PARTS = (("engine", "LLMEngine", "step"), ("scheduler", "Scheduler", "schedule"), ("runner", "ModelRunner", "execute"),
         ("attention", "AttentionMetadata", "build"), ("runner", "ModelRunner", "_inputs"),
         ("model", "LlamaModel", "forward"), ("model", "LlamaModel", "rope_at"), ("model", "LlamaModel", "embed"),
         ("fused_decode", None, "layer_weights"), ("fused_decode", None, "decode_layers"),
         ("sampler", "Sampler", "__call__"), ("runner", None, "greedy_sample"),
         ("engine", "LLMEngine", "_commit_samples"), ("engine", "LLMEngine", "_record"))


def parts(eng, requests: int) -> list[tuple[str, int, float, float]]:
    """``(part, calls, median µs, p10 µs)`` of each :data:`PARTS` entry over ``requests`` batch-1
    requests of 64 greedy tokens on ``eng`` (the wrappers are removed afterwards)."""
    import importlib

    times: dict[str, list[int]] = {}
    undo = []
    pc = time.perf_counter_ns
    for mod, cls, name in PARTS:
        m = importlib.import_module(f"inferctl.engine.{mod}")
        owner = getattr(m, cls) if cls else m
        raw = owner.__dict__[name] if cls else getattr(m, name)
        label = f"{cls or mod}.{name}"
        acc = times.setdefault(label, [])
        if isinstance(raw, classmethod):
            fn = raw.__func__

            def timed(c, *a, _fn=fn, _acc=acc, **k):
                t = pc()
                r = _fn(c, *a, **k)
                _acc.append(pc() - t)
                return r
            setattr(owner, name, classmethod(timed))
        else:
            def timed(*a, _fn=raw, _acc=acc, **k):
                t = pc()
                r = _fn(*a, **k)
                _acc.append(pc() - t)
                return r
            setattr(owner, name, timed)
        undo.append((owner, name, raw))
    try:
        for _ in range(requests):
            _batch1(eng, 64)
    finally:
        for owner, name, raw in reversed(undo):
            setattr(owner, name, raw)
    out = []
    for label, v in times.items():
        if v:
            v.sort()
            out.append((label, len(v), v[len(v) // 2] / 1e3, v[len(v) // 10] / 1e3))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_step", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="stories260K", help="A bench.models name (stories260K, synthetic, …).")
    ap.add_argument("--precision", default="full", help="full | int8 | int4 (as the engine's --precision).")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mixed", action="store_true", help="Profile the 32 mixed requests instead of batch 1.")
    ap.add_argument("--sort", default="tottime", help="pstats sort key (tottime, cumulative, …).")
    ap.add_argument("--top", type=int, default=18, help="Rows of the profile to print.")
    ap.add_argument("--parts", action="store_true", help="Batch 1: median µs of each part of a step, no cProfile.")
    ap.add_argument("--requests", type=int, default=10, help="--parts: requests of 64 tokens timed.")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.top < 1 or a.requests < 1:
        ap.error("--threads, --top and --requests must be >= 1")

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
    elif a.parts:
        eng = load_engine(mdir, a.threads, a.precision, max_num_seqs=1)
        _batch1(eng, 8)
        print(f"{a.model} {a.precision} batch 1, {a.threads} threads: wall µs per call ({a.requests} requests)")
        for label, n, med, p10 in parts(eng, a.requests):
            print(f"{label:34s} {n:6d} calls  median {med:8.1f}  p10 {p10:8.1f}")
        return 0
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
