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
generation); :class:`~.inproc.InProcessBackend` drives the engine's model in this process. A backend
that cannot score prompts gives perplexity "no data" (``None``), never 0.

The notes' two aids are options: ``--sep-every N`` (a ``[SEP]`` marker laid into the book's
tokens every N tokens, never scored) and ``--memory-compression mean`` (the mean input embedding
of the text before a window fed as one extra position after BOS), :mod:`.markers`.

Modules: :mod:`.config` (defaults, settings, the error), :mod:`.book` (reading a text),
:mod:`.chunking` (windows and generation plans), :mod:`.markers` ([SEP] and the mean summary),
:mod:`.measure` (the run and its results), :mod:`.http_backend` (an engine over HTTP),
:mod:`.inproc` (the model in this process: embedding input, one prefill for score + generate),
:mod:`.aids` (the measurement of the two aids), :mod:`.report` (CSV, JSON, tables), :mod:`.cli`
(the command). The measures (seq-rep-n, perplexity) are the contract's
(:mod:`inferctl.contract.quality`).
"""

# ``perplexity`` here is the number alone (the contract's ``perplexity`` also counts non-finite values)
from inferctl.contract.quality import perplexity_value as perplexity
from inferctl.contract.quality import seq_rep_n
from inferctl.tools.longtext.book import Book, decode_text, read_book, strip_gutenberg
from inferctl.tools.longtext.chunking import (ChunkPlan, chunk_spans, evenly_spaced, plan_chunks,
                                              plan_generation)
from inferctl.tools.longtext.cli import register
from inferctl.tools.longtext.config import (DEFAULT_CHUNK_SIZE, DEFAULT_MAX_NEW_TOKENS, DEFAULT_OVERLAP,
                                            DEFAULT_POSITION_BUCKET, DEFAULT_REPETITION_PENALTY, SEQ_REP_NS,
                                            LongTextConfig, LongTextError)
from inferctl.tools.longtext.http_backend import HttpBackend, parse_prompt_logprobs
from inferctl.tools.longtext.measure import (ChunkResult, Generation, LongTextBackend, LongTextReport,
                                             PositionBucket, run_longtext)
from inferctl.tools.longtext.report import CSV_COLUMNS, chunks_csv, render_tables, write_outputs

__all__ = ["CSV_COLUMNS", "DEFAULT_CHUNK_SIZE", "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_OVERLAP",
           "DEFAULT_POSITION_BUCKET", "DEFAULT_REPETITION_PENALTY", "SEQ_REP_NS", "Book", "ChunkPlan",
           "ChunkResult", "Generation", "HttpBackend", "LongTextBackend", "LongTextConfig", "LongTextError",
           "LongTextReport", "PositionBucket", "chunk_spans", "chunks_csv", "decode_text", "evenly_spaced",
           "parse_prompt_logprobs", "perplexity", "plan_chunks", "plan_generation", "read_book", "register",
           "render_tables", "run_longtext", "seq_rep_n", "strip_gutenberg", "write_outputs"]
