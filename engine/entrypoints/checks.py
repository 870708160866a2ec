"""Request checks only the engine can make: they need the tokenized prompt or the vocabulary.

Each raises :class:`~inferctl.contract.errors.APIError` 400 naming the field and the numbers
(no clamping: docs/field-cases.md, "longer than the context or the cache").
"""

from __future__ import annotations

from inferctl.contract.errors import APIError


def check_prompt_length(prompt_len: int, max_model_len: int, *, param: str = "prompt") -> None:
    """Raise APIError 400 when a prompt leaves no room for one generated token.

    ``prompt_len`` and ``max_model_len`` in tokens; the limit is ``max_model_len - 1``.
    """
    if prompt_len >= max_model_len:
        raise APIError(
            400, f"{param}: the prompt is {prompt_len} tokens; max_model_len is {max_model_len}, so a prompt "
                 f"may have at most {max_model_len - 1} tokens (one must be left to generate)",
            param=param, code="context_length_exceeded")


def check_max_tokens(max_tokens: int | None, prompt_len: int, max_model_len: int, *,
                     param: str = "max_tokens") -> None:
    """Raise APIError 400 when ``max_tokens > max_model_len - prompt_len`` (all in tokens).

    The message names the field, the value, and the bound with its parts.
    """
    if max_tokens is None:
        return
    room = max_model_len - prompt_len
    if max_tokens > room:
        raise APIError(
            400, f"{param}: {max_tokens} is more than the limit {room} = max_model_len {max_model_len} - "
                 f"prompt {prompt_len} tokens (prompt + {param} = {prompt_len + max_tokens} > {max_model_len})",
            param=param, code="context_length_exceeded")


def check_token_ids(ids: list[int], vocab_size: int, *, param: str = "tokens") -> None:
    """Raise APIError 400 naming ``param[i]`` for the first id outside ``[0, vocab_size)``."""
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise APIError(400, f"{param}[{i}]: token id {t} is out of range; the vocabulary has "
                                f"{vocab_size} tokens (ids 0..{vocab_size - 1})",
                           param=f"{param}[{i}]", code="invalid_token_id")
