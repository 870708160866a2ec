"""Stop checks of a generated token (pure functions; vLLM's ``StopChecker``).

The engine asks, for each new token of a sequence, in this order:

1. :func:`token_stop_reason` before the token is detokenized: ``"error"`` when the row's
   logits had no finite value, ``"stop"`` for an end-of-text id (EOS, or the bundle's own
   end ids such as BOS for llama2.c checkpoints) unless ``ignore_eos``, or for one of the
   request's ``stop_token_ids``.
2. otherwise the detokenizer says whether a stop string completed (``"stop"``).
3. otherwise :func:`limit_stop_reason`: ``"length"`` at ``max_tokens``, ``"repetition"`` when
   the request asked for the repetition stop and the output's tail loops
   (:func:`inferctl.engine.quality.detect_repetition_loop`).

Finish reasons are :data:`inferctl.contract.stats.FINISH_REASONS`.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

from inferctl.contract.stats import FINISH_ERROR, FINISH_LENGTH, FINISH_REPETITION, FINISH_STOP
from inferctl.engine.quality import detect_repetition_loop

#: The error of a sequence whose logits had no finite value.
NONFINITE_LOGITS_ERROR = "the model's logits had no finite value (NaN/inf); output stopped"


@dataclass(frozen=True)
class RepetitionStop:
    """The repetition stop's loop detector settings (``EngineConfig.repetition_stop_*``):
    n-grams from 1 to ``max_ngram`` tokens, at least ``min_repeats`` copies spanning at least
    ``min_span`` tokens."""

    max_ngram: int
    min_repeats: int
    min_span: int


def token_stop_reason(token_id: int, *, nonfinite: bool, end_ids: Container[int],
                      ignore_eos: bool, stop_token_ids: Container[int]) -> str | None:
    """``"error"``, ``"stop"`` or None for a new token, before it is detokenized."""
    if nonfinite:
        return FINISH_ERROR
    if token_id in end_ids and not ignore_eos:
        return FINISH_STOP
    if token_id in stop_token_ids:
        return FINISH_STOP
    return None


def limit_stop_reason(output_token_ids: Sequence[int], *, max_tokens: int, repetition_stop: bool,
                      rule: RepetitionStop) -> str | None:
    """``"length"`` once ``len(output_token_ids) >= max_tokens``, ``"repetition"`` when asked
    for and the tail loops, else None."""
    if len(output_token_ids) >= max_tokens:
        return FINISH_LENGTH
    if repetition_stop and detect_repetition_loop(output_token_ids, 1, rule.max_ngram,
                                                  rule.min_repeats, rule.min_span):
        return FINISH_REPETITION
    return None
