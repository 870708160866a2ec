"""Speculative decoding: tokens/s with speculation off vs ngram vs int8_self, batch 1 and 32.

Workloads (greedy, EOS ignored, in-process ``LLMEngine.step`` loop, fresh engine per run):

- ``stories``: stories260K, short story openings (``PROMPTS``), ``--max-tokens`` each;
- ``gutenberg``: a long continuation: each request's prompt is ``--book-tokens`` tokens of a
  Gutenberg book (pg1342, a different passage per request) — prompt lookup shines when the
  output repeats the input;
- ``smollm2``: SmolLM2-135M-Instruct (GGUF, when ``inferctl.engine.gguf`` can load it; skipped
  with a message otherwise), chat-like prompts.

For each workload, batch (1 and 32 requests at once), method and target precision (full, and
int8 with ``--int8-target``), it reports generated tokens/s, the speed-up over speculation off
in the same precision, the acceptance rate (accepted / draft tokens) and whether the greedy
outputs are token-for-token identical to speculation off (they must be; a mismatch is printed
and makes the command exit 1). ``int8_self`` with an int8 target pauses (the draft would be the
target itself): that row measures the pause.

Writes the section ``spec_decode`` of docs/benchmarks.md (``--quick``: tiny settings, no write).
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.common import GUTENBERG, STORIES_BIN, SHARED, fmt, machine_facts, md_table, section, write_section

PROMPTS = ["Once upon a time", "One day, a little girl named Lily", "Tom and his dog went to the park.",
           "The sun was shining and the birds", "There was a big red ball", "Sam wanted to play"]
CHAT = ["What is the capital of France?", "Write a haiku about the sea.", "List three fruits.",
        "Explain what a CPU does in one sentence."]
SMOLLM2 = SHARED / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
METHODS = {"off": None,
           "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4},
           "int8_self": {"method": "int8_self", "num_speculative_tokens": 4}}


def prompts(name: str, bundle, n: int, book_tokens: int) -> list[list[int]]:
    tok = bundle.tokenizer
    if name == "gutenberg":
        text = (GUTENBERG / "pg1342.txt").read_text(encoding="utf-8", errors="replace")
        out = []
        for i in range(n):
            start = 5000 + i * 9 * book_tokens
            out.append(tok.encode(text[start:start + 8 * book_tokens], bos=True)[:book_tokens])
        return out
    base = CHAT if name == "smollm2" else PROMPTS
    return [tok.encode(base[i % len(base)], bos=True) for i in range(n)]


def run(bundle, spec: dict | None, reqs: list[list[int]], max_tokens: int, precision: str, threads: int) -> dict:
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.sampling_params import SamplingParams

    engine = LLMEngine(bundle, EngineConfig(speculative_config=spec, num_threads=threads, max_num_seqs=len(reqs),
                                            max_num_batched_tokens=8192))
    if precision != engine.precision:
        engine.request_precision(precision)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(reqs):
        engine.add_request(f"r{i}", ids, params)
    tokens: dict[str, list[int]] = {}
    steps = 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    wall = time.perf_counter() - t0
    st = engine.stats().get("spec_decode") or {}
    engine.request_precision("full")
    n = sum(len(v) for v in tokens.values())
    return {"tokens": tokens, "tok_s": n / wall, "wall": wall, "steps": steps,
            "acceptance": st.get("acceptance_rate"), "paused": st.get("paused")}


def load(name: str):
    from inferctl.engine.loader import load_model

    if name == "smollm2":
        if not SMOLLM2.exists():
            return None, f"{SMOLLM2} not found"
        try:
            return load_model(str(SMOLLM2)), None
        except Exception as err:   # noqa: BLE001 - the GGUF loader may not have landed yet
            return None, f"the GGUF loader cannot load it yet ({type(err).__name__}: {err})"
    return load_model(str(STORIES_BIN)), None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="stories,gutenberg,smollm2")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--book-tokens", type=int, default=384)
    ap.add_argument("--int8-target", action="store_true", help="also measure with the target in int8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny settings (smoke), do not write the docs")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write docs/benchmarks.md")
    a = ap.parse_args(argv)
    if a.quick:
        a.batches, a.max_tokens, a.book_tokens = "1,4", 12, 64
    facts = machine_facts()
    rows, notes, bad = [], [], 0
    precisions = ("full", "int8") if a.int8_target else ("full",)
    for wl in a.workloads.split(","):
        bundle, why = load("smollm2" if wl == "smollm2" else "stories")
        if bundle is None:
            msg = f"{wl}: skipped: {why}"
            print(msg, file=sys.stderr)
            notes.append(msg)
            continue
        for batch in (int(b) for b in a.batches.split(",")):
            reqs = prompts(wl, bundle, batch, a.book_tokens)
            for prec in precisions:
                base = None
                for name, spec in METHODS.items():
                    r = run(bundle, spec, reqs, a.max_tokens, prec, a.threads)
                    if base is None:
                        base = r
                    same = r["tokens"] == base["tokens"]
                    bad += not same
                    acc = "paused" if r["paused"] else fmt(r["acceptance"], 2) if spec else "-"
                    row = [wl, batch, prec, name, fmt(r["tok_s"]), fmt(r["tok_s"] / base["tok_s"], 2) + "x",
                           acc, r["steps"], "yes" if same else "**NO**"]
                    print(" | ".join(str(c) for c in row), flush=True)
                    rows.append(row)
    header = ["workload", "batch", "target", "speculation", "tok/s", "vs off", "acceptance", "steps",
              "greedy identical"]
    body = (md_table(header, rows) + "\n\n"
            f"{a.max_tokens} tokens per request, k = 4 draft tokens (ngram: prompt_lookup_max 4, min 1), "
            f"{a.threads} torch threads, greedy, EOS ignored; gutenberg prompts are {a.book_tokens} tokens of "
            "pg1342. 'vs off' compares with speculation off in the same target precision; int8_self pauses "
            "while the target is int8 (docs/speculative-decoding.md).\n"
            + "".join(f"\n- {n}" for n in notes))
    if not (a.quick or a.no_write):
        write_section("spec_decode", section("spec_decode", "Speculative decoding (bench.spec_decode)", body, facts))
    else:
        print(body)
    if bad:
        print(f"{bad} run(s) differ from speculation off", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
