"""Long-text processing: feed a book longer than the model's context, in overlapping chunks.

The product's original design notes test long texts on Project Gutenberg books with
``max_new_tokens`` 1024, ``chunk_size`` 512, ``overlap`` 64 and ``repetition_penalty`` 1.2, and
warn that attention flattens with distance, so quality is measured *by position*. This module
is the procedure (``docs/longtext.md``) and ``inferctl longtext BOOK.txt``:

1. **Read the book** (:func:`read_book`): decode (``auto``: UTF-8, else Windows-1252 — the
   Gutenberg copies in ``../shared/data/gutenberg`` are Windows-1252 with CRLF), normalise
   line ends, keep the text between the ``*** START OF`` and ``*** END OF`` lines when
   present. A file that does not decode raises :class:`LongTextError` naming the byte offset
   and the ``--encoding`` option.
2. **Tokenize once** (no BOS) and **cut into windows** (:func:`plan_chunks`): each window is
   ``chunk_size`` tokens *including* the BOS token the backend prepends; consecutive windows
   share ``overlap`` book tokens. This is the sliding-window evaluation of Hugging Face's
   "Perplexity of fixed-length models" guide (stride = window − overlap).
3. **Perplexity by position** (teacher forcing): the log-likelihood of every token of the
   window given the tokens before it in that window. Each token's *position* is its index in
   the window (BOS = 0). The book's perplexity counts every book token once: the first window
   scores all its tokens, later ones only those after the overlap ("new" tokens). The
   position profile (:class:`PositionBucket`) uses every scored token of every window, so the
   first positions are covered by every chunk, not only the first one.
4. **Generation**: from each window, ``max_new_tokens`` with ``repetition_penalty``, capped so
   that prompt + generation <= ``max_model_len``: when the window leaves less than half the
   context, the prompt keeps BOS + the window's last tokens and
   ``min(max_new_tokens, max_model_len // 2)`` tokens are generated (:func:`plan_generation`).
   The outputs' repetition is seq-rep-n (Welleck et al. 2019, arXiv:1908.04319, section 5:
   ``1 - |unique n-grams| / |n-grams|``) and their perplexity is ``exp(-mean logprob)`` of the
   generated tokens.

Backends (:class:`LongTextBackend`): :class:`HttpBackend` talks to an engine over HTTP
(``/tokenize`` and ``prompt_logprobs`` as in vLLM's OpenAI server, ``/v1/completions`` for
generation); an in-process backend over the bundled engine lives in ``bench/`` (the
controller never imports the engine). A backend that cannot score prompts gives perplexity
"no data" (``None``), never 0.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

#: The design notes' long-text settings.
DEFAULT_CHUNK_SIZE = 512
DEFAULT_OVERLAP = 64
DEFAULT_MAX_NEW_TOKENS = 1024
DEFAULT_REPETITION_PENALTY = 1.2
DEFAULT_POSITION_BUCKET = 64
SEQ_REP_NS = (1, 2, 3, 4)

_START = re.compile(r"^[ \t]*\*\*\*[ \t]*START OF (?:THE |THIS )?PROJECT GUTENBERG EBOOK.*$",
                    re.IGNORECASE | re.MULTILINE)
_END = re.compile(r"^[ \t]*\*\*\*[ \t]*END OF (?:THE |THIS )?PROJECT GUTENBERG EBOOK.*$",
                  re.IGNORECASE | re.MULTILINE)


class LongTextError(ValueError):
    """Bad input or an engine that cannot do what is asked. ``field`` names the option."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


# ------------------------------------------------------------------------------------ book
@dataclass
class Book:
    """A decoded book: ``text`` (``\\n`` line ends, Gutenberg header/licence removed when
    found), the ``encoding`` used, whether the Gutenberg markers were found, raw size."""

    path: str
    text: str
    encoding: str
    gutenberg: bool
    raw_bytes: int


