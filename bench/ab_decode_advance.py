"""In-process A/B of the decode step's in-place advance (issue 12, wave 11, engineer K12).

``python -m bench.ab_decode_advance [--model stories260K] [--rounds 30] [--batch 1] [--tokens 64]``

Side A: ``ModelRunner._execute_decode`` as of commit c7247d8 (read with ``git show``, the metadata
rebuilt in place by ``AttentionMetadata.build(..., reuse=)`` and the inputs copied each step); side B:
the current one (the in-place advance, :meth:`ModelRunner._advance`). One engine; the sides alternate
per round (A then B on even rounds, B then A on odd ones), each round ``--batch`` greedy requests of
``--tokens`` tokens. Per side and round: the median and p10 ``time.thread_time`` µs of
``LLMEngine.step`` over the round's decode steps (all steps but each request's prefill). Prints
the paired medians of both and of B − A, and checks the tokens of each pair are identical (exits 1
when not). Needs the git history (the base side) and the model bundle.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types


def _base_execute_decode(commit: str):
    """``_execute_decode`` of ``engine/runner.py`` at ``commit``, with that module's globals."""
    src = subprocess.run(["git", "show", f"{commit}:engine/runner.py"], capture_output=True, text=True,
                         check=True).stdout
    mod = types.ModuleType("inferctl_engine_runner_base")
    sys.modules[mod.__name__] = mod   # the dataclasses look their module up
    exec(compile(src, "runner_base.py", "exec"), mod.__dict__)   # noqa: S102 — our own history
    return mod.ModelRunner._execute_decode


def _round(eng, batch: int, tokens: int) -> tuple[list[float], list[list[int]]]:
    from inferctl.engine.sampling_params import SamplingParams

    rids = []
    for j in range(batch):
        rid = f"r{time.monotonic_ns()}_{j}"
        rids.append(rid)
        eng.add_request(rid, list(range(3 + j, 19 + j)), SamplingParams(max_tokens=tokens, temperature=0.0,
                                                                        ignore_eos=True))
    toks: dict[str, list[int]] = {r: [] for r in rids}
    times = []
    tt = time.thread_time
    first = True
    while eng.has_unfinished_requests():
        t = tt()
        outs = eng.step()
        d = tt() - t
        if not first:
            times.append(d * 1e6)
        first = False
        for o in outs:
            toks[o.request_id].extend(o.new_token_ids)
    return times, [toks[r] for r in rids]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="stories260K")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--base", default="c7247d8", help="The commit of side A's _execute_decode.")
    a = ap.parse_args(argv)

    import torch

    from bench.models import model_dir
    from bench.runners import load_engine

    torch.set_num_threads(a.threads)
    eng = load_engine(model_dir(a.model), a.threads, "full", max_num_seqs=max(1, a.batch))
    runner = eng.runner
    old = types.MethodType(_base_execute_decode(a.base), runner)
    new = runner._execute_decode

    def use(side: str) -> None:
        runner._decode = None
        runner._adv = None
        runner._execute_decode = old if side == "A" else new

    for side in "AB":
        use(side)
        _round(eng, a.batch, 8)
    res: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    same = True
    for r in range(a.rounds):
        got = {}
        for side in ("AB" if r % 2 == 0 else "BA"):
            use(side)
            t, toks = _round(eng, a.batch, a.tokens)
            t.sort()
            res[side].append((t[len(t) // 2], t[len(t) // 10]))
            got[side] = toks
        same &= got["A"] == got["B"]
    med = statistics.median
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"{a.model} batch {a.batch}, {a.tokens} tokens, {a.rounds} rounds, load {' '.join(load)}: "
          f"thread_time µs per decode step")
    for i, name in enumerate(("p50", "p10")):
        va = [x[i] for x in res["A"]]
        vb = [x[i] for x in res["B"]]
        print(f"  {name}: A (base) {med(va):7.1f}  B (advance) {med(vb):7.1f}  "
              f"paired B-A {med([y - x for x, y in zip(va, vb)]):+6.1f}")
    print(f"  tokens identical in every pair: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
