"""Prefix caching: TTFT of chat requests that share a long system prompt, caching on vs off.

Workload: ``--n`` (32) requests, each ``system prompt + its own user turn``: the system prompt is
``--system-tokens`` tokens of a Gutenberg book (pg1342, from character 5000, tokenized by the
model's tokenizer with BOS), the user turn ``--user-tokens`` tokens from a later part of the book
(a different passage per request), ``--max-tokens`` generated tokens each (greedy, EOS ignored).
Arrivals: every ``--gap-ms`` milliseconds (0 = all at once). The engine runs in-process
(``LLMEngine.step`` in a loop, one torch thread by default), once with prefix caching and once
without, on fresh engines with the same settings. TTFT is the engine's own (arrival to first
token, ``Sequence.first_token_time - arrival_time``). Outputs are checked identical.

Writes the section ``prefix_cache`` of docs/benchmarks.md (``--quick``: no write).
"""

from __future__ import annotations

import argparse
import time

from bench.common import GUTENBERG, fmt, machine_facts, md_table, percentile, section, write_section
from bench.models import model_dir


def workload(tokenizer, n: int, system_tokens: int, user_tokens: int) -> tuple[list[int], list[list[int]]]:
    """``(system prompt ids, [user turn ids] * n)`` from pg1342 (see the module doc)."""
    text = (GUTENBERG / "pg1342.txt").read_text(encoding="utf-8", errors="replace")
    ids = tokenizer.encode(text[5000:5000 + 40 * system_tokens], bos=True)[:system_tokens]
    if len(ids) < system_tokens:
        raise ValueError(f"the book passage gave only {len(ids)} tokens, {system_tokens} asked")
    users = []
    for i in range(n):
        start = 200_000 + i * 8 * user_tokens
        users.append(tokenizer.encode(text[start:start + 10 * user_tokens], bos=False)[:user_tokens])
    return ids, users


def run(bundle, caching: bool, system: list[int], users: list[list[int]], max_tokens: int, gap: float,
        budget: int, threads: int) -> dict:
    """One pass over the workload; returns TTFTs (s), wall time, tokens and cache counters."""
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.sampling_params import SamplingParams

    engine = LLMEngine(bundle, EngineConfig(enable_prefix_caching=caching, max_num_batched_tokens=budget,
                                            num_threads=threads, max_num_seqs=len(users)))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    seqs, outs = {}, {}
    t0 = time.monotonic()
    pending = list(enumerate(users))
    while pending or engine.has_unfinished_requests():
        now = time.monotonic()
        while pending and now - t0 >= pending[0][0] * gap:
            i, user = pending.pop(0)
            rid = f"r{i}"
            engine.add_request(rid, system + user, params)
            seqs[rid] = engine._seqs[rid]
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0][0] * gap - (time.monotonic() - t0)))
            continue
        for out in engine.step():
            outs.setdefault(out.request_id, []).extend(out.new_token_ids)
    wall = time.monotonic() - t0
    reg = engine.registry
    return {"ttft": [s.first_token_time - s.arrival_time for s in seqs.values()], "wall": wall, "outs": outs,
            "queries": reg.get_sample_value("inferctl_engine_prefix_cache_queries_total") or 0.0,
            "hits": reg.get_sample_value("inferctl_engine_prefix_cache_hits_total") or 0.0,
            "prompt_tokens": sum(len(system) + len(u) for u in users)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="stories260K", help="stories260K | synthetic | synthetic-tiny")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--system-tokens", type=int, default=384)
    ap.add_argument("--user-tokens", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--gap-ms", type=float, default=0.0)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="best (lowest mean TTFT) of N passes per setting")
    ap.add_argument("--quick", action="store_true", help="smoke test: no doc write")
    a = ap.parse_args(argv)
    from inferctl.engine.loader import load_model

    facts = machine_facts()
    bundle = load_model(str(model_dir(a.model)))
    system, users = workload(bundle.tokenizer, a.n, a.system_tokens, a.user_tokens)
    results = {}
    for caching in (False, True):
        passes = [run(bundle, caching, system, users, a.max_tokens, a.gap_ms / 1000, a.max_num_batched_tokens,
                      a.threads) for _ in range(a.repeats)]
        results[caching] = min(passes, key=lambda r: sum(r["ttft"]) / len(r["ttft"]))
    same = results[True]["outs"] == results[False]["outs"]
    rows = []
    for caching in (False, True):
        r = results[caching]
        t = r["ttft"]
        rows.append(["on" if caching else "off", fmt(1000 * sum(t) / len(t)), fmt(1000 * percentile(t, 50)),
                     fmt(1000 * percentile(t, 90)), fmt(1000 * max(t)), fmt(r["wall"], 2),
                     fmt(100 * r["hits"] / r["queries"], 1) if r["queries"] else "-"])
    off, on = (sum(results[c]["ttft"]) / a.n for c in (False, True))
    body = (f"Model {a.model}; {a.n} requests = a shared {len(system)}-token system prompt + a {a.user_tokens}-token "
            f"user turn each, {a.max_tokens} tokens out, greedy; arrivals every {a.gap_ms:g} ms; "
            f"max_num_batched_tokens {a.max_num_batched_tokens}; best of {a.repeats} passes.\n\n"
            + md_table(["prefix caching", "mean TTFT ms", "p50 ms", "p90 ms", "max ms", "wall s",
                        "hit ratio %"], rows)
            + f"\n\nMean TTFT {fmt(off / on, 2)}× lower with caching; outputs "
            f"{'identical' if same else 'DIFFERENT'} with and without.")
    print(body)
    if not a.quick:
        write_section("prefix_cache", section("prefix_cache", "Prefix caching: shared system prompt TTFT", body,
                                              facts))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
