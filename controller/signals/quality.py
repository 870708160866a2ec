"""Output-quality signals over the engine's recent request records: repetition, degeneration
diagnosis, perplexity.

seq-rep-n = 1 − distinct n-grams / n-grams (Welleck et al. 2019); perplexity =
exp(−mean logprob), so a valid perplexity is ≥ 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from inferctl.contract.quality import (PROMPT_LEN_BUCKETS, PROMPT_LEN_EDGES, edge_labels, is_degenerate_rep,
                                       prompt_len_bucket)
from inferctl.contract.stats import FINISH_REPETITION
from inferctl.contract.thresholds import THRESHOLDS
from inferctl.controller.signals.validation import validate_nonneg, validate_ratio
from inferctl.controller.signals.values import InvalidSampleCounter, Signal, no_data

#: Prompt-length buckets: the contract's edges and labels (``inferctl.contract.quality``), the
#: same as the engine's ``prompt_len_bucket`` label, so the controller's and the engine's
#: series line up.
PROMPT_LEN_LABELS: tuple[str, ...] = PROMPT_LEN_BUCKETS

#: seq-rep-4 at or above which an output counts as degenerate when the engine did not flag
#: it itself: the one threshold of ``inferctl.contract.thresholds`` (the engine's too).
DEGENERATE_SEQ_REP_THRESHOLD = THRESHOLDS.degenerate_seq_rep_threshold

#: Prompt length from which an output is "long context" for :func:`diagnose_degeneration`.
LONG_CONTEXT_TOKENS = 8192


def _seq_rep(rec: Mapping[str, Any], n: int) -> Any:
    rep = rec.get("seq_rep")
    if isinstance(rep, Mapping):
        return rep.get(str(n), rep.get(n))
    return None


def _is_degenerate(rec: Mapping[str, Any], n: int, threshold: float,
                   counter: InvalidSampleCounter | None) -> bool | None:
    flag = rec.get("degenerate")
    if isinstance(flag, bool):
        return flag
    if rec.get("finish_reason") == FINISH_REPETITION:
        return True
    s = validate_ratio(_seq_rep(rec, n), f"seq_rep_{n}", counter)
    return is_degenerate_rep(s.value, threshold)


@dataclass(frozen=True)
class BucketRate:
    """Degenerate outputs out of the outputs scored in one group; ``rate`` None for 0 of 0."""

    degenerate: int
    total: int

    @property
    def rate(self) -> float | None:
        """degenerate / total in 0..1; None for 0 of 0 (no data)."""
        return None if self.total == 0 else self.degenerate / self.total

    def __str__(self) -> str:
        return f"{self.degenerate}/{self.total}"


@dataclass(frozen=True)
class RepetitionSummary:
    """Repetition over recent outputs: mean seq-rep-n, degenerate rate overall, by
    prompt-length bucket and by precision mode."""

    mean_seq_rep: Signal
    degenerate_rate: Signal
    by_bucket: dict[str, BucketRate]
    by_precision: dict[str, BucketRate]
    n: int


def repetition_summary(recent_requests: Iterable[Mapping[str, Any]], *, n: int = 4,
                       degenerate_threshold: float = DEGENERATE_SEQ_REP_THRESHOLD,
                       edges: Sequence[int] = PROMPT_LEN_EDGES,
                       labels: Sequence[str] | None = None,
                       counter: InvalidSampleCounter | None = None) -> RepetitionSummary:
    """Summarise the engine's ``requests.recent`` records (/stats shape: ``prompt_tokens``,
    ``finish_reason``, ``seq_rep`` {"4": x}, ``degenerate``, ``precision``).

    An output is degenerate when the engine flagged it, when it stopped for repetition, or
    when its seq-rep-n ≥ ``degenerate_threshold``. Invalid seq-rep values (NaN, < 0, > 1)
    are excluded and counted. No record → every value None (docs/field-cases.md F04). F20: edges (8192,) give
    0/3 below 8k and 3/3 at 8k and above.
    """
    if labels is None:
        labels = PROMPT_LEN_LABELS if tuple(edges) == PROMPT_LEN_EDGES else edge_labels(edges)
    by_bucket_counts = {lab: [0, 0] for lab in labels}
    by_prec: dict[str, list[int]] = {}
    reps: list[float] = []
    deg = total = 0
    for rec in recent_requests:
        d = _is_degenerate(rec, n, degenerate_threshold, counter)
        rep = validate_ratio(_seq_rep(rec, n), f"seq_rep_{n}", None)
        if rep.value is not None:
            reps.append(rep.value)
        if d is None:
            continue
        total += 1
        deg += int(d)
        pt = validate_nonneg(rec.get("prompt_tokens"), "prompt_tokens", counter)
        if pt.value is not None:
            cell = by_bucket_counts[prompt_len_bucket(int(pt.value), edges, labels)]
            cell[0] += int(d)
            cell[1] += 1
        prec = rec.get("precision")
        if isinstance(prec, str):
            cell = by_prec.setdefault(prec, [0, 0])
            cell[0] += int(d)
            cell[1] += 1
    name_rep = f"seq_rep_{n}"
    mean = (Signal(name_rep, sum(reps) / len(reps), None, False, {"outputs": len(reps)}) if reps
            else no_data(name_rep, "no scored output in the window"))
    rate = (Signal("degenerate_ratio", deg / total, None, False,
                   {"degenerate": deg, "outputs": total}) if total
            else no_data("degenerate_ratio", "no scored output in the window"))
    return RepetitionSummary(mean, rate,
                             {k: BucketRate(v[0], v[1]) for k, v in by_bucket_counts.items()},
                             {k: BucketRate(v[0], v[1]) for k, v in sorted(by_prec.items())}, n)


@dataclass(frozen=True)
class Diagnosis:
    """Why outputs degenerate: ``cause`` is ``long_context``, ``int8_precision``,
    ``widespread`` (short and long alike: look at sampling settings), ``unclear``, or None
    (no degeneration / no data). ``reason`` in words, ``inputs`` the counts."""

    cause: str | None
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)


def diagnose_degeneration(recent_requests: Iterable[Mapping[str, Any]], *,
                          long_context_tokens: int = LONG_CONTEXT_TOKENS, n: int = 4,
                          degenerate_threshold: float = DEGENERATE_SEQ_REP_THRESHOLD,
                          high_rate: float = 0.5,
                          counter: InvalidSampleCounter | None = None) -> Diagnosis:
    """Name the likely cause of degenerate outputs from recent records.

    Groups outputs by (prompt ≥ ``long_context_tokens``?, precision). Rules, in order:
    ``long_context`` when the long group's rate ≥ ``high_rate``, at least twice the short
    group's, and full-precision long outputs degenerate too (so int8 is not needed to explain
    it; docs/field-cases.md F20: 3/3 long in full precision vs 0/3 short → long context, not int8);
    ``int8_precision`` when int8 outputs' rate ≥ ``high_rate`` and at least twice the
    full-precision rate in the same length group; ``widespread`` when both length groups are
    ≥ ``high_rate``; otherwise ``unclear``.
    """
    records = list(recent_requests)
    groups: dict[tuple[bool, str], list[int]] = {}
    for rec in records:
        d = _is_degenerate(rec, n, degenerate_threshold, counter)
        pt = validate_nonneg(rec.get("prompt_tokens"), "prompt_tokens", counter)
        if d is None or pt.value is None:
            continue
        prec = rec.get("precision") if isinstance(rec.get("precision"), str) else "unknown"
        cell = groups.setdefault((pt.value >= long_context_tokens, prec), [0, 0])
        cell[0] += int(d)
        cell[1] += 1

    def agg(long: bool | None = None, prec: str | None = None) -> BucketRate:
        d = t = 0
        for (lg, p), (dd, tt) in groups.items():
            if (long is None or lg == long) and (prec is None or p == prec):
                d += dd
                t += tt
        return BucketRate(d, t)

    short, long_, all_ = agg(False), agg(True), agg()
    long_full, short_full = agg(True, "full"), agg(False, "full")
    long_int8, short_int8 = agg(True, "int8"), agg(False, "int8")
    inputs = {"long_context_tokens": long_context_tokens,
              "short": str(short), "long": str(long_), "long_full": str(long_full),
              "long_int8": str(long_int8), "short_full": str(short_full),
              "short_int8": str(short_int8)}
    if all_.total == 0:
        return Diagnosis(None, "no scored output", inputs)
    if all_.degenerate == 0:
        return Diagnosis(None, f"no degenerate output (0/{all_.total})", inputs)
    lr, sr = long_.rate, short.rate
    if lr is not None and lr >= high_rate and (sr is None or lr >= 2 * sr) \
            and long_full.rate is not None and long_full.rate >= high_rate:
        return Diagnosis(
            "long_context",
            f"degeneration concentrates in prompts >= {long_context_tokens} tokens "
            f"({long_} degenerate vs {short} below) and occurs in full precision "
            f"({long_full} long outputs in full precision), so the cause is long context, "
            "not the int8 mode", inputs)
    for length, i8, fp in ((False, short_int8, short_full), (True, long_int8, long_full)):
        if i8.rate is not None and i8.rate >= high_rate and fp.rate is not None \
                and i8.rate >= 2 * fp.rate:
            where = f">= {long_context_tokens}" if length else f"< {long_context_tokens}"
            return Diagnosis(
                "int8_precision",
                f"for prompts {where} tokens, int8 outputs degenerate {i8} vs {fp} in full "
                "precision: the int8 mode is the likely cause", inputs)
    if lr is not None and sr is not None and lr >= high_rate and sr >= high_rate:
        return Diagnosis("widespread",
                         f"short ({short}) and long ({long_}) prompts degenerate alike: look at "
                         "sampling settings (temperature, repetition_penalty)", inputs)
    return Diagnosis("unclear", f"{all_.degenerate}/{all_.total} degenerate without a clear "
                                "concentration by length or precision", inputs)


def perplexity_summary(recent_requests: Iterable[Mapping[str, Any]],
                       counter: InvalidSampleCounter | None = None) -> Signal:
    """Mean perplexity of recent outputs' generated tokens. A valid perplexity is finite and
    ≥ 1 (exp of a non-negative mean negative logprob); NaN/inf/< 1 are excluded and counted.
    No valid value → None."""
    name = "perplexity"
    vals: list[float] = []
    for rec in recent_requests:
        ppl = rec.get("perplexity")
        if ppl is None:
            continue
        s = validate_nonneg(ppl, name, counter)
        if s.value is None:
            continue
        if s.value < 1.0:
            if counter is not None:
                counter.record(name, "below_one")
            continue
        vals.append(s.value)
    if not vals:
        return no_data(name, "no valid perplexity in the window")
    return Signal(name, sum(vals) / len(vals), None, False, {"outputs": len(vals)})
