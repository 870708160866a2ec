"""What an int8 KV cache frees, next to what int8 weights free, at one memory budget.

For each model (stories260K and the 99.5 MB synthetic Llama of :mod:`bench.models`) the engine is
built in-process at ``--budget`` bytes twice, with ``kv_cache_dtype`` auto (the model dtype,
float32 on CPU) and int8 (int8 K/V + one float32 scale per token and head), and the int8 weight
switch is applied to the first. Reported from the engines' own accounting (``/stats``): KV bytes
per block and token, the pool's blocks and bytes at the budget, the weights in full and int8,
and the bytes a live KV switch would free (the pool at the same block count in int8).

Writes the section ``kv_int8`` of docs/benchmarks.md (``--quick``: no write).
"""

from __future__ import annotations

import argparse

from bench.common import fmt, machine_facts, md_table, section, write_section
from bench.models import model_dir


def measure(name: str, budget: int) -> dict:
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.loader import load_model

    bundle = load_model(str(model_dir(name)))
    out = {"model": name}
    for kv in ("auto", "int8"):
        engine = LLMEngine(bundle, EngineConfig(memory_budget_bytes=budget, kv_cache_dtype=kv, num_threads=1))
        doc = engine.stats()
        out[kv] = {"blocks": engine.num_kv_blocks, "per_block": engine.kv_bytes_per_block,
                   "pool": doc["memory"]["kv_pool_bytes"], "block_size": doc["kv_cache"]["block_size"]}
        if kv == "auto":
            full_w = doc["memory"]["weights_bytes"]
            engine.request_precision("int8")
            out["weights_full"], out["weights_int8"] = full_w, engine.stats()["memory"]["weights_bytes"]
            engine.request_precision("full")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="stories260K,synthetic")
    ap.add_argument("--budget", default="1GiB")
    ap.add_argument("--quick", action="store_true", help="no doc write")
    a = ap.parse_args(argv)
    from inferctl.contract.units import parse_size

    budget = parse_size(a.budget, "--budget", min_bytes=1)
    facts = machine_facts()
    rows = []
    for name in a.models.split(","):
        r = measure(name, budget)
        full, i8 = r["auto"], r["int8"]
        bs = full["block_size"]
        freed_kv = full["pool"] - full["blocks"] * i8["per_block"]
        freed_w = r["weights_full"] - r["weights_int8"]
        rows.append([name, f"{full['per_block'] / bs:,.0f} / {i8['per_block'] / bs:,.0f}",
                     f"{full['blocks']:,} / {i8['blocks']:,}",
                     f"{full['pool'] / 2**20:,.1f} / {i8['pool'] / 2**20:,.1f}",
                     fmt(freed_kv / 2**20), fmt(freed_w / 2**20), fmt(full['per_block'] / i8['per_block'], 2)])
    body = (f"Budget {a.budget}; block size 16 tokens; float32 model and KV (CPU).\n\n"
            + md_table(["model", "KV bytes/token full / int8", "KV blocks at the budget full / int8",
                        "KV pool MiB full / int8", "MiB a live KV switch frees (same blocks)",
                        "MiB the int8 weight switch frees", "KV ratio"], rows))
    print(body)
    if not a.quick:
        write_section("kv_int8", section("kv_int8", "int8 KV cache vs int8 weights: memory freed", body, facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
