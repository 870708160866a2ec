"""One batch-1 decode forward with the fused decode op and with the per-op path, same run (issue 12).

    python -m bench.fused_decode_ab [--models stories260K,synthetic,smollm2] [--precisions full,int8]
                                    [--threads 1,2] [--context 40] [--calls 30] [--rounds 2]

For each model, precision and thread count: prefill ``--context`` tokens, then time
``LlamaModel.forward`` of one decode token ``--calls`` times with engine.fused_decode (one C++ call
for all decoder layers) and with ``fused_decode.layer_weights`` patched to None (the per-op path),
the sides taking turns for ``--rounds`` rounds; best process CPU ms and wall ms per forward of each
side, and the ratio. ``smollm2`` is the GGUF Q4_1 file in ../shared (its best mode: int4).
Prints a Markdown table; writes nothing (numbers go to docs/performance.md by hand, with the load).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

SMOLLM2 = "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


def _model(name: str, precision: str):
    from bench.models import model_dir
    from inferctl.engine.loader import load_model

    if name == "smollm2":
        shared = os.environ.get("INFERCTL_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
        path = os.path.join(shared, SMOLLM2)
    else:
        path = str(model_dir(name))
    model = load_model(path).model
    if precision != "full":
        model.set_precision(precision)
    return model


def measure(name: str, precision: str, threads: int, context: int, calls: int, rounds: int) -> dict[str, float]:
    """Best CPU and wall ms per forward of each side: keys ``{per_op,fused}_{cpu,wall}``."""
    from inferctl.engine import fused_decode
    from inferctl.engine.attention import AttentionMetadata, KVCache

    torch.set_num_threads(threads)
    model = _model(name, precision)
    a = model.args
    bs = 16
    nblocks = (context + bs) // bs + 1
    cache = KVCache.allocate(a.n_layers, nblocks, bs, a.n_kv_heads, a.head_dim, model.dtype, model.device)
    table = list(range(nblocks))
    ids, pos = torch.tensor([5]), torch.tensor([context])
    real = fused_decode.layer_weights
    best: dict[str, float] = {}
    with torch.inference_mode():
        prompt = torch.arange(3, 3 + context) % a.vocab_size
        model(prompt, torch.arange(context), cache, AttentionMetadata.build([(table, 0, context, False)], bs))
        try:
            for _ in range(rounds):
                for side in ("per_op", "fused"):
                    fused_decode.layer_weights = real if side == "fused" else (lambda *x, **k: None)
                    for _ in range(3):
                        model(ids, pos, cache, AttentionMetadata.build([(table, context, 1, False)], bs))
                    c, w = time.process_time(), time.perf_counter()
                    for _ in range(calls):
                        model(ids, pos, cache, AttentionMetadata.build([(table, context, 1, False)], bs))
                    cpu = (time.process_time() - c) / calls * 1e3
                    wall = (time.perf_counter() - w) / calls * 1e3
                    best[side + "_cpu"] = min(best.get(side + "_cpu", cpu), cpu)
                    best[side + "_wall"] = min(best.get(side + "_wall", wall), wall)
        finally:
            fused_decode.layer_weights = real
    return best


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="stories260K,synthetic,smollm2")
    p.add_argument("--precisions", default="full,int8")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--context", type=int, default=40)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| model | precision | threads | per-op CPU ms | fused CPU ms | per-op wall ms | fused wall ms | CPU ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        precs = ["int4"] if name == "smollm2" else args.precisions.split(",")
        for prec in precs:
            for th in (int(t) for t in args.threads.split(",")):
                r = measure(name, prec, th, args.context, args.calls, args.rounds)
                print(f"| {name} | {prec} | {th} | {r['per_op_cpu']:.2f} | {r['fused_cpu']:.2f} | "
                      f"{r['per_op_wall']:.2f} | {r['fused_wall']:.2f} | {r['per_op_cpu'] / r['fused_cpu']:.2f}× |",
                      flush=True)


if __name__ == "__main__":
    main()
