"""Batching signals over a window of counter deltas: padding ratio, effective batch size.

padding ratio = padded / (real + padded) tokens; effective batch size = sequences / steps;
both over a window of counter deltas, with Prometheus ``rate()`` counter-reset semantics:
"Breaks in monotonicity (such as counter resets due to target restarts) are automatically
adjusted for" (https://prometheus.io/docs/prometheus/latest/querying/functions/#rate).
"""

from __future__ import annotations

from typing import Any

from inferctl.controller.signals.validation import plain_number, validate_nonneg
from inferctl.controller.signals.values import InvalidSampleCounter, Signal, first_missing, no_data
from inferctl.controller.types import EngineSnapshot


#: The reason counter_delta gives when both samples are None, as first_missing carries it.
_NONE_REASON = "current sample: %s: no data"


def _delta(p: float, c: float) -> float:
    """:func:`counter_delta`'s value for two valid samples (a reset: the new value)."""
    return c if c < p else c - p


def counter_delta(prev: Any, curr: Any, name: str = "counter",
                  counter: InvalidSampleCounter | None = None) -> Signal:
    """Increase of a monotonic counter between two samples.

    A counter that went down was reset (process restart): the new value is the increase
    since the reset, as Prometheus ``rate()``/``increase()`` do ("breaks in monotonicity
    ... are automatically adjusted for"). ``inputs["reset"]`` says whether that happened.
    None when either sample is missing or invalid.
    """
    p = validate_nonneg(prev, name, counter)
    c = validate_nonneg(curr, name, counter)
    inputs = {"prev": prev, "curr": curr}
    if c.value is None:
        return Signal(name, None, f"current sample: {c.reason}", c.invalid, inputs)
    if p.value is None:
        return Signal(name, None, f"previous sample: {p.reason}", p.invalid, inputs)
    if c.value < p.value:
        return Signal(name, c.value, f"counter reset ({p.value:g} -> {c.value:g}); "
                                     "the new value is the increase", False,
                      {**inputs, "reset": True})
    return Signal(name, c.value - p.value, None, False, {**inputs, "reset": False})


def padding_ratio(real_delta: Any, padded_delta: Any,
                  counter: InvalidSampleCounter | None = None) -> Signal:
    """padded / (real + padded) tokens over a window (counter deltas). 0 tokens → None
    (no data, docs/field-cases.md F04, F05), never 0."""
    name = "padding_ratio"
    r = validate_nonneg(real_delta, name, counter)
    p = validate_nonneg(padded_delta, name, counter)
    inputs = {"real_tokens": real_delta, "padded_tokens": padded_delta}
    if (missing := first_missing(name, inputs, r, p)) is not None:
        return missing
    total = r.value + p.value
    if total == 0:
        return no_data(name, "no tokens in the window", **inputs)
    return Signal(name, p.value / total, None, False, inputs)


def effective_batch_size(seq_delta: Any, steps_delta: Any,
                         counter: InvalidSampleCounter | None = None) -> Signal:
    """Mean sequences per engine step over a window = Δ step_sequences / Δ steps; 0 steps →
    None."""
    name = "effective_batch_size"
    s = validate_nonneg(seq_delta, name, counter)
    n = validate_nonneg(steps_delta, name, counter)
    inputs = {"step_sequences": seq_delta, "steps": steps_delta}
    if (missing := first_missing(name, inputs, s, n)) is not None:
        return missing
    if n.value == 0:
        return no_data(name, "no engine step in the window", **inputs)
    return Signal(name, s.value / n.value, None, False, inputs)


def batch_window(prev: EngineSnapshot | None, curr: EngineSnapshot,
                 counter: InvalidSampleCounter | None = None) -> dict[str, Signal]:
    """Padding ratio and effective batch size between two polls of one engine, from its
    cumulative counters, with counter resets handled. Returns
    ``{"padding_ratio": Signal, "effective_batch_size": Signal}``."""
    if prev is None:
        why = "no previous poll to form a window"
        return {"padding_ratio": no_data("padding_ratio", why),
                "effective_batch_size": no_data("effective_batch_size", why)}
    pairs = ((prev.real_tokens_total, curr.real_tokens_total), (prev.padded_tokens_total, curr.padded_tokens_total),
             (prev.step_sequences_total, curr.step_sequences_total), (prev.steps_total, curr.steps_total))
    if all(plain_number(p) and plain_number(c) for p, c in pairs):
        # every counter a plain finite number >= 0 (every poll of a healthy engine): the deltas
        # of counter_delta (a reset: the new value) without its four intermediate Signals
        real_d, pad_d, seqs_d, steps_d = (_delta(float(p), float(c)) for p, c in pairs)
        return {"padding_ratio": padding_ratio(real_d, pad_d, counter),
                "effective_batch_size": effective_batch_size(seqs_d, steps_d, counter)}
    if all(p is None and c is None for p, c in pairs):
        # an engine that reports none of them (vLLM, TGI, llama.cpp): the general path's no data
        return {"padding_ratio": Signal("padding_ratio", None, _NONE_REASON % "real_tokens_total"),
                "effective_batch_size": Signal("effective_batch_size", None, _NONE_REASON % "step_sequences_total")}
    real = counter_delta(prev.real_tokens_total, curr.real_tokens_total, "real_tokens_total", counter)
    pad = counter_delta(prev.padded_tokens_total, curr.padded_tokens_total, "padded_tokens_total",
                        counter)
    seqs = counter_delta(prev.step_sequences_total, curr.step_sequences_total,
                         "step_sequences_total", counter)
    steps = counter_delta(prev.steps_total, curr.steps_total, "steps_total", counter)
    return {"padding_ratio": first_missing("padding_ratio", {}, real, pad)
            or padding_ratio(real.value, pad.value, counter),
            "effective_batch_size": first_missing("effective_batch_size", {}, seqs, steps)
            or effective_batch_size(seqs.value, steps.value, counter)}


def batch_window_values(prev: EngineSnapshot | None, curr: EngineSnapshot,
                        counter: InvalidSampleCounter | None = None) -> tuple[float | None, float | None]:
    """``(padding ratio, effective batch size)``: the values of :func:`batch_window`'s two
    Signals (None: no data or invalid, counted in ``counter`` exactly as :func:`batch_window`
    counts). The exporter's per-poll call: when every counter of both polls is plain (a healthy
    bundled engine) or none is reported (vLLM, TGI, llama.cpp) the values are computed here
    without a Signal (the same floats); any other case is :func:`batch_window` itself."""
    if prev is not None:
        p0, c0 = prev.real_tokens_total, curr.real_tokens_total
        p1, c1 = prev.padded_tokens_total, curr.padded_tokens_total
        p2, c2 = prev.step_sequences_total, curr.step_sequences_total
        p3, c3 = prev.steps_total, curr.steps_total
        if all(map(plain_number, (p0, c0, p1, c1, p2, c2, p3, c3))):
            real_d, pad_d = _delta(float(p0), float(c0)), _delta(float(p1), float(c1))
            seqs_d, steps_d = _delta(float(p2), float(c2)), _delta(float(p3), float(c3))
            total = real_d + pad_d
            return (pad_d / total if total != 0 else None), (seqs_d / steps_d if steps_d != 0 else None)
        if (p0 is None and c0 is None and p1 is None and c1 is None and p2 is None and c2 is None
                and p3 is None and c3 is None):
            return None, None
    window = batch_window(prev, curr, counter)
    return window["padding_ratio"].value, window["effective_batch_size"].value
