"""Long-text processing of the four Gutenberg books, written to docs/longtext.md.

    python -m bench.longtext_books [--max-chunks 64] [--model ../shared/models/stories260K/stories260K.bin]

Runs :func:`inferctl.tools.longtext.run_longtext` with the in-process engine backend
(:mod:`bench.longtext_inproc`; the HTTP API has no prompt logprobs yet) on every ``*.txt`` of
``../shared/data/gutenberg`` with the design notes' settings (``chunk_size`` 512, ``overlap``
64, ``max_new_tokens`` 1024, ``repetition_penalty`` 1.2, greedy), three ways:

* **A** — perplexity of every window of every book at the model's context (512).
* **B** — generation at the model's context: capped (prompt = BOS + the window's last 255
  tokens, 256 new tokens).
* **C** — engine with ``max_model_len`` 1536: the full 512-token window as prompt and up to
  1024 new tokens (positions 512..1535 are past stories260K's trained context).
* **D** — perplexity only, 1536-token windows (``max_model_len`` 1536): the position profile
  past the trained context.

B, C and D run ``--max-chunks`` evenly spaced windows per book (all with ``--max-chunks 0``).
Writes the section ``books`` of docs/longtext.md and the per-book CSV/JSON under
``--out`` (default ``out/longtext/``, ignored by git).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.common import GUTENBERG, ROOT, STORIES_BIN, fmt, machine_facts, md_table, section, write_section

DOC = ROOT / "docs" / "longtext.md"
BOOKS = {"pg1342.txt": "Pride and Prejudice", "pg2641.txt": "A Room with a View",
         "pg37106.txt": "Little Women", "pg84.txt": "Frankenstein"}


def run_all(model: str, max_chunks: int | None, out: Path, threads: int, runs: str) -> dict:
    from inferctl.tools.longtext import LongTextConfig, read_book, run_longtext, write_outputs

    from bench.longtext_inproc import EngineBackend

    setups = {"A": (None, LongTextConfig(generate=False, concurrency=32)),
              "B": (None, LongTextConfig(max_chunks=max_chunks, concurrency=32)),
              "C": (1536, LongTextConfig(max_chunks=max_chunks, concurrency=32)),
              "D": (1536, LongTextConfig(chunk_size=1536, max_chunks=max_chunks, generate=False, concurrency=8,
                                         position_bucket=128))}
    results: dict = {}
    for key in runs:
        mml, cfg = setups[key]
        backend = EngineBackend(model, max_model_len=mml, threads=threads)
        for f in sorted(GUTENBERG.glob("*.txt")):
            book = read_book(f)
            t0 = time.monotonic()
            rep = run_longtext(book, backend, cfg)
            write_outputs(rep, out / f"{key}-{f.stem}")
            results[(key, f.name)] = (rep, time.monotonic() - t0)
            print(f"{key} {f.name}: {len(rep.chunks)}/{rep.total_chunks} windows, ppl {fmt(rep.summary()['ppl'], 2)}, "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
    return results


def render(results: dict, runs: str) -> str:
    parts = []
    for key, title in (("A", "A — perplexity of every window of every book (max_model_len 512, window 512, "
                             "overlap 64)"),
                       ("B", "B — generation at the model's context (max_model_len 512): prompt BOS + the window's "
                             "last 255 tokens, 256 new tokens (prompt + output capped at 512)"),
                       ("C", "C — generation with max_model_len 1536: the whole 512-token window as prompt, up to "
                             "1024 new tokens (positions 512-1535 lie past the trained context)"),
                       ("D", "D — perplexity only, 1536-token windows (max_model_len 1536)")):
        if key not in runs:
            continue
        rows = []
        gen = key in ("B", "C")
        for name, label in BOOKS.items():
            if (key, name) not in results:
                continue
            rep, secs = results[(key, name)]
            s = rep.summary()
            rows.append([f"{label} ({name})", f"{rep.book['encoding']}", f"{s['book_tokens']:,}",
                         f"{s['chunks_processed']} / {s['chunks_total']}", fmt(s["ppl"], 1),
                         fmt(s["seq_rep_1"], 3) if gen else "-", fmt(s["seq_rep_4"], 3) if gen else "-",
                         (f"{s['degenerate_outputs']}" if s["degenerate_outputs"] is not None else "-"),
                         fmt(s["gen_ppl_mean"], 2) if gen else "-",
                         f"{s['generated_tokens'] / max(1, s['chunks_processed']):.0f}" if gen else "-",
                         f"{secs:.0f}"])
        parts.append(f"**{title}**\n\n" + md_table(
            ["book", "decoded as", "tokens", "windows run / total", "ppl (book text)", "seq-rep-1", "seq-rep-4",
             "degenerate outputs", "ppl of outputs", "mean new tokens", "seconds"], rows))
        # position profile, all books pooled
        pooled: dict[tuple[int, int], list[float]] = {}
        for name in BOOKS:
            if (key, name) not in results:
                continue
            for b in results[(key, name)][0].positions:
                acc = pooled.setdefault((b.lo, b.hi), [0, 0.0])
                acc[0] += b.tokens
                acc[1] += b.nll_sum
        if pooled and key in ("A", "D"):    # B and C score the same windows as A (a sample of them)
            import math

            prow = [[f"{lo}-{hi - 1}", f"{n:,}", fmt(math.exp(s / n), 1) if n else "-"]
                    for (lo, hi), (n, s) in sorted(pooled.items())]
            parts.append("Perplexity by position in the window (four books pooled):\n\n"
                         + md_table(["positions", "tokens scored", "ppl"], prow))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(STORIES_BIN))
    ap.add_argument("--max-chunks", type=int, default=64, help="windows per book, evenly spaced (0 = all)")
    ap.add_argument("--runs", default="ABCD", help="which setups (A, B, C, D)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "out" / "longtext"))
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    facts = machine_facts()
    results = run_all(a.model, a.max_chunks or None, Path(a.out), a.threads, a.runs)
    body = render(results, a.runs)
    print(body)
    if not a.no_write:
        write_section("books", section("books", "Measured on the four Gutenberg books", body, facts), doc=DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