def decode_text(raw: bytes, encoding: str = "auto", name: str = "file") -> tuple[str, str]:
    """Decode ``raw`` strictly. ``encoding`` ``auto``: UTF-8 (a BOM is dropped), else
    Windows-1252. Returns ``(text, encoding used)``.

    Raises:
        LongTextError: (field ``encoding``) unknown codec, or bytes that do not decode — the
            message names the byte offset, the byte, and the ``--encoding`` option.
    """
    if encoding == "auto":
        try:
            return raw.decode("utf-8-sig"), "utf-8"
        except UnicodeDecodeError:
            pass
        try:
            return raw.decode("cp1252"), "cp1252"
        except UnicodeDecodeError as exc:
            raise LongTextError("encoding", (
                f"{name} is neither UTF-8 nor Windows-1252: byte 0x{raw[exc.start]:02x} at offset "
                f"{exc.start} does not decode; pass --encoding (e.g. latin-1, utf-16)")) from None
    try:
        return raw.decode(encoding), encoding
    except LookupError:
        raise LongTextError("encoding", f"unknown encoding {encoding!r} (use a Python codec name, "
                                        "e.g. utf-8, cp1252, latin-1)") from None
    except UnicodeDecodeError as exc:
        raise LongTextError("encoding", (
            f"{name} does not decode as {encoding}: byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start} ({exc.reason}); try --encoding auto, cp1252 or latin-1")) from None


def strip_gutenberg(text: str) -> tuple[str, bool]:
    """The book text between the ``*** START OF ... ***`` and ``*** END OF ... ***`` lines.

    Returns ``(text, True)`` when the start marker is found (the end marker is optional);
    ``(text, False)`` unchanged otherwise. Leading/trailing blank space is stripped.
    """
    start = _START.search(text)
    if start is None:
        return text.strip(), False
    body = text[start.end():]
    end = _END.search(body)
    if end is not None:
        body = body[:end.start()]
    return body.strip(), True


def read_book(path: str | Path, encoding: str = "auto") -> Book:
    """Read and decode a text file (see :func:`decode_text`, :func:`strip_gutenberg`);
    CRLF and CR line ends become ``\\n``.

    Raises:
        LongTextError: the file is missing or unreadable (field ``book``), does not decode
            (field ``encoding``), or holds no text.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise LongTextError("book", f"{p}: no such file") from None
    except OSError as exc:
        raise LongTextError("book", f"{p}: cannot read ({exc.strerror or exc})") from None
    text, used = decode_text(raw, encoding, name=str(p))
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    body, found = strip_gutenberg(text)
    if not body:
        raise LongTextError("book", f"{p}: no text" + (" between the Gutenberg START and END lines"
                                                         if found else ""))
    return Book(path=str(p), text=body, encoding=used, gutenberg=found, raw_bytes=len(raw))


# ------------------------------------------------------------------------------- measures
def seq_rep_n(seq: Sequence[Any], n: int) -> float | None:
    """``1 - |unique n-grams| / |n-grams|`` of one sequence (Welleck et al. 2019, section 5);
    None when the sequence is shorter than ``n``. Raises ValueError for ``n < 1``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    grams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
    if not grams:
        return None
    return 1.0 - len(set(grams)) / len(grams)


def perplexity(logprobs: Sequence[float | None]) -> float | None:
    """``exp(-mean)`` of the finite logprobs (natural log); None when there is none or any is
    NaN/None (broken numbers are no data, never a perplexity)."""
    vals = []
    for lp in logprobs:
        if lp is None or math.isnan(lp):
            return None
        if math.isfinite(lp):
            vals.append(lp)
    if not vals:
        return None
    return math.exp(-math.fsum(vals) / len(vals))


