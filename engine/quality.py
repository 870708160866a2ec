"""Output-quality measures: repetition, diversity, perplexity, degeneration (pure functions).

All functions take plain sequences (token ids, or words for tests and reports) and return
``None`` for "no data" (a sequence too short to have an n-gram, no finite logprob), never 0.

Sources:
- seq-rep-n: Welleck et al. 2019, "Neural Text Generation with Unlikelihood Training"
  (arXiv:1908.04319), section 5: ``1 - |unique n-grams| / |n-grams|`` of one continuation.
- distinct-n: Li et al. 2016, "A Diversity-Promoting Objective Function for Neural
  Conversation Models" (NAACL). Li et al. divide the distinct n-grams by the number of
  generated *tokens*; we divide by the number of *n-grams*, so that for one sequence
  ``distinct_n == 1 - seq_rep_n`` exactly and both lie in [0, 1] for every n (the common
  modern reading, e.g. in Welleck et al.'s and most toolkits' code).
- perplexity: ``exp(-mean log p(token))`` over generated tokens (natural log).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real

#: Default degeneration rule (see :func:`is_degenerate`).
DEGENERATE_NGRAM = 4
DEGENERATE_THRESHOLD = 0.5
DEGENERATE_MIN_TOKENS = 8

#: Prompt-length bucket edges in tokens (powers of two, the usual context sizes); labels of
#: :func:`prompt_len_bucket`, in order. A bounded label set for the
#: ``prompt_len_bucket`` Prometheus label.
PROMPT_LEN_EDGES = (512, 2048, 8192)
PROMPT_LEN_BUCKETS = ("<512", "512-2k", "2k-8k", ">=8k")


def _check_n(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")


def _ngrams(seq: Sequence[Hashable], n: int) -> list[tuple]:
    _check_n(n)
    seq = list(seq)
    return [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]


def seq_rep_n(seq: Sequence[Hashable], n: int) -> float | None:
    """Repetition of one sequence: ``1 - |unique n-grams| / |n-grams|`` (Welleck et al. 2019).

    Args:
        seq: token ids or words.
        n: n-gram size, >= 1.

    Returns:
        A ratio in [0, 1) (0 = no n-gram repeats), or None when ``len(seq) < n``.
        Example: ten times "the" -> 0.9 for n=1, 8/9 = 0.889 for n=2.

    Raises:
        ValueError: ``n`` is not an integer >= 1.
    """
    grams = _ngrams(seq, n)
    if not grams:
        return None
    return 1.0 - len(set(grams)) / len(grams)


def distinct_n(seq: Sequence[Hashable], n: int) -> float | None:
    """Diversity of one sequence: ``|unique n-grams| / |n-grams|`` (Li et al. 2016; see the
    module note on the denominator). In (0, 1]; None when ``len(seq) < n``.

    Raises:
        ValueError: ``n`` is not an integer >= 1.
    """
    grams = _ngrams(seq, n)
    if not grams:
        return None
    return len(set(grams)) / len(grams)


def perplexity(logprobs: Sequence[float | None]) -> tuple[float | None, int]:
    """Perplexity of generated tokens from their chosen-token logprobs (natural log).

    Rule for non-finite values (field case F18; sglang #4097):
    - ``+-inf`` (e.g. an underflowed probability): excluded from the mean and counted;
      the perplexity is ``exp(-mean)`` of the finite values.
    - ``NaN`` anywhere: the model's numbers are broken for this request (NaN spreads through
      the hidden state, so the "finite" neighbours cannot be trusted either): perplexity is
      None, i.e. the request is excluded from aggregates, and every non-finite value is
      counted.
    - ``None`` entries (no logprob) are treated as NaN.

    Args:
        logprobs: chosen-token logprobs, each <= 0 when valid.

    Returns:
        ``(perplexity or None, number of non-finite values)``. None also when there is no
        finite value (empty input gives ``(None, 0)``).
        Example: [-0.3755025565624237, 0.0, 0.0] -> (exp(0.3755025565624237 / 3) = 1.1333, 0);
        [-0.2, NaN, -0.1] -> (None, 1).
    """
    finite: list[float] = []
    nonfinite = 0
    has_nan = False
    for value in logprobs:
        x = float("nan") if value is None else float(value)
        if math.isfinite(x):
            finite.append(x)
        else:
            nonfinite += 1
            has_nan = has_nan or math.isnan(x)
    if has_nan or not finite:
        return None, nonfinite
    return math.exp(-math.fsum(finite) / len(finite)), nonfinite


def is_degenerate(seq: Sequence[Hashable], n: int = DEGENERATE_NGRAM,
                  threshold: float = DEGENERATE_THRESHOLD,
                  min_tokens: int = DEGENERATE_MIN_TOKENS) -> bool:
    """Whether an output is degenerate repetition: ``seq_rep_n(seq, 4) >= 0.5`` on at least
    8 tokens.

    Why these numbers: Welleck et al. 2019 (table 2) report seq-rep-4 of about 0.006 for
    human text and 0.44 for greedy GPT-2 continuations, so 0.5 means more than half of all
    4-grams are copies, which only a loop produces. A repeated 4-gram needs real repetition,
    unlike a repeated unigram ("the", ","), so the rule does not fire on short, normal text.
    The 8-token minimum (5 four-grams) keeps one accidental repeat in a tiny output from
    deciding. Field case F19: "the" x 10 has seq-rep-4 = 6/7 = 0.857 -> degenerate;
    "Paris is the capital of France." has 0.0 -> not degenerate. F20's long-context outputs
    (repetition 0.85-0.91) are degenerate, the short-context ones (0.04-0.06) are not.

    Args:
        seq: token ids or words.
        n, threshold, min_tokens: the rule's parameters (defaults above).

    Returns:
        True when degenerate; False otherwise, including outputs shorter than ``min_tokens``.

    Raises:
        ValueError: ``n`` < 1, ``threshold`` outside [0, 1] or ``min_tokens`` < 0.
    """
    _check_n(n)
    if isinstance(threshold, bool) or not isinstance(threshold, Real) or not 0 <= threshold <= 1:
        raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, Integral) or min_tokens < 0:
        raise ValueError(f"min_tokens must be an integer >= 0, got {min_tokens!r}")
    if len(seq) < max(min_tokens, n):
        return False
    rep = seq_rep_n(seq, n)
    return rep is not None and rep >= threshold


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


def prompt_len_bucket(n_tokens: int) -> str:
    """Bucket label for a prompt length: "<512", "512-2k", "2k-8k" or ">=8k".

    Edges (``PROMPT_LEN_EDGES``) are 512, 2048 and 8192 tokens; each bucket includes its
    lower edge: 511 -> "<512", 512 -> "512-2k", 8191 -> "2k-8k", 8192 -> ">=8k". Field case
    F20 needs "below 8k" vs "8k and above" apart (4000 -> "2k-8k", 9000 -> ">=8k").

    Raises:
        ValueError: ``n_tokens`` is not an integer >= 0.
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, Integral) or n_tokens < 0:
        raise ValueError(f"n_tokens must be an integer >= 0, got {n_tokens!r}")
    for edge, label in zip(PROMPT_LEN_EDGES, PROMPT_LEN_BUCKETS):
        if n_tokens < edge:
            return label
    return PROMPT_LEN_BUCKETS[-1]


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
    ``json.dumps(..., allow_nan=False)`` succeeds on the result). Field case F18.
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
