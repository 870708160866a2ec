"""Measure a book: score every window (perplexity by position), generate from each, and measure
the outputs' repetition (:func:`run_longtext` over a :class:`LongTextBackend`)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol

from inferctl.contract.quality import perplexity_value, seq_rep_n
from inferctl.tools.longtext.book import Book
from inferctl.tools.longtext.chunking import ChunkPlan, plan_chunks
from inferctl.tools.longtext.config import SEQ_REP_NS, LongTextConfig, LongTextError
from inferctl.tools.longtext.markers import insert_separators, insert_summary, plan_prompt


@dataclass
class Generation:
    """One generated continuation: the tokens (ids, or token strings where the backend only
    gives strings — used as n-gram symbols), their logprobs (None = not given), the text and
    the finish reason."""

    tokens: list[Any]
    logprobs: list[float | None]
    text: str
    finish_reason: str | None


class LongTextBackend(Protocol):
    """What :func:`run_longtext` needs from an engine."""

    name: str
    max_model_len: int
    max_window: int          # longest window :meth:`score` accepts
    bos_id: int | None

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` without BOS."""

    def score(self, windows: list[list[int]]) -> list[list[float | None] | None]:
        """Per window, ``logprob(window[i] | window[:i])`` for every i (entry 0 None); a
        window's entry is None when the backend cannot score prompts."""

    def generate(self, prompts: list[list[int]], max_tokens: list[int],
                 config: LongTextConfig) -> list[Generation]:
        """One continuation per prompt."""


@dataclass
class ChunkResult:
    """One window's numbers (None = no data)."""

    chunk: int
    start: int
    end: int
    window_tokens: int
    new_tokens: int
    nll_new: float | None            # sum of -logprob over the new tokens
    ppl_new: float | None
    ppl_window: float | None         # over every scored token of the window
    prompt_tokens: int
    gen_tokens: int
    finish_reason: str | None
    seq_rep: dict[str, float | None]
    gen_ppl: float | None
    gen_text: str = ""


@dataclass
class PositionBucket:
    """Positions ``[lo, hi)`` of the window: scored tokens and their perplexity."""

    lo: int
    hi: int
    tokens: int
    nll_sum: float

    @property
    def ppl(self) -> float | None:
        return math.exp(self.nll_sum / self.tokens) if self.tokens else None


