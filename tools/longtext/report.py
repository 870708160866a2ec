"""Long-text output: the per-chunk CSV, the JSON report and the rich tables."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from inferctl.tools.longtext.config import SEQ_REP_NS
from inferctl.tools.longtext.measure import LongTextReport


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


CSV_COLUMNS = ("chunk", "start", "end", "window_tokens", "new_tokens", "ppl_new", "ppl_window",
               "prompt_tokens", "gen_tokens", "finish_reason", "seq_rep_1", "seq_rep_2", "seq_rep_3",
               "seq_rep_4", "gen_ppl")


def chunks_csv(report: LongTextReport) -> str:
    """The per-chunk table as CSV (empty cell = no data)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for c in report.chunks:
        w.writerow([c.chunk, c.start, c.end, c.window_tokens, c.new_tokens,
                    "" if c.ppl_new is None else f"{c.ppl_new:.4f}",
                    "" if c.ppl_window is None else f"{c.ppl_window:.4f}",
                    c.prompt_tokens, c.gen_tokens, c.finish_reason or "",
                    *("" if c.seq_rep.get(str(k)) is None else f"{c.seq_rep[str(k)]:.4f}" for k in SEQ_REP_NS),
                    "" if c.gen_ppl is None else f"{c.gen_ppl:.4f}"])
    return buf.getvalue()


def render_tables(report: LongTextReport) -> list[Any]:
    """rich Tables: per chunk, by position, summary."""
    from rich.table import Table

    t = Table(title=f"{Path(report.book['path']).name}: per chunk "
                    f"({len(report.chunks)} of {report.total_chunks} windows)")
    for col in ("chunk", "tokens", "new", "ppl(new)", "prompt", "gen", "finish", "rep-1", "rep-2",
                "rep-4", "gen ppl"):
        t.add_column(col, justify="right")
    for c in report.chunks:
        t.add_row(str(c.chunk), f"{c.start}-{c.end}", str(c.new_tokens), _fmt(c.ppl_new),
                  str(c.prompt_tokens), str(c.gen_tokens), c.finish_reason or "-",
                  _fmt(c.seq_rep.get("1")), _fmt(c.seq_rep.get("2")), _fmt(c.seq_rep.get("4")),
                  _fmt(c.gen_ppl))
    p = Table(title="perplexity by position in the window")
    for col in ("positions", "tokens", "ppl"):
        p.add_column(col, justify="right")
    for b in report.positions:
        p.add_row(f"{b.lo}-{b.hi - 1}", str(b.tokens), _fmt(b.ppl))
    s = Table(title=f"summary: {Path(report.book['path']).name}, {report.engine.get('backend', '?')}")
    s.add_column("measure")
    s.add_column("value", justify="right")
    for k, v in report.summary().items():
        s.add_row(SUMMARY_LABELS.get(k, k), "no data" if v is None else _fmt(v, 4) if isinstance(v, float) else str(v))
    sample = next((c for c in report.chunks if c.gen_text.strip()), None)
    if sample is not None:
        s.add_row(f"sample output (chunk {sample.chunk}, {sample.gen_tokens} tokens)", _sample(sample.gen_text))
    return [t, p, s]


#: The summary's keys (:meth:`LongTextReport.summary`, the JSON's) as a person reads them
SUMMARY_LABELS = {
    "chunks_processed": "windows processed", "chunks_total": "windows in the book",
    "book_tokens": "book tokens", "scored_tokens": "tokens scored (new in their window)",
    "ppl": "book perplexity (teacher-forced)", "generated_tokens": "tokens generated",
    **{f"seq_rep_{k}": f"repetition seq-rep-{k} (share of repeated {k}-grams, mean)" for k in SEQ_REP_NS},
    "degenerate_outputs": "degenerate outputs (seq-rep-4 >= 0.5)",
    "gen_ppl_mean": "perplexity of the outputs (mean)",
}

#: Characters of generated text shown in the summary
SAMPLE_CHARS = 160


def _sample(text: str) -> str:
    """One line of generated text, at most :data:`SAMPLE_CHARS` characters (``…`` when cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= SAMPLE_CHARS else flat[:SAMPLE_CHARS - 1] + "…"


def write_outputs(report: LongTextReport, prefix: str | Path) -> tuple[Path, Path]:
    """Write ``<prefix>.csv`` (per chunk) and ``<prefix>.json`` (everything)."""
    base = Path(prefix)
    base.parent.mkdir(parents=True, exist_ok=True)
    csv_path = base.with_name(base.name + ".csv")
    json_path = base.with_name(base.name + ".json")
    csv_path.write_text(chunks_csv(report), encoding="utf-8")
    json_path.write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False), encoding="utf-8")
    return csv_path, json_path

