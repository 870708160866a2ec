"""The design notes' two long-text aids, applied to planned windows: a ``[SEP]`` marker every N
tokens (``--sep-every``) and a mean-pooled memory of the earlier text (``--memory-compression mean``).

**[SEP] every N tokens** (:func:`insert_separators`): the marker (``sep_text``, default
``"[SEP]"``, encoded by the model's own tokenizer without BOS — one token where the vocabulary
has a ``[SEP]`` token, otherwise the pieces it splits into: stories260K six tokens ``▁``, ``[``,
``S``, ``E``, ``P``, ``]`` (ids 410, 508, 437, 459, 460, 509; SentencePiece's dummy-prefix space
first), SmolLM2 four tokens ``[``, ``SE``, ``P``, ``]`` (ids 75, 6493, 64, 77) — neither
vocabulary has a ``[SEP]`` token) goes before every book token whose index in
the *whole book* is a positive multiple of N — the markers are laid into the book's token
stream, then the windows are cut from it, so a window holds the markers that fall inside its
span (a window of 512 with N = 1024 holds none or one). Marker tokens are input only: they are
never scored, and perplexity, positions and "new" tokens count book tokens only, so the
numbers compare with a run without markers token for token.

**Mean compression** (:func:`insert_summary`): for a window that does not start the book, one
extra input position right after BOS carries the *mean of the input embeddings* (the model's
token-embedding rows, no rescaling) of every book token before the window's first token. It
is a bag-of-words summary of all earlier text, fed as a vector where a token embedding would
go (``LlamaModel.forward(..., inputs_embeds=...)``); it takes a position (RoPE position 1) and
is not scored. The first window of the book gets none. The generation prompt keeps it (when
the prompt is cut to its tail, the summary stays right after BOS).
"""

from __future__ import annotations

from typing import Any

from inferctl.tools.longtext.chunking import ChunkPlan, plan_generation

__all__ = ["SUMMARY_PLACEHOLDER_ID", "insert_separators", "insert_summary", "plan_prompt"]

#: The token id sent at the summary position (its embedding is replaced by the summary vector).
SUMMARY_PLACEHOLDER_ID = 0


def _book_index(plan: ChunkPlan) -> list[int]:
    return list(plan.book_index) if plan.book_index is not None else list(range(len(plan.window)))


def insert_separators(plan: ChunkPlan, sep: list[int], every: int, nbos: int) -> None:
    """Insert ``sep`` before each book token of ``plan`` whose book index ``k`` satisfies
    ``k % every == 0`` and ``k > plan.start`` (markers sit *between* book tokens). In place:
    sets ``input_ids`` and ``book_index``. Raises ValueError for an empty ``sep`` or ``every`` < 1."""
    if not sep or every < 1:
        raise ValueError(f"need a non-empty marker and every >= 1, got {sep!r}, {every}")
    if plan.embeds:
        raise ValueError("insert separators before the summary")
    src = plan.model_input
    index = _book_index(plan)
    pos_of = {p: i for i, p in enumerate(index)}      # input position -> window index (book tokens)
    out: list[int] = []
    new_index = [0] * len(index)
    for p, tok in enumerate(src):
        i = pos_of.get(p)
        if i is not None and i >= nbos:
            k = plan.start + i - nbos
            if k > plan.start and k % every == 0:
                out.extend(sep)
        if i is not None:
            new_index[i] = len(out)
        out.append(tok)
    plan.input_ids, plan.book_index = out, new_index


def insert_summary(plan: ChunkPlan, vector: Any, nbos: int) -> None:
    """Put ``vector`` (the mean embedding of the book before ``plan.start``) at input position
    ``nbos`` (right after BOS). In place: ``input_ids`` (a placeholder id there), ``book_index``
    shifted, ``embeds`` = ``{nbos: vector}``."""
    src = plan.model_input
    plan.input_ids = src[:nbos] + [SUMMARY_PLACEHOLDER_ID] + src[nbos:]
    plan.book_index = [p if p < nbos else p + 1 for p in _book_index(plan)]
    plan.embeds = {nbos: vector}


def plan_prompt(plan: ChunkPlan, bos_id: int | None, max_new_tokens: int, max_model_len: int) -> None:
    """Re-plan the generation request from ``plan.model_input`` (markers and summary included):
    ``prompt``, ``max_tokens`` and ``prompt_embeds`` (the summary kept right after BOS when the
    prompt is cut to the window's tail)."""
    prompt, max_tokens = plan_generation(plan.model_input, bos_id, max_new_tokens, max_model_len)
    embeds = None
    if plan.embeds:
        (pos, vec), = plan.embeds.items()
        if len(prompt) == len(plan.model_input):
            embeds = {pos: vec}
        else:
            prompt = prompt[:pos] + [SUMMARY_PLACEHOLDER_ID] + prompt[pos + 1:]
            embeds = {pos: vec}
    plan.prompt, plan.max_tokens, plan.prompt_embeds = prompt, max_tokens, embeds
