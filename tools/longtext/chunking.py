"""Cut a book's tokens into overlapping windows (the sliding-window evaluation of Hugging Face's
"Perplexity of fixed-length models" guide, stride = window - overlap) and plan each window's
generation request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferctl.tools.longtext.config import LongTextConfig, LongTextError


@dataclass
class ChunkPlan:
    """One window: book tokens ``[start, end)``; ``window`` = [BOS] + those tokens;
    ``first_new`` = index in ``window`` of the first token not scored by an earlier window;
    ``prompt`` / ``max_tokens`` = the generation request (:func:`plan_generation`).

    With markers or a summary (:mod:`.markers`): ``input_ids`` is what the model is given
    (``window`` with [SEP] tokens / a summary position inserted), ``book_index[i]`` the
    position in ``input_ids`` of ``window[i]``, ``embeds`` / ``prompt_embeds`` map a position of
    ``input_ids`` / ``prompt`` to the vector fed there instead of a token embedding."""

    index: int
    start: int
    end: int
    window: list[int]
    first_new: int
    prompt: list[int] = field(default_factory=list)
    max_tokens: int = 0
    input_ids: list[int] | None = None
    book_index: list[int] | None = None
    embeds: dict[int, Any] | None = None
    prompt_embeds: dict[int, Any] | None = None

    @property
    def model_input(self) -> list[int]:
        """The token ids the model is given for scoring (``input_ids``, else ``window``)."""
        return self.window if self.input_ids is None else self.input_ids


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

