"""Output-quality measures shared by the engine, the controller and the tools (pure functions).

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
- the degenerate rule and the prompt-length buckets: docs/field-cases.md (repetition at long
  context) and docs/design.md.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from numbers import Integral, Real

#: Default degeneration rule (see :func:`is_degenerate`): seq-rep-4 >= 0.5 on >= 8 tokens.
DEGENERATE_NGRAM = 4
DEGENERATE_THRESHOLD = 0.5
DEGENERATE_MIN_TOKENS = 8

#: Prompt-length bucket edges in tokens (powers of two, the usual context sizes) and the
#: labels of :func:`prompt_len_bucket`, in order: a bounded label set for the
#: ``prompt_len_bucket`` Prometheus label of both the engine's and the controller's series.
PROMPT_LEN_EDGES: tuple[int, ...] = (512, 2048, 8192)
PROMPT_LEN_BUCKETS: tuple[str, ...] = ("<512", "512-2k", "2k-8k", ">=8k")


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
    """Perplexity of generated tokens from their chosen-token logprobs (natural log), with
    the count of non-finite values.

    Rule for non-finite values (docs/field-cases.md, NaN logprobs; sglang #4097):
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


def perplexity_value(logprobs: Sequence[float | None]) -> float | None:
    """Just the perplexity of :func:`perplexity` (``None`` when excluded)."""
    return perplexity(logprobs)[0]


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
    deciding. Examples (docs/field-cases.md): "the" x 10 has seq-rep-4 = 6/7 = 0.857 ->
    degenerate; "Paris is the capital of France." has 0.0 -> not degenerate; long-context
    outputs at repetition 0.85-0.91 are degenerate, short-context ones at 0.04-0.06 are not.

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


def is_degenerate_rep(seq_rep: float | None, threshold: float = DEGENERATE_THRESHOLD) -> bool | None:
    """The degenerate rule on an already computed seq-rep-n: ``seq_rep >= threshold``;
    ``None`` (no data) when ``seq_rep`` is ``None``."""
    return None if seq_rep is None else seq_rep >= threshold


def edge_labels(edges: Sequence[int]) -> tuple[str, ...]:
    """Bucket labels for ascending ``edges``: ``<e0``, ``e0-e1``, …, ``>=eN``."""
    out = [f"<{edges[0]}"]
    out += [f"{a}-{b}" for a, b in zip(edges, edges[1:])]
    out.append(f">={edges[-1]}")
    return tuple(out)


def prompt_len_bucket(n_tokens: int, edges: Sequence[int] = PROMPT_LEN_EDGES,
                      labels: Sequence[str] | None = None) -> str:
    """Bucket label for a prompt length; each bucket includes its lower edge.

    With the default edges (512, 2048, 8192): 511 -> "<512", 512 -> "512-2k",
    8191 -> "2k-8k", 8192 -> ">=8k" (docs/field-cases.md needs "below 8k" and "8k and above"
    apart). Other ``edges`` get :func:`edge_labels` unless ``labels`` are given.

    Raises:
        ValueError: ``n_tokens`` is not an integer >= 0, or ``labels`` is not one longer than
            ``edges``.
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, Integral) or n_tokens < 0:
        raise ValueError(f"n_tokens must be an integer >= 0, got {n_tokens!r}")
    if labels is None:
        labels = PROMPT_LEN_BUCKETS if tuple(edges) == PROMPT_LEN_EDGES else edge_labels(edges)
    if len(labels) != len(edges) + 1:
        raise ValueError(f"labels: need {len(edges) + 1} labels for {len(edges)} edges")
    for edge, label in zip(edges, labels):
        if n_tokens < edge:
            return label
    return labels[-1]