@dataclass
class LongTextReport:
    """Everything a run measured (JSON-ready via :meth:`to_dict`)."""

    book: dict[str, Any]
    engine: dict[str, Any]
    config: dict[str, Any]
    total_tokens: int
    total_chunks: int
    chunks: list[ChunkResult]
    positions: list[PositionBucket]
    seconds: float
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Book perplexity over the new tokens of the processed windows, mean seq-rep-n of the
        outputs, and how many outputs were degenerate (seq-rep-4 >= 0.5)."""
        scored = [c for c in self.chunks if c.nll_new is not None and c.new_tokens > 0]
        n = sum(c.new_tokens for c in scored)
        out: dict[str, Any] = {
            "chunks_processed": len(self.chunks), "chunks_total": self.total_chunks,
            "book_tokens": self.total_tokens, "scored_tokens": n,
            "ppl": math.exp(sum(c.nll_new for c in scored) / n) if n else None,
            "generated_tokens": sum(c.gen_tokens for c in self.chunks),
        }
        for k in SEQ_REP_NS:
            vals = [c.seq_rep.get(str(k)) for c in self.chunks]
            vals = [v for v in vals if v is not None]
            out[f"seq_rep_{k}"] = sum(vals) / len(vals) if vals else None
        reps = [c.seq_rep.get("4") for c in self.chunks if c.seq_rep.get("4") is not None]
        out["degenerate_outputs"] = sum(1 for v in reps if v >= 0.5) if reps else None
        gp = [c.gen_ppl for c in self.chunks if c.gen_ppl is not None]
        out["gen_ppl_mean"] = sum(gp) / len(gp) if gp else None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"book": self.book, "engine": self.engine, "config": self.config,
                "summary": self.summary(),
                "positions": [{"lo": b.lo, "hi": b.hi, "tokens": b.tokens, "ppl": b.ppl} for b in self.positions],
                "chunks": [asdict(c) for c in self.chunks], "seconds": self.seconds, "notes": self.notes}


def _window_scores(lps: list[float | None] | None, plan: ChunkPlan) -> tuple[float | None, float | None, float | None]:
    """(nll over new tokens, ppl over new tokens, ppl over the whole window)."""
    if lps is None:
        return None, None, None
    new = [lps[i] for i in range(plan.first_new, len(plan.window))]
    allv = [lps[i] for i in range(1, len(plan.window))]
    if any(v is None or not math.isfinite(v) for v in allv):
        return None, None, None
    nll = -math.fsum(new)
    return nll, (math.exp(nll / len(new)) if new else None), perplexity_value(allv)


def _prompt_is_window(p: ChunkPlan) -> bool:
    """The generation prompt is the whole scored input, summary included (one prefill serves both)."""
    pe, we = p.prompt_embeds or {}, p.embeds or {}
    return p.prompt == p.model_input and pe.keys() == we.keys() and all(pe[k] is we[k] for k in pe)


def _augment(plans: list[ChunkPlan], ids: list[int], backend: LongTextBackend, config: LongTextConfig,
             notes: list[str], info: dict[str, Any]) -> None:
    """Apply ``--sep-every`` and ``--memory-compression mean`` to the planned windows (:mod:`.markers`).

    Raises:
        LongTextError: a window with its markers longer than the backend can score (field
            ``sep_every``), or mean compression on a backend without embedding input (field
            ``memory_compression``).
    """
    if config.sep_every is None and config.memory_compression == "none":
        return
    nbos = 1 if backend.bos_id is not None else 0
    if config.sep_every is not None:
        sep = list(backend.tokenize(config.sep_text))
        if not sep:
            raise LongTextError("sep_text", f"{config.sep_text!r} encodes to no tokens")
        info["sep_ids"] = sep
        for p in plans:
            insert_separators(p, sep, config.sep_every, nbos)
        n = sum(len(p.model_input) - len(p.window) for p in plans) // len(sep)
        longest = max(len(p.model_input) for p in plans)
        notes.append(f"{config.sep_text!r} (token ids {sep}) inserted before every book token at a multiple of "
                     f"{config.sep_every}: {n} markers in {len(plans)} windows")
        if longest > backend.max_window:
            raise LongTextError("sep_every", f"a window with its markers is {longest} tokens > {backend.max_window}, "
                                             "the longest the engine can score; lower --chunk-size")
    if config.memory_compression == "mean":
        mean = getattr(backend, "mean_embedding", None)
        if mean is None:
            raise LongTextError("memory_compression", f"{backend.name} cannot take an embedding as input; "
                                                      "mean compression runs in-process (--model, not --url)")
        for p in plans:
            if p.start > 0:
                insert_summary(p, mean(ids[:p.start]), nbos)
        if max(len(p.model_input) for p in plans) > backend.max_window:
            raise LongTextError("chunk_size", "a window with its summary position is longer than the engine can "
                                              "score; lower --chunk-size by one")
        notes.append(f"mean compression: {sum(1 for p in plans if p.embeds)} of {len(plans)} windows carry the mean "
                     "input embedding of the book before them at position 1")
    for p in plans:
        plan_prompt(p, backend.bos_id, config.max_new_tokens, backend.max_model_len)


def run_longtext(book: Book, backend: LongTextBackend, config: LongTextConfig,
                 progress: Callable[[str, int, int], None] | None = None) -> LongTextReport:
    """Tokenize, plan, score and generate; return the report.

    ``progress(stage, done, total)`` is called as windows complete (stages ``score`` and
    ``generate``). Raises :class:`LongTextError` for a plan the backend cannot run.
    """
    t0 = time.monotonic()
    ids = backend.tokenize(book.text)
    plans, total = plan_chunks(ids, config, backend.bos_id, backend.max_model_len, backend.max_window)
    notes: list[str] = []
    engine_info: dict[str, Any] = {}
    _augment(plans, ids, backend, config, notes, engine_info)
    scores: list[list[float | None] | None] = []
    batch = max(1, config.concurrency)
    gens: list[Generation | None] = [None] * len(plans)
    if config.generate and hasattr(backend, "score_and_generate") and all(_prompt_is_window(p) for p in plans):
        for i in range(0, len(plans), batch):     # one prefill per window (in-process backend)
            part = plans[i:i + batch]
            kw = {"embeds": [p.embeds for p in part]} if any(p.embeds for p in part) else {}
            raw, gens[i:i + len(part)] = backend.score_and_generate([p.model_input for p in part],
                                                                    [p.max_tokens for p in part], config, **kw)
            scores += [r if p.book_index is None else [r[j] for j in p.book_index] for p, r in zip(part, raw)]
            if progress:
                progress("score+generate", len(scores), len(plans))
    for i in range(len(scores), len(plans), batch):
        part = plans[i:i + batch]
        kw = {"embeds": [p.embeds for p in part]} if any(p.embeds for p in part) else {}
        raw = backend.score([p.model_input for p in part], **kw)
        scores += [r if r is None or p.book_index is None else [r[j] for j in p.book_index]
                   for p, r in zip(part, raw)]
        if progress:
            progress("score", len(scores), len(plans))
    if all(s is None for s in scores):
        notes.append(f"{backend.name} returns no prompt logprobs: perplexity is no data")
    if config.generate and any(g is None for g in gens):
        done = 0
        for i in range(0, len(plans), batch):
            part = plans[i:i + batch]
            kw = {"embeds": [p.prompt_embeds for p in part]} if any(p.prompt_embeds for p in part) else {}
            gens[i:i + len(part)] = backend.generate([p.prompt for p in part], [p.max_tokens for p in part], config,
                                                     **kw)
            done += len(part)
            if progress:
                progress("generate", done, len(plans))
        capped = [p for p in plans if p.max_tokens < config.max_new_tokens or len(p.prompt) < len(p.model_input)]
        if capped:
            notes.append(f"{len(capped)} of {len(plans)} generations capped to prompt + max_tokens <= "
                         f"max_model_len {backend.max_model_len} (prompt {capped[0].prompt.__len__()} + "
                         f"{capped[0].max_tokens} new tokens)")
    width = config.position_bucket
    nb = -(-max(len(p.window) for p in plans) // width)
    buckets = [PositionBucket(b * width, (b + 1) * width, 0, 0.0) for b in range(nb)]
    results = []
    for plan, lps, gen in zip(plans, scores, gens):
        nll, ppl_new, ppl_win = _window_scores(lps, plan)
        if ppl_win is not None:
            for pos in range(1, len(plan.window)):
                b = buckets[pos // width]
                b.tokens += 1
                b.nll_sum -= lps[pos]
        reps = {str(k): (seq_rep_n(gen.tokens, k) if gen else None) for k in SEQ_REP_NS}
        results.append(ChunkResult(
            chunk=plan.index, start=plan.start, end=plan.end, window_tokens=len(plan.window),
            new_tokens=len(plan.window) - plan.first_new, nll_new=nll, ppl_new=ppl_new,
            ppl_window=ppl_win, prompt_tokens=len(plan.prompt) if gen else 0,
            gen_tokens=len(gen.tokens) if gen else 0, finish_reason=gen.finish_reason if gen else None,
            seq_rep=reps, gen_ppl=perplexity_value(gen.logprobs) if gen and gen.logprobs else None,
            gen_text=gen.text if gen else ""))
    return LongTextReport(
        book={"path": book.path, "encoding": book.encoding, "gutenberg": book.gutenberg,
              "chars": len(book.text), "raw_bytes": book.raw_bytes},
        engine={"backend": backend.name, "max_model_len": backend.max_model_len, "bos_id": backend.bos_id,
                **engine_info},
        config=asdict(config), total_tokens=len(ids), total_chunks=total, chunks=results,
        positions=buckets, seconds=time.monotonic() - t0, notes=notes)

