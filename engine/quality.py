"""Engine-side output quality: the per-request score record and the repetition-loop stop.

The measures themselves (seq-rep-n, distinct-n, perplexity, the degenerate rule, the
prompt-length buckets) live in :mod:`inferctl.contract.quality`, shared with the
controller and the tools; they are re-exported here for the engine's callers.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real

from inferctl.contract.quality import (  # noqa: F401 - re-exported
    DEGENERATE_MIN_TOKENS, DEGENERATE_NGRAM, DEGENERATE_THRESHOLD, PROMPT_LEN_BUCKETS,
    PROMPT_LEN_EDGES, distinct_n, is_degenerate, perplexity, prompt_len_bucket, seq_rep_n)


def repetition_loop(ids: Sequence[Hashable], min_ngram: int = 1, max_ngram: int = 32,
                    min_repeats: int = 4, min_span: int = 16) -> tuple[int, int] | None:
    """Find a loop at the tail of ``ids``: the same n-gram repeated back to back.

    For each n in [min_ngram, max_ngram] the tail is a loop when it consists of at least
    ``max(min_repeats, ceil(min_span / n))`` consecutive copies of its last n tokens. With
    the defaults a single token must repeat 16 times, a bigram 8 times, a 4- to 32-gram 4
    times: long enough that lists, "ha ha ha" or "...." rarely trip it, and n up to 32
    catches a looping sentence (tiny models loop on whole sentences of 10-20 tokens).

    Cost: only the last ``max over n of copies * n`` (128 with the defaults) ids are read and
    each n stops at its first mismatch, so a call is O(max_ngram**2) at worst, independent of
    ``len(ids)``: the engine can call it after every token.

    Returns:
        ``(n, repeats)`` for the smallest looping n (repeats = copies found, counting back
        from the end, at most the number required), or None.

    Raises:
        ValueError: a parameter is not a positive integer or min_ngram > max_ngram.
    """
    for name, value in (("min_ngram", min_ngram), ("max_ngram", max_ngram),
                        ("min_repeats", min_repeats), ("min_span", min_span)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if min_ngram > max_ngram:
        raise ValueError(f"min_ngram {min_ngram} must be <= max_ngram {max_ngram}")
    needs = {n: max(min_repeats, -(-min_span // n)) for n in range(min_ngram, max_ngram + 1)}
    window = max(n * k for n, k in needs.items())
    tail = list(ids[-window:]) if len(ids) > window else list(ids)
    length = len(tail)
    for n, need in needs.items():
        if need * n > length:
            continue
        unit = tail[length - n:]
        repeats = 1
        pos = length - 2 * n
        while pos >= 0 and tail[pos:pos + n] == unit:
            repeats += 1
            if repeats >= need:
                return n, repeats
            pos -= n
    return None


def detect_repetition_loop(ids: Sequence[Hashable], min_ngram: int = 1, max_ngram: int = 32,
                           min_repeats: int = 4, min_span: int = 16) -> bool:
    """True when :func:`repetition_loop` finds a loop at the tail of ``ids`` (the engine's
    optional repetition stop, finish_reason "repetition"). Same arguments and errors."""
    return repetition_loop(ids, min_ngram, max_ngram, min_repeats, min_span) is not None


@dataclass
class OutputQuality:
    """Quality record of one finished output (the "recent" entries of ``/stats``).

    Attributes:
        seq_rep: {"1".."4": seq-rep-n or None}.
        distinct: {"1", "2": distinct-n or None}.
        perplexity: see :func:`perplexity`; None when excluded.
        nonfinite_logprobs: count of NaN/inf chosen-token logprobs.
        degenerate: :func:`is_degenerate`, or finish_reason "repetition".
        prompt_len_bucket: :func:`prompt_len_bucket` of the prompt length.
    """

    seq_rep: dict[str, float | None]
    distinct: dict[str, float | None]
    perplexity: float | None
    nonfinite_logprobs: int
    degenerate: bool
    prompt_len_bucket: str

    def to_dict(self) -> dict:
        """A JSON-ready dict (no NaN/inf: None stands for no data)."""
        return json_safe({
            "seq_rep": self.seq_rep, "distinct": self.distinct, "perplexity": self.perplexity,
            "nonfinite_logprobs": self.nonfinite_logprobs, "degenerate": self.degenerate,
            "prompt_len_bucket": self.prompt_len_bucket,
        })


def score_output(token_ids: Sequence[int], logprobs: Sequence[float | None],
                 prompt_tokens: int, finish_reason: str | None = None) -> OutputQuality:
    """All quality measures of one finished output (for the engine's per-request stats).

    Args:
        token_ids: the generated token ids (not the prompt).
        logprobs: their chosen-token logprobs (may hold NaN/inf, see :func:`perplexity`).
        prompt_tokens: prompt length in tokens (for the bucket).
        finish_reason: "repetition" marks the output degenerate whatever its seq-rep.

    Raises:
        ValueError: ``prompt_tokens`` is not an integer >= 0.
    """
    ppl, nonfinite = perplexity(logprobs)
    return OutputQuality(
        seq_rep={str(n): seq_rep_n(token_ids, n) for n in (1, 2, 3, 4)},
        distinct={str(n): distinct_n(token_ids, n) for n in (1, 2)},
        perplexity=ppl,
        nonfinite_logprobs=nonfinite,
        degenerate=finish_reason == "repetition" or is_degenerate(token_ids),
        prompt_len_bucket=prompt_len_bucket(prompt_tokens),
    )


def json_safe(x):
    """Copy of ``x`` with every NaN / +-inf float replaced by None (recursively).

    So that responses are strictly valid JSON (RFC 8259 has no NaN or Infinity;
    ``json.dumps(..., allow_nan=False)`` succeeds on the result; docs/field-cases.md, NaN logprobs).
    dicts keep their keys; lists and tuples become lists; ints, bools, strings and None pass
    through; other real numbers (numpy scalars) become float or None. Objects of other types
    are returned unchanged.
    """
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, Integral):
        return int(x)
    if isinstance(x, Real):
        f = float(x)
        return f if math.isfinite(f) else None
    return x