# ---------------------------------------------------------------------------------- config
@dataclass
class LongTextConfig:
    """Settings of one long-text run (defaults: the design notes').

    ``chunk_size`` tokens per window including BOS; ``overlap`` book tokens shared by
    consecutive windows; ``max_new_tokens`` generated per window (capped, see
    :func:`plan_generation`); ``repetition_penalty`` (CTRL/HF definition, 1 = off);
    ``temperature`` 0 = greedy; ``seed`` for sampling; ``position_bucket`` width of the
    position profile in tokens; ``max_chunks`` evenly spaced windows (None = all);
    ``generate`` False skips generation; ``concurrency`` requests in flight (HTTP).

    Raises:
        LongTextError: a value out of range, naming the field and the limit.
    """

    chunk_size: int = DEFAULT_CHUNK_SIZE
    overlap: int = DEFAULT_OVERLAP
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    repetition_penalty: float = DEFAULT_REPETITION_PENALTY
    temperature: float = 0.0
    seed: int | None = None
    position_bucket: int = DEFAULT_POSITION_BUCKET
    max_chunks: int | None = None
    generate: bool = True
    concurrency: int = 8

    def __post_init__(self) -> None:
        def integer(name: str, minimum: int, value: Any) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise LongTextError(name, f"must be an integer >= {minimum}, got {value!r}")

        integer("chunk_size", 3, self.chunk_size)
        integer("overlap", 0, self.overlap)
        integer("max_new_tokens", 1, self.max_new_tokens)
        integer("position_bucket", 1, self.position_bucket)
        integer("concurrency", 1, self.concurrency)
        if self.max_chunks is not None:
            integer("max_chunks", 1, self.max_chunks)
        if self.overlap > self.chunk_size - 2:
            raise LongTextError("overlap", f"must be <= chunk_size - 2 = {self.chunk_size - 2} (BOS + at "
                                           f"least one new token per window), got {self.overlap}")
        rp = self.repetition_penalty
        if isinstance(rp, bool) or not isinstance(rp, (int, float)) or not math.isfinite(rp) or rp <= 0:
            raise LongTextError("repetition_penalty", f"must be a finite number > 0, got {rp!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 2:
            raise LongTextError("temperature", f"must be between 0 and 2, got {t!r}")


# ------------------------------------------------------------------------------------ plan
@dataclass
class ChunkPlan:
    """One window: book tokens ``[start, end)``; ``window`` = [BOS] + those tokens;
    ``first_new`` = index in ``window`` of the first token not scored by an earlier window;
    ``prompt`` / ``max_tokens`` = the generation request (:func:`plan_generation`)."""

    index: int
    start: int
    end: int
    window: list[int]
    first_new: int
    prompt: list[int] = field(default_factory=list)
    max_tokens: int = 0


def chunk_spans(n_tokens: int, text_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """Spans ``[start, end)`` of ``text_tokens`` book tokens, consecutive spans sharing
    ``overlap`` tokens; the last span ends at ``n_tokens`` (and may be shorter).

    Raises:
        ValueError: ``text_tokens`` < 1 or ``overlap`` not in ``[0, text_tokens)``.
    """
    if text_tokens < 1 or not 0 <= overlap < text_tokens:
        raise ValueError(f"need text_tokens >= 1 and 0 <= overlap < text_tokens, got {text_tokens}, {overlap}")
    spans: list[tuple[int, int]] = []
    start = 0
    while start < n_tokens:
        end = min(start + text_tokens, n_tokens)
        spans.append((start, end))
        if end == n_tokens:
            break
        start = end - overlap
    return spans


def evenly_spaced(n: int, k: int | None) -> list[int]:
    """``k`` indices spread evenly over ``range(n)`` (first and last included); all if
    ``k`` is None or >= n."""
    if k is None or k >= n:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def plan_generation(window: list[int], bos_id: int | None, max_new_tokens: int,
                    max_model_len: int) -> tuple[list[int], int]:
    """The generation request of one window: ``(prompt, max_tokens)`` with
    ``len(prompt) + max_tokens <= max_model_len``.

    ``max_tokens = min(max_new_tokens, max(max_model_len - len(window), max_model_len // 2))``;
    the prompt is the window, or — when it does not leave that much room — BOS (if any) plus
    the window's last tokens.
    """
    room = max_model_len - len(window)
    gen = max(1, min(max_new_tokens, max(room, max_model_len // 2)))
    keep = max_model_len - gen
    if len(window) <= keep:
        return list(window), gen
    if bos_id is not None and window and window[0] == bos_id:
        return [bos_id] + window[len(window) - (keep - 1):] if keep > 1 else [bos_id], gen
    return window[len(window) - keep:], gen


def plan_chunks(token_ids: list[int], config: LongTextConfig, bos_id: int | None,
                max_model_len: int, max_window: int | None = None) -> tuple[list[ChunkPlan], int]:
    """Cut the book's tokens into windows and pick ``config.max_chunks`` of them.

    Returns ``(plans, total number of windows)``. ``max_window`` is the longest window the
    backend can score (default ``max_model_len``).

    Raises:
        LongTextError: ``chunk_size`` above what the backend can score (field ``chunk_size``),
            or an empty book (field ``book``).
    """
    limit = max_model_len if max_window is None else max_window
    if config.chunk_size > limit:
        raise LongTextError("chunk_size", (
            f"{config.chunk_size} tokens per window > {limit}, the longest window this engine can score "
            f"(max_model_len {max_model_len}); lower --chunk-size or serve the model with a larger "
            "--max-model-len"))
    if not token_ids:
        raise LongTextError("book", "the text has no tokens")
    nbos = 1 if bos_id is not None else 0
    text_tokens = config.chunk_size - nbos
    spans = chunk_spans(len(token_ids), text_tokens, config.overlap)
    plans = []
    for i in evenly_spaced(len(spans), config.max_chunks):
        start, end = spans[i]
        window = ([bos_id] if nbos else []) + list(token_ids[start:end])
        first_new = nbos if i == 0 else nbos + config.overlap
        first_new = max(first_new, 1)       # the first token of a window has no context
        prompt, max_tokens = plan_generation(window, bos_id, config.max_new_tokens, max_model_len)
        plans.append(ChunkPlan(i, start, end, window, min(first_new, len(window)), prompt, max_tokens))
    return plans, len(spans)


# -------------------------------------------------------------------------------- backends
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


# --------------------------------------------------------------------------------- results
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
    return nll, (math.exp(nll / len(new)) if new else None), perplexity(allv)


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
    scores: list[list[float | None] | None] = []
    batch = max(1, config.concurrency)
    for i in range(0, len(plans), batch):
        scores += backend.score([p.window for p in plans[i:i + batch]])
        if progress:
            progress("score", len(scores), len(plans))
    if all(s is None for s in scores):
        notes.append(f"{backend.name} returns no prompt logprobs: perplexity is no data")
    gens: list[Generation | None] = [None] * len(plans)
    if config.generate:
        done = 0
        for i in range(0, len(plans), batch):
            part = plans[i:i + batch]
            gens[i:i + len(part)] = backend.generate([p.prompt for p in part], [p.max_tokens for p in part], config)
            done += len(part)
            if progress:
                progress("generate", done, len(plans))
        capped = [p for p in plans if p.max_tokens < config.max_new_tokens or len(p.prompt) < len(p.window)]
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
            seq_rep=reps, gen_ppl=perplexity(gen.logprobs) if gen and gen.logprobs else None,
            gen_text=gen.text if gen else ""))
    return LongTextReport(
        book={"path": book.path, "encoding": book.encoding, "gutenberg": book.gutenberg,
              "chars": len(book.text), "raw_bytes": book.raw_bytes},
        engine={"backend": backend.name, "max_model_len": backend.max_model_len, "bos_id": backend.bos_id},
        config=asdict(config), total_tokens=len(ids), total_chunks=total, chunks=results,
        positions=buckets, seconds=time.monotonic() - t0, notes=notes)


# ---------------------------------------------------------------------------- HTTP backend
def _error_text(resp: Any) -> str:
    try:
        doc = resp.json()
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            return str(err.get("message"))
        if isinstance(doc, dict) and "detail" in doc:
            return str(doc["detail"])
    except ValueError:
        pass
    return resp.text[:300]


def parse_prompt_logprobs(entries: Any, window: list[int]) -> list[float | None] | None:
    """vLLM's ``choices[i].prompt_logprobs`` → logprob of each window token.

    Accepts vLLM's form (a list, entry 0 null, then ``{"<token id>": {"logprob": x, ...}}``
    dicts holding at least the actual token) and a plain list of numbers. Returns None when
    ``entries`` is missing or does not match the window (wrong length, token absent).
    """
    if not isinstance(entries, list) or len(entries) != len(window):
        return None
    out: list[float | None] = [None]
    for tok, entry in zip(window[1:], entries[1:]):
        if isinstance(entry, (int, float)) and not isinstance(entry, bool):
            out.append(float(entry))
        elif isinstance(entry, dict):
            item = entry.get(str(tok), entry.get(tok))
            if isinstance(item, dict):
                item = item.get("logprob")
            if not isinstance(item, (int, float)) or isinstance(item, bool):
                return None
            out.append(float(item))
        else:
            return None
    return out


class HttpBackend:
    """An engine over HTTP (the bundled engine, or vLLM's OpenAI server).

    Uses ``GET /v1/models`` (served name), ``GET /stats`` or the model card for
    ``max_model_len``, ``POST /tokenize`` (vLLM's tokenizer API) and ``POST /v1/completions``
    with token-id prompts — ``prompt_logprobs: 0`` and ``max_tokens: 1`` to score a window
    (so a window is at most ``max_model_len - 1`` tokens), ``logprobs: 0`` to generate.

    Raises:
        LongTextError: the engine cannot be reached, has no ``/tokenize``, or refuses a
            request (the engine's own message is included).
    """

    def __init__(self, base_url: str, model: str | None = None, timeout: float = 600.0,
                 transport: Any = None, api_key: str | None = None) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_kw = dict(base_url=self.base_url, timeout=timeout, headers=headers, transport=transport)
        self._client = httpx.Client(**self._client_kw)
        self._warned = False
        models = self._get("/v1/models")
        data = models.get("data") or []
        if not data:
            raise LongTextError("url", f"{self.base_url}/v1/models lists no model")
        card = next((m for m in data if m.get("id") == model), None) if model else data[0]
        if card is None:
            raise LongTextError("model", f"{model!r} is not served at {self.base_url} "
                                         f"(served: {', '.join(str(m.get('id')) for m in data)})")
        self.model = str(card.get("id"))
        self.name = f"http {self.base_url} ({self.model})"
        mml = card.get("max_model_len")
        if not isinstance(mml, int):
            try:
                mml = (self._get("/stats").get("engine") or {}).get("max_model_len")
            except LongTextError:
                mml = None
        if not isinstance(mml, int) or mml < 3:
            raise LongTextError("url", f"{self.base_url} does not report max_model_len (neither in "
                                       "/v1/models nor in /stats)")
        self.max_model_len = mml
        self.max_window = mml - 1
        with_bos = self._tokenize("a", True)
        without = self._tokenize("a", False)
        self.bos_id = with_bos[0] if len(with_bos) == len(without) + 1 else None

    def close(self) -> None:
        self._client.close()

    # -- plumbing
    def _get(self, path: str) -> dict:
        import httpx

        try:
            r = self._client.get(path)
        except httpx.HTTPError as exc:
            raise LongTextError("url", f"cannot reach {self.base_url}{path}: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise LongTextError("url", f"GET {self.base_url}{path}: HTTP {r.status_code}: {_error_text(r)}")
        return r.json()

    def _tokenize(self, text: str, special: bool) -> list[int]:
        import httpx

        try:
            r = self._client.post("/tokenize", json={"model": self.model, "prompt": text,
                                                    "add_special_tokens": special})
        except httpx.HTTPError as exc:
            raise LongTextError("url", f"cannot reach {self.base_url}/tokenize: {exc}") from None
        if r.status_code in (404, 405):
            raise LongTextError("url", (
                f"the engine at {self.base_url} has no POST /tokenize (vLLM's tokenizer API), which "
                "inferctl longtext needs to cut the book into token windows"))
        if r.status_code != 200:
            raise LongTextError("url", f"POST /tokenize: HTTP {r.status_code}: {_error_text(r)}")
        toks = r.json().get("tokens")
        if not isinstance(toks, list):
            raise LongTextError("url", "POST /tokenize: the answer has no 'tokens' list")
        return [int(t) for t in toks]

    def tokenize(self, text: str) -> list[int]:
        return self._tokenize(text, False)

    async def _complete(self, client: Any, sem: asyncio.Semaphore, body: dict) -> dict:
        async with sem:
            r = await client.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise LongTextError(None, f"POST /v1/completions: HTTP {r.status_code}: {_error_text(r)}")
        return r.json()

    def _run_all(self, bodies: list[dict], concurrency: int) -> list[dict]:
        import httpx

        async def main() -> list[dict]:
            sem = asyncio.Semaphore(concurrency)
            kw = dict(self._client_kw)
            if kw.get("transport") is not None and not isinstance(kw["transport"], httpx.AsyncBaseTransport):
                kw["transport"] = None
            async with httpx.AsyncClient(**kw) as client:
                return await asyncio.gather(*(self._complete(client, sem, b) for b in bodies))

        try:
            return asyncio.run(main())
        except httpx.HTTPError as exc:
            raise LongTextError("url", f"{self.base_url}/v1/completions: {type(exc).__name__}: {exc}") from None

    def score(self, windows: list[list[int]]) -> list[list[float | None] | None]:
        if len(windows) and max(len(w) for w in windows) > self.max_window:
            raise LongTextError("chunk_size", f"window of {max(len(w) for w in windows)} tokens > {self.max_window}")
        bodies = [{"model": self.model, "prompt": w, "max_tokens": 1, "temperature": 0.0,
                   "prompt_logprobs": 0} for w in windows]
        docs = self._run_all(bodies, len(windows) or 1)
        return [parse_prompt_logprobs((d.get("choices") or [{}])[0].get("prompt_logprobs"), w)
                for d, w in zip(docs, windows)]

    def generate(self, prompts: list[list[int]], max_tokens: list[int],
                 config: LongTextConfig) -> list[Generation]:
        bodies = []
        for p, m in zip(prompts, max_tokens):
            b = {"model": self.model, "prompt": p, "max_tokens": m, "temperature": config.temperature,
                 "repetition_penalty": config.repetition_penalty, "logprobs": 0}
            if config.seed is not None:
                b["seed"] = config.seed
            bodies.append(b)
        out = []
        for d in self._run_all(bodies, config.concurrency):
            ch = (d.get("choices") or [{}])[0]
            lp = ch.get("logprobs") or {}
            toks = lp.get("tokens")
            lps = lp.get("token_logprobs")
            text = ch.get("text") or ""
            if not isinstance(toks, list):
                toks = list(text)   # no token list: characters as symbols (noted by the caller)
                lps = []
            out.append(Generation(tokens=toks, logprobs=list(lps or []), text=text,
                                  finish_reason=ch.get("finish_reason")))
        return out


# --------------------------------------------------------------------------------- output
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
    s = Table(title="summary")
    s.add_column("measure")
    s.add_column("value", justify="right")
    for k, v in report.summary().items():
        s.add_row(k, _fmt(v, 4) if isinstance(v, float) else str(v))
    return [t, p, s]


def write_outputs(report: LongTextReport, prefix: str | Path) -> tuple[Path, Path]:
    """Write ``<prefix>.csv`` (per chunk) and ``<prefix>.json`` (everything)."""
    base = Path(prefix)
    base.parent.mkdir(parents=True, exist_ok=True)
    csv_path = base.with_name(base.name + ".csv")
    json_path = base.with_name(base.name + ".json")
    csv_path.write_text(chunks_csv(report), encoding="utf-8")
    json_path.write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False), encoding="utf-8")
    return csv_path, json_path


# ------------------------------------------------------------------------------------ CLI
def register(app: Any) -> None:
    """Add ``inferctl longtext BOOK`` to the typer ``app``."""
    import typer

    @app.command("longtext")
    def longtext(
        book: Path = typer.Argument(..., help="A text file (Gutenberg books: header/licence stripped)."),
        url: Optional[str] = typer.Option(None, "--url", help="A running engine (default: start one with --model)."),
        model: Optional[str] = typer.Option(None, "--model", help="Model to serve when no --url is given (.bin or HF dir); "
                                                                  "with --url, the served model name."),
        encoding: str = typer.Option("auto", "--encoding", help="auto (UTF-8, else Windows-1252) or a codec name."),
        chunk_size: Optional[int] = typer.Option(None, "--chunk-size", help=f"Tokens per window, BOS included "
                                                 f"(default {DEFAULT_CHUNK_SIZE}, or the longest window the engine can score)."),
        overlap: int = typer.Option(DEFAULT_OVERLAP, "--overlap", help="Book tokens shared by consecutive windows."),
        max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, "--max-new-tokens"),
        repetition_penalty: float = typer.Option(DEFAULT_REPETITION_PENALTY, "--repetition-penalty"),
        temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
        seed: Optional[int] = typer.Option(None, "--seed"),
        max_chunks: Optional[int] = typer.Option(None, "--max-chunks", help="Evenly spaced sample of windows (default all)."),
        position_bucket: int = typer.Option(DEFAULT_POSITION_BUCKET, "--position-bucket"),
        no_generate: bool = typer.Option(False, "--no-generate", help="Perplexity only."),
        concurrency: int = typer.Option(8, "--concurrency", help="Requests in flight."),
        max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="For the engine this command starts."),
        out: Optional[Path] = typer.Option(None, "--out", help="Output prefix (default out/longtext/longtext-<book>): .csv and .json."),
        quiet: bool = typer.Option(False, "--quiet", help="Summary only (no per-chunk table)."),
    ) -> None:
        """Process a book longer than the context in overlapping chunks; perplexity by position
        and repetition of the outputs. Prints the per-chunk table and saves CSV + JSON."""
        from rich.console import Console

        console = Console()
        err = Console(stderr=True)
        try:
            cfg = LongTextConfig(chunk_size=DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size, overlap=overlap, max_new_tokens=max_new_tokens,
                                 repetition_penalty=repetition_penalty, temperature=temperature, seed=seed,
                                 position_bucket=position_bucket, max_chunks=max_chunks,
                                 generate=not no_generate, concurrency=concurrency)
            text = read_book(book, encoding)
        except LongTextError as exc:
            err.print(f"error: --{exc.field.replace('_', '-')}: {exc.message}" if exc.field and exc.field != "book"
                      else f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        sup = None
        backend = None
        try:
            if url is None:
                sup, url = _start_engine(model, max_model_len, err)
            backend = HttpBackend(url, model=model if sup is None else None)
            if chunk_size is None and cfg.chunk_size > backend.max_window:
                # over HTTP a scored window is at most max_model_len - 1 tokens (max_tokens 1)
                cfg = replace(cfg, chunk_size=backend.max_window)
                err.print(f"note: --chunk-size {cfg.chunk_size}: the longest window the engine at {backend.base_url} "
                          f"can score (max_model_len {backend.max_model_len} - 1)", markup=False, highlight=False,
                          soft_wrap=True)
            last = {"t": 0.0}

            def progress(stage: str, done: int, total: int) -> None:
                if time.monotonic() - last["t"] > 2 or done == total:
                    last["t"] = time.monotonic()
                    err.print(f"{stage}: {done}/{total} windows", highlight=False, soft_wrap=True)

            report = run_longtext(text, backend, cfg, progress)
        except LongTextError as exc:
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except RuntimeError as exc:   # the engine did not start
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1)
        finally:
            if backend is not None:
                backend.close()
            if sup is not None:
                sup.stop()
        tables = render_tables(report)
        for t in (tables[1:] if quiet else tables):
            console.print(t)
        for note in report.notes:
            err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
        prefix = out if out is not None else Path("out") / "longtext" / f"longtext-{book.stem}"
        csv_path, json_path = write_outputs(report, prefix)
        err.print(f"wrote {csv_path} and {json_path}", markup=False, highlight=False, soft_wrap=True)


def _start_engine(model: str | None, max_model_len: int | None, err: Any) -> tuple[Any, str]:
    """Start ``inferctl engine serve`` on a free loopback port; returns (supervisor, url)."""
    import socket
    import tempfile

    from inferctl.controller.actions import EngineSupervisor, engine_serve_argv

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = ["--max-model-len", str(max_model_len)] if max_model_len else []
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.gettempdir()) / f"inferctl-longtext-engine-{port}.log"
    sup = EngineSupervisor("longtext", engine_serve_argv(port, model=model, extra=extra), url,
                           health_timeout_seconds=120.0, log_path=log)
    err.print(f"starting an engine for {model or 'the demo model'} on {url} (log: {log})", highlight=False, soft_wrap=True)
    sup.start()
    return sup, url
