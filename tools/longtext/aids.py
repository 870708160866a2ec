"""Measure the design notes' two long-text aids — ``[SEP]`` every N tokens and mean memory
compression — against the plain procedure, on the first windows of each book, in-process.

``python -m inferctl.tools.longtext.aids --model PATH [--windows 3] [--variants none,sep1024,sep128,mean]``

One model load (:class:`~inferctl.tools.longtext.inproc.InProcessBackend`), then for every book
in ``--books`` (default: the four in ``../shared/data/gutenberg``) and every variant, the first
``--windows`` windows (chunk 512, overlap 64: book tokens ``[0, 511 + (windows − 1) × 447)``)
are scored (teacher-forced perplexity of the book tokens, markers and summary never scored) and
continued by ``--max-new-tokens`` greedy tokens with ``repetition_penalty`` 1.2 (seq-rep-n of
each output). Every variant scores the same book tokens. Results go to ``--out`` (JSON, written
after each book) and a Markdown table on stdout.

Variants: ``none``; ``sepN`` (``--sep-every N``); ``mean`` (``--memory-compression mean``);
``sepN+mean``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from inferctl.tools.longtext.book import read_book
from inferctl.tools.longtext.config import LongTextConfig
from inferctl.tools.longtext.measure import run_longtext

__all__ = ["main", "variant_config"]

_GUTENBERG = Path(__file__).resolve().parents[3] / "shared" / "data" / "gutenberg"


def variant_config(name: str, base: LongTextConfig) -> LongTextConfig:
    """The config of a variant name (``none``, ``sep1024``, ``mean``, ``sep1024+mean``).

    Raises ValueError for an unknown part."""
    from dataclasses import replace

    cfg = replace(base)
    for part in name.split("+"):
        if part == "none":
            continue
        if part == "mean":
            cfg = replace(cfg, memory_compression="mean")
        elif part.startswith("sep") and part[3:].isdigit():
            cfg = replace(cfg, sep_every=int(part[3:]))
        else:
            raise ValueError(f"unknown variant part {part!r} (none, sepN, mean)")
    return cfg


class _Prefix:
    """A backend whose ``tokenize`` returns only the first ``limit`` tokens of the text."""

    def __init__(self, backend: Any, limit: int) -> None:
        self._b, self._limit = backend, limit
        self._ids: dict[str, list[int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._b, name)

    def tokenize(self, text: str) -> list[int]:
        if text not in self._ids:       # the head of the text first (16 characters a token is plenty)
            ids = self._b.tokenize(text[:16 * self._limit])
            self._ids[text] = (ids if len(ids) > self._limit else self._b.tokenize(text))[:self._limit]
        return self._ids[text]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inferctl.tools.longtext.aids", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--books", nargs="*", default=None)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--overlap", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--variants", default="none,sep1024,sep128,mean")
    ap.add_argument("--pack", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="out/longtext/aids.json")
    a = ap.parse_args(argv)
    from inferctl.tools.longtext.inproc import InProcessBackend

    t0 = time.monotonic()
    backend = InProcessBackend(a.model, max_model_len=a.max_model_len, pack=a.pack, threads=a.threads)
    load_s = time.monotonic() - t0
    base = LongTextConfig(chunk_size=a.chunk_size, overlap=a.overlap, max_new_tokens=a.max_new_tokens,
                          concurrency=max(a.pack, a.windows))
    variants = a.variants.split(",")
    books = [Path(b) for b in a.books] if a.books else sorted(_GUTENBERG.glob("*.txt"))
    nbos = 1 if backend.bos_id is not None else 0
    limit = a.chunk_size - nbos + (a.windows - 1) * (a.chunk_size - nbos - a.overlap)
    results: dict[str, Any] = {"model": a.model, "backend": backend.name, "load_seconds": load_s,
                               "windows": a.windows, "book_tokens": limit, "config": vars(a), "books": {}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for bp in books:
        book = read_book(bp)
        per: dict[str, Any] = {}
        head = _Prefix(backend, limit)
        for v in variants:
            t = time.monotonic()
            rep = run_longtext(book, head, variant_config(v, base))
            s = rep.summary()
            per[v] = {"ppl": s["ppl"], "seq_rep_1": s["seq_rep_1"], "seq_rep_4": s["seq_rep_4"],
                      "gen_tokens": s["generated_tokens"], "scored_tokens": s["scored_tokens"],
                      "windows": len(rep.chunks), "seconds": time.monotonic() - t, "notes": rep.notes,
                      "per_window_ppl": [c.ppl_new for c in rep.chunks],
                      "sample": rep.chunks[-1].gen_text if rep.chunks else ""}
            print(f"{bp.name} {v}: ppl {s['ppl']:.3f} rep1 {s['seq_rep_1']:.3f} rep4 {s['seq_rep_4']:.3f} "
                  f"({per[v]['seconds']:.0f} s)", flush=True)
        results["books"][bp.name] = per
        out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(markdown(results))
    return 0


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table (book × variant: perplexity, seq-rep-1, seq-rep-4)."""
    lines = ["| book | variant | ppl (book tokens) | Δ ppl vs none | seq-rep-1 | seq-rep-4 | tokens generated |",
             "|---|---|---|---|---|---|---|"]
    for name, per in results["books"].items():
        ref = per.get("none", {}).get("ppl")
        for v, r in per.items():
            d = "" if ref is None or r["ppl"] is None or v == "none" else f"{100 * (r['ppl'] / ref - 1):+.2f} %"
            lines.append(f"| {name} | {v} | {_f(r['ppl'], 3)} | {d} | {_f(r['seq_rep_1'])} | {_f(r['seq_rep_4'])} "
                         f"| {r['gen_tokens']} |")
    return "\n".join(lines)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


if __name__ == "__main__":
    raise SystemExit(main())
