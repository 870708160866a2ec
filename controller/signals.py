"""Signals: pure functions of snapshots (no I/O, no clock, no state but what is passed in).

Every function answers with a :class:`Signal` (or a small value object) whose ``value`` is
``None`` when there is no data or the input was invalid, with the ``reason`` in words — never
0 for "missing". Rejected samples are counted in an :class:`InvalidSampleCounter` that the
caller owns and passes in explicitly (the controller exports it as
``inferctl_invalid_samples_total{signal}``).

Formulas and their sources:

* allocator fragmentation = (reserved − allocated) / reserved bytes, the PyTorch caching
  allocator's "reserved but unallocated" share (``torch.cuda.memory_reserved`` /
  ``memory_allocated``); from an OOM message, U / (A + U). This is *not* free memory:
  ``100 − used/total·100`` (the original design notes' query) is :func:`free_memory_ratio`.
* KV waste = 1 − tokens stored / (blocks used × block size) (internal fragmentation of paged
  KV blocks, vLLM/PagedAttention, Kwon et al. 2023).
* padding ratio = padded / (real + padded) tokens; effective batch size = sequences / steps;
  both over a window of counter deltas, with Prometheus ``rate()`` counter-reset semantics:
  "Breaks in monotonicity (such as counter resets due to target restarts) are automatically
  adjusted for" (https://prometheus.io/docs/prometheus/latest/querying/functions/#rate).
* quantiles from cumulative histogram buckets exactly as PromQL ``histogram_quantile``
  (https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile,
  ``promql/quantile.go: BucketQuantile``), except that a quantile in the +Inf bucket is
  reported as "≥ bound" (``Quantile(at_least=True)``) instead of silently as the bound, and
  "no observations" is ``None`` instead of NaN.
* seq-rep-n = 1 − distinct n-grams / n-grams (Welleck et al. 2019); perplexity =
  exp(−mean logprob), so a valid perplexity is ≥ 1.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

from inferctl.controller.gpu.base import MEMORY_ROUNDING_TOLERANCE_BYTES
from inferctl.controller.types import EngineSnapshot

MIB = 1 << 20
GIB = 1 << 30

#: Prompt-length buckets, the same edges and labels as the engine's ``prompt_len_bucket``
#: label (engine/quality.py), so the controller's and the engine's series line up.
PROMPT_LEN_EDGES: tuple[int, ...] = (512, 2048, 8192)
PROMPT_LEN_LABELS: tuple[str, ...] = ("<512", "512-2k", "2k-8k", ">=8k")

#: seq-rep-4 at or above which an output counts as degenerate when the engine did not flag
#: it itself (the engine's default ``degenerate_seq_rep_threshold``).
DEGENERATE_SEQ_REP_THRESHOLD = 0.5

#: Prompt length from which an output is "long context" for :func:`diagnose_degeneration`.
LONG_CONTEXT_TOKENS = 8192


# --------------------------------------------------------------------------- value objects
@dataclass(frozen=True)
class Signal:
    """One signal value.

    ``value`` is a float, or ``None`` for no data. ``invalid`` is True when the input was
    present but rejected (negative, NaN, ratio > 1, inconsistent); ``reason`` says why the
    value is None, or notes something about a valid value (e.g. a counter reset).
    ``inputs`` are the numbers it was computed from, for events.
    """

    name: str
    value: float | None
    reason: str | None = None
    invalid: bool = False
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when there is a value."""
        return self.value is not None


class InvalidSampleCounter:
    """Counts rejected samples by ``(signal, reason code)``. One instance per controller,
    passed explicitly to the signal functions; never a global."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def record(self, signal: str, reason: str) -> None:
        """Count one rejected sample of ``signal`` for ``reason`` (a short code such as
        ``negative``, ``nan``, ``above_one``)."""
        key = (str(signal), str(reason))
        self._counts[key] = self._counts.get(key, 0) + 1

    def count(self, signal: str | None = None, reason: str | None = None) -> int:
        """Total rejected samples, optionally for one signal and/or one reason."""
        return sum(n for (s, r), n in self._counts.items()
                   if (signal is None or s == signal) and (reason is None or r == reason))

    def by_signal(self) -> dict[str, int]:
        """``{signal: count}`` — the label set of ``inferctl_invalid_samples_total``."""
        out: dict[str, int] = {}
        for (s, _), n in self._counts.items():
            out[s] = out.get(s, 0) + n
        return out

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{signal: {reason: count}}`` for /status."""
        out: dict[str, dict[str, int]] = {}
        for (s, r), n in sorted(self._counts.items()):
            out.setdefault(s, {})[r] = n
        return out


@dataclass(frozen=True)
class FleetSignal:
    """A fleet-wide value and each member's own value (members keyed by engine name)."""

    fleet: Signal
    members: dict[str, Signal]


def _no_data(name: str, reason: str, **inputs: Any) -> Signal:
    return Signal(name, None, reason, False, dict(inputs))


def _invalid(name: str, code: str, reason: str, counter: InvalidSampleCounter | None,
             **inputs: Any) -> Signal:
    if counter is not None:
        counter.record(name, code)
    return Signal(name, None, reason, True, dict(inputs))


def _first_missing(name: str, inputs: dict[str, Any], *checked: Signal) -> Signal | None:
    """A value-less ``Signal`` named ``name`` that carries the reason and ``invalid`` flag of
    the first of ``checked`` without a value (the inputs already validated), or None when
    every one has a value."""
    for s in checked:
        if s.value is None:
            return Signal(name, None, s.reason, s.invalid, inputs)
    return None


# --------------------------------------------------------------------------- validation
def _check_number(x: Any, name: str, counter: InvalidSampleCounter | None,
                  upper: float | None) -> Signal:
    if x is None:
        return _no_data(name, f"{name}: no data", raw=None)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return _invalid(name, "not_a_number", f"{name}: {str(x)[:80]!r} is not a number", counter,
                        raw=repr(x)[:80])
    try:
        v = float(x)
    except OverflowError:   # an integer beyond float range (e.g. a 400-digit JSON number)
        return _invalid(name, "inf", f"{name}: an integer of {len(str(abs(x)))} digits rejected"
                        " (not finite)", counter, raw=None)
    if math.isnan(v):
        return _invalid(name, "nan", f"{name}: NaN rejected", counter, raw=v)
    if math.isinf(v):
        return _invalid(name, "inf", f"{name}: {v} rejected (not finite)", counter, raw=v)
    if v < 0:
        return _invalid(name, "negative", f"{name}: {v} rejected (negative, must be >= 0)",
                        counter, raw=v)
    if upper is not None and v > upper:
        return _invalid(name, "above_one", f"{name}: {v} rejected (a ratio must be <= {upper:g})",
                        counter, raw=v)
    return Signal(name, v, None, False, {"raw": v})


def validate_ratio(x: Any, name: str = "ratio",
                   counter: InvalidSampleCounter | None = None) -> Signal:
    """Accept ``x`` as a ratio in [0, 1].

    Returns ``Signal(value=float)`` when valid; ``value=None`` with ``invalid=True`` and a
    counted reason (``negative``, ``nan``, ``inf``, ``above_one``, ``not_a_number``) when
    rejected; ``value=None, invalid=False`` when ``x`` is None (no data, not counted).
    F01: ``-0.3875395987328405`` is rejected as ``negative``, never shown as −38.75 %.
    """
    return _check_number(x, name, counter, 1.0)


def validate_nonneg(x: Any, name: str = "value",
                    counter: InvalidSampleCounter | None = None) -> Signal:
    """Accept ``x`` as a finite number ≥ 0 (bytes, counts, seconds); like :func:`validate_ratio`
    without the upper bound."""
    return _check_number(x, name, counter, None)


def fleet_mean(samples: Mapping[str, Any], name: str = "ratio",
               counter: InvalidSampleCounter | None = None, *, ratio: bool = True) -> FleetSignal:
    """Mean over the members' *valid* samples (F01: 0.41 and −0.3875 → 0.41).

    ``samples`` maps member name → raw value. Invalid samples are counted and excluded;
    with no valid sample the fleet value is None.
    """
    check = validate_ratio if ratio else validate_nonneg
    members = {k: check(v, name, counter) for k, v in samples.items()}
    valid = {k: s.value for k, s in members.items() if s.value is not None}
    excluded = sorted(k for k, s in members.items() if s.value is None)
    if not valid:
        return FleetSignal(_no_data(name, f"{name}: no valid sample in the fleet",
                                    excluded=excluded), members)
    mean = sum(valid.values()) / len(valid)
    return FleetSignal(Signal(name, mean, None, False, {"valid": valid, "excluded": excluded}),
                       members)


def ratio(numerator: Any, denominator: Any, name: str = "ratio",
          counter: InvalidSampleCounter | None = None) -> Signal:
    """``numerator / denominator`` for a ratio of counts; denominator 0 → None ("undefined",
    F05), numerator > denominator → invalid (counted)."""
    num = validate_nonneg(numerator, f"{name}.numerator", counter)
    den = validate_nonneg(denominator, f"{name}.denominator", counter)
    raw = {"numerator": numerator, "denominator": denominator}
    if (missing := _first_missing(name, raw, num, den)) is not None:
        return missing
    if den.value == 0:
        return _no_data(name, f"{name}: undefined (0 of 0)", numerator=num.value, denominator=0.0)
    if num.value > den.value:
        return _invalid(name, "above_one",
                        f"{name}: {num.value:g} of {den.value:g} rejected (numerator > denominator)",
                        counter, numerator=num.value, denominator=den.value)
    return Signal(name, num.value / den.value, None, False,
                  {"numerator": num.value, "denominator": den.value})


def fleet_ratio(parts: Mapping[str, tuple[Any, Any]], name: str = "ratio",
                counter: InvalidSampleCounter | None = None) -> FleetSignal:
    """Aggregate, then divide (F05): fleet = Σ numerators / Σ denominators over members whose
    own pair is valid; each member's own ratio is reported beside it (0 of 0 → None).

    ``parts`` maps member → (numerator, denominator). Engine A 50 of 100 and B 0 of 0 give
    fleet 0.50 and B None — not the mean of 0.5 and 0.
    """
    members = {k: ratio(n, d, name, counter) for k, (n, d) in parts.items()}
    num_sum = 0.0
    den_sum = 0.0
    used: list[str] = []
    for k, s in members.items():
        if s.invalid:
            continue
        n, d = s.inputs.get("numerator"), s.inputs.get("denominator")
        if isinstance(n, float) and isinstance(d, float):
            num_sum += n
            den_sum += d
            used.append(k)
    if den_sum == 0:
        return FleetSignal(_no_data(name, f"{name}: undefined for the fleet (0 of 0)",
                                    members=sorted(used)), members)
    return FleetSignal(Signal(name, num_sum / den_sum, None, False,
                              {"numerator": num_sum, "denominator": den_sum,
                               "members": sorted(used)}), members)


# --------------------------------------------------------------------------- memory
def fragmentation_ratio(reserved_bytes: Any, allocated_bytes: Any,
                        counter: InvalidSampleCounter | None = None) -> Signal:
    """Allocator fragmentation = (reserved − allocated) / reserved, in 0..1.

    ``reserved_bytes`` is what the caching allocator holds from the device,
    ``allocated_bytes`` what tensors use of it (PyTorch ``memory_reserved`` /
    ``memory_allocated``). None when reserved is missing or 0; invalid (counted) when
    negative/NaN or allocated > reserved.
    """
    name = "fragmentation_ratio"
    r = validate_nonneg(reserved_bytes, name, counter)
    a = validate_nonneg(allocated_bytes, name, counter)
    inputs = {"reserved_bytes": reserved_bytes, "allocated_bytes": allocated_bytes}
    if r.value is None or a.value is None:
        bad = r if r.value is None else a
        which = "reserved_bytes" if bad is r else "allocated_bytes"
        return Signal(name, None, f"{which}: {bad.reason}", bad.invalid, inputs)
    if r.value == 0:
        return _no_data(name, "nothing reserved (reserved_bytes is 0)", **inputs)
    if a.value > r.value:
        return _invalid(name, "inconsistent",
                        f"allocated {a.value:.0f} B > reserved {r.value:.0f} B", counter, **inputs)
    frag = (r.value - a.value) / r.value
    inputs["unallocated_bytes"] = r.value - a.value
    return Signal(name, frag, None, False, inputs)


def fragmentation_from_oom(allocated_bytes: Any, reserved_unallocated_bytes: Any,
                           counter: InvalidSampleCounter | None = None) -> Signal:
    """Fragmentation from an OOM record: U / (A + U), where A is "allocated by PyTorch" and U
    "reserved by PyTorch but unallocated" (the same formula as :func:`fragmentation_ratio`
    with reserved = A + U). F13: (a) A 13.73 GiB, U 736.86 MiB → 4.98 %."""
    a = validate_nonneg(allocated_bytes, "fragmentation_ratio", counter)
    u = validate_nonneg(reserved_unallocated_bytes, "fragmentation_ratio", counter)
    raw = {"allocated_bytes": allocated_bytes,
           "reserved_unallocated_bytes": reserved_unallocated_bytes}
    if (missing := _first_missing("fragmentation_ratio", raw, a, u)) is not None:
        return missing
    return fragmentation_ratio(a.value + u.value, a.value, counter)


def free_memory_ratio(used_bytes: Any, total_bytes: Any,
                      counter: InvalidSampleCounter | None = None) -> Signal:
    """Free memory = 1 − used / total: what the original design notes called
    "fragmentation" (``100 − used/total·100``). It measures head-room, not fragmentation —
    see docs/signals.md. None if total is missing/0; invalid if used > total."""
    name = "free_memory_ratio"
    u = validate_nonneg(used_bytes, name, counter)
    t = validate_nonneg(total_bytes, name, counter)
    inputs = {"used_bytes": used_bytes, "total_bytes": total_bytes}
    if (missing := _first_missing(name, inputs, u, t)) is not None:
        return missing
    if t.value == 0:
        return _no_data(name, "total_bytes is 0", **inputs)
    if u.value > t.value:
        return _invalid(name, "inconsistent", f"used {u.value:.0f} B > total {t.value:.0f} B",
                        counter, **inputs)
    return Signal(name, 1.0 - u.value / t.value, None, False, inputs)


def memory_used_ratio(used_bytes: Any, total_bytes: Any, reserved_bytes: Any = None,
                      *, count_reserved: bool = False, free_bytes: Any = None,
                      tolerance_bytes: int = MEMORY_ROUNDING_TOLERANCE_BYTES,
                      counter: InvalidSampleCounter | None = None) -> Signal:
    """used / total, by default NVML v2 "used" (allocations only); with
    ``count_reserved=True`` the driver-reserved bytes are added (F11: RTX 3060, 116 MiB used,
    368 MiB reserved of 12288 MiB → 0.94 %, or 3.94 % counting reserved).

    nvidia-smi and DCGM round each MiB value on its own, so the parts may add up to a few MiB
    more than the total (F11: used 116 + free 11806 + reserved 368 = 12290 of 12288 MiB).
    Differences up to ``tolerance_bytes`` (``controller.gpu.base.MEMORY_ROUNDING_TOLERANCE_BYTES``,
    4 MiB) are rounding, not invalid: used (+ reserved) over total by at most that much reads
    1.0, and with ``free_bytes`` given, ``used + free + reserved`` must equal total within it
    (``inputs["accounting_gap_bytes"]`` carries the difference). Beyond it the sample is
    inconsistent: ``None``, counted as invalid."""
    name = "memory_used_ratio"
    u = validate_nonneg(used_bytes, name, counter)
    t = validate_nonneg(total_bytes, name, counter)
    if u.value is None or t.value is None or t.value == 0:
        bad = u if u.value is None else t
        return Signal(name, None, bad.reason or "total_bytes is 0", bad.invalid,
                      {"used_bytes": used_bytes, "total_bytes": total_bytes})
    used = u.value
    reserved = None
    if count_reserved or (free_bytes is not None and reserved_bytes is not None):
        r = validate_nonneg(reserved_bytes, name, counter)
        if r.value is None:
            return Signal(name, None, f"reserved_bytes: {r.reason}", r.invalid,
                          {"reserved_bytes": reserved_bytes})
        reserved = r.value
    if count_reserved:
        used += reserved
    inputs: dict[str, Any] = {"used_bytes": used, "total_bytes": t.value,
                              "count_reserved": count_reserved}
    if free_bytes is not None:
        f = validate_nonneg(free_bytes, name, counter)
        if f.value is None:
            return Signal(name, None, f"free_bytes: {f.reason}", f.invalid,
                          {"free_bytes": free_bytes})
        gap = u.value + f.value + (reserved or 0.0) - t.value
        if abs(gap) > tolerance_bytes:
            return _invalid(name, "inconsistent",
                            f"used + free + reserved is {gap:+.0f} B off total {t.value:.0f} B "
                            f"(more than the {tolerance_bytes} B of MiB rounding)", counter,
                            used_bytes=used_bytes, free_bytes=free_bytes,
                            reserved_bytes=reserved_bytes, total_bytes=t.value)
        inputs["accounting_gap_bytes"] = gap
    if used > t.value + tolerance_bytes:
        return _invalid(name, "inconsistent", f"used {used:.0f} B > total {t.value:.0f} B "
                        f"(more than the {tolerance_bytes} B of MiB rounding)",
                        counter, used_bytes=used, total_bytes=t.value)
    return Signal(name, min(used / t.value, 1.0), None, False, inputs)


def kv_waste_ratio(tokens_stored: Any, blocks_used: Any, block_size: Any,
                   counter: InvalidSampleCounter | None = None) -> Signal:
    """KV internal waste = 1 − tokens stored / (blocks used × block size). None with no block
    in use; invalid when more tokens are stored than the blocks hold."""
    name = "kv_waste_ratio"
    vals = [validate_nonneg(x, name, counter) for x in (tokens_stored, blocks_used, block_size)]
    inputs = {"tokens_stored": tokens_stored, "blocks_used": blocks_used, "block_size": block_size}
    if (missing := _first_missing(name, inputs, *vals)) is not None:
        return missing
    tokens, blocks, bs = (v.value for v in vals)
    capacity = blocks * bs
    if capacity == 0:
        return _no_data(name, "no KV block in use", **inputs)
    if tokens > capacity:
        return _invalid(name, "inconsistent",
                        f"{tokens:g} tokens stored > {capacity:g} slots in {blocks:g} blocks",
                        counter, **inputs)
    return Signal(name, 1.0 - tokens / capacity, None, False, inputs)


# --------------------------------------------------------------------------- counters over a window
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
    (no data, F04/F05), never 0."""
    name = "padding_ratio"
    r = validate_nonneg(real_delta, name, counter)
    p = validate_nonneg(padded_delta, name, counter)
    inputs = {"real_tokens": real_delta, "padded_tokens": padded_delta}
    if (missing := _first_missing(name, inputs, r, p)) is not None:
        return missing
    total = r.value + p.value
    if total == 0:
        return _no_data(name, "no tokens in the window", **inputs)
    return Signal(name, p.value / total, None, False, inputs)


def effective_batch_size(seq_delta: Any, steps_delta: Any,
                         counter: InvalidSampleCounter | None = None) -> Signal:
    """Mean sequences per engine step over a window = Δ step_sequences / Δ steps; 0 steps →
    None."""
    name = "effective_batch_size"
    s = validate_nonneg(seq_delta, name, counter)
    n = validate_nonneg(steps_delta, name, counter)
    inputs = {"step_sequences": seq_delta, "steps": steps_delta}
    if (missing := _first_missing(name, inputs, s, n)) is not None:
        return missing
    if n.value == 0:
        return _no_data(name, "no engine step in the window", **inputs)
    return Signal(name, s.value / n.value, None, False, inputs)


def batch_window(prev: EngineSnapshot | None, curr: EngineSnapshot,
                 counter: InvalidSampleCounter | None = None) -> dict[str, Signal]:
    """Padding ratio and effective batch size between two polls of one engine, from its
    cumulative counters, with counter resets handled. Returns
    ``{"padding_ratio": Signal, "effective_batch_size": Signal}``."""
    if prev is None:
        why = "no previous poll to form a window"
        return {"padding_ratio": _no_data("padding_ratio", why),
                "effective_batch_size": _no_data("effective_batch_size", why)}
    real = counter_delta(prev.real_tokens_total, curr.real_tokens_total, "real_tokens_total", counter)
    pad = counter_delta(prev.padded_tokens_total, curr.padded_tokens_total, "padded_tokens_total",
                        counter)
    seqs = counter_delta(prev.step_sequences_total, curr.step_sequences_total,
                         "step_sequences_total", counter)
    steps = counter_delta(prev.steps_total, curr.steps_total, "steps_total", counter)
    return {"padding_ratio": _first_missing("padding_ratio", {}, real, pad)
            or padding_ratio(real.value, pad.value, counter),
            "effective_batch_size": _first_missing("effective_batch_size", {}, seqs, steps)
            or effective_batch_size(seqs.value, steps.value, counter)}


# --------------------------------------------------------------------------- histograms
@dataclass(frozen=True)
class Quantile:
    """A quantile estimate in the histogram's unit (seconds for latency).

    ``at_least`` is True when the quantile fell into the +Inf bucket: the true value is only
    known to be ≥ ``value`` (the highest finite bound), and is shown as "≥ 10".
    """

    value: float
    at_least: bool = False

    def exceeds(self, threshold: float) -> bool:
        """Whether the quantile counts as over ``threshold``. A "≥ bound" quantile always
        counts as over: nothing proves it is below (policy, docs/signals.md)."""
        return self.at_least or self.value > threshold

    def __str__(self) -> str:
        return f"≥ {self.value:g}" if self.at_least else f"{self.value:g}"


@dataclass(frozen=True)
class Histogram:
    """A cumulative (Prometheus classic) histogram: ``buckets`` sorted by upper bound ``le``,
    the last one +Inf, counts cumulative; ``sum`` and ``count`` as exposed (either may be None).
    ``notes`` says how it was built (e.g. a counter reset in a window delta)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float | None = None
    count: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def observations(self) -> float:
        """The +Inf bucket's count."""
        return self.buckets[-1][1]


class InvalidHistogram(ValueError):
    """A histogram document that cannot be read; the message names the field."""


def _le(x: Any) -> float:
    if isinstance(x, str):
        s = x.strip().lower()
        if s in ("+inf", "inf", "+infinity", "infinity"):
            return math.inf
        return float(s)
    return float(x)


def to_histogram(doc: Any) -> Histogram:
    """Read ``{"buckets": [(le, cumulative count), ...], "sum": s, "count": c}`` (``le`` a
    number or a string like ``"0.001"``/``"+Inf"``), or a :class:`Histogram`.

    Buckets with the same bound are merged (PromQL ``coalesceBuckets``). Without a +Inf
    bucket, ``count`` stands in for it. Raises :class:`InvalidHistogram` naming the field for
    a missing/empty ``buckets``, a NaN or negative count, a NaN bound, or no +Inf and no count.
    """
    if isinstance(doc, Histogram):
        return doc
    if not isinstance(doc, Mapping):
        raise InvalidHistogram(f"histogram: expected a mapping, got {type(doc).__name__}")
    raw = doc.get("buckets")
    if not raw:
        raise InvalidHistogram("histogram.buckets: missing or empty")
    merged: dict[float, float] = {}
    for i, item in enumerate(raw):
        try:
            le, cnt = item
            le_f, cnt_f = _le(le), float(cnt)
        except (TypeError, ValueError) as exc:
            raise InvalidHistogram(f"histogram.buckets[{i}]: {item!r} is not (le, count)") from exc
        if math.isnan(le_f):
            raise InvalidHistogram(f"histogram.buckets[{i}].le: NaN")
        if math.isnan(cnt_f) or math.isinf(cnt_f) or cnt_f < 0:
            raise InvalidHistogram(f"histogram.buckets[{i}].count: {cnt_f} (must be finite, >= 0)")
        merged[le_f] = merged.get(le_f, 0.0) + cnt_f
    count = doc.get("count")
    hsum = doc.get("sum")
    count_f = None if count is None else float(count)
    sum_f = None if hsum is None else float(hsum)
    if count_f is not None and (math.isnan(count_f) or count_f < 0 or math.isinf(count_f)):
        raise InvalidHistogram(f"histogram.count: {count_f} (must be finite, >= 0)")
    if sum_f is not None and (math.isnan(sum_f) or math.isinf(sum_f)):
        raise InvalidHistogram(f"histogram.sum: {sum_f} (must be finite)")
    if math.inf not in merged:
        if count_f is None:
            raise InvalidHistogram("histogram.buckets: no +Inf bucket and no count")
        merged[math.inf] = count_f
    buckets = tuple(sorted(merged.items()))
    return Histogram(buckets, sum_f, count_f)


def _monotonic(buckets: Sequence[tuple[float, float]]) -> tuple[list[tuple[float, float]], bool]:
    """PromQL ``ensureMonotonic``: a cumulative count lower than the one before is raised to
    it. Returns the fixed buckets and whether anything was fixed."""
    out: list[tuple[float, float]] = []
    running = 0.0
    forced = False
    for le, cnt in buckets:
        if cnt < running:
            forced = True
            cnt = running
        running = cnt
        out.append((le, cnt))
    return out, forced


def histogram_quantile(q: float, buckets: Any) -> Quantile | None:
    """The ``q``-quantile of a cumulative histogram, as PromQL ``histogram_quantile``.

    ``buckets`` is a histogram document (see :func:`to_histogram`), a :class:`Histogram`, or
    a sequence of ``(le, cumulative count)``. Linear interpolation inside the bucket where
    rank = q × observations falls; the lowest bucket interpolates from 0 (or returns its
    bound if that is ≤ 0). Differences from Prometheus: a quantile in the +Inf bucket gives
    ``Quantile(second-highest bound, at_least=True)`` ("≥ bound"); no observations, a
    missing +Inf bucket or fewer than 2 buckets give ``None`` (Prometheus: NaN).
    Raises ``ValueError`` for q outside [0, 1] or NaN (a caller's bug, not data).
    """
    if q is None or isinstance(q, bool) or not isinstance(q, (int, float)) or math.isnan(q) \
            or not 0.0 <= q <= 1.0:
        raise ValueError(f"q: {q!r} must be a number in [0, 1]")
    try:
        if isinstance(buckets, (Mapping, Histogram)):
            hist = to_histogram(buckets)
        else:
            hist = to_histogram({"buckets": list(buckets)})
    except InvalidHistogram:
        return None
    bks, _ = _monotonic(hist.buckets)
    if len(bks) < 2 or not math.isinf(bks[-1][0]):
        return None
    observations = bks[-1][1]
    if observations == 0:
        return None
    rank = q * observations
    b = next((i for i in range(len(bks) - 1) if bks[i][1] >= rank), len(bks) - 1)
    if b == len(bks) - 1:
        return Quantile(bks[-2][0], at_least=True)
    if b == 0 and bks[0][0] <= 0:
        return Quantile(bks[0][0])
    start, end, count = 0.0, bks[b][0], bks[b][1]
    if b > 0:
        start = bks[b - 1][0]
        count -= bks[b - 1][1]
        rank -= bks[b - 1][1]
    if count == 0:  # rank 0 (q = 0) on an empty bucket: Prometheus gives NaN; the bucket's start
        return Quantile(start)
    return Quantile(start + (end - start) * (rank / count))


def histogram_delta(prev: Any, curr: Any) -> Histogram | None:
    """The observations between two scrapes of one cumulative histogram (curr − prev).

    A reset (the count or any bucket went down, or the bucket layout changed) means the
    process restarted: the current histogram is the delta (Prometheus ``rate()`` semantics),
    noted in ``notes``. ``prev`` None → None (no window). Raises :class:`InvalidHistogram`
    for a malformed document.
    """
    if prev is None or curr is None:
        return None
    p, c = to_histogram(prev), to_histogram(curr)
    if [le for le, _ in p.buckets] != [le for le, _ in c.buckets]:
        return Histogram(c.buckets, c.sum, c.count, c.notes + ("bucket layout changed: "
                                                               "taken as a reset",))
    went_down = any(cc < pc for (_, pc), (_, cc) in zip(p.buckets, c.buckets)) or (
        p.count is not None and c.count is not None and c.count < p.count)
    if went_down:
        return Histogram(c.buckets, c.sum, c.count, c.notes + ("counter reset: the current "
                                                               "histogram is the window",))
    buckets = tuple((le, cc - pc) for (le, pc), (_, cc) in zip(p.buckets, c.buckets))
    dsum = None if p.sum is None or c.sum is None else c.sum - p.sum
    dcount = None if p.count is None or c.count is None else c.count - p.count
    return Histogram(buckets, dsum, dcount)


@dataclass(frozen=True)
class LatencySummary:
    """Quantiles of a latency histogram with plausibility checks.

    ``quantiles`` maps q → :class:`Quantile` or None (no data). ``flags`` are codes for what
    is wrong (``implausible_zero_sum``, ``mean_outside_buckets``, ``count_mismatch``,
    ``non_monotonic``, ``count_exceeds_requests``, ``invalid``); ``slo_usable`` is False when
    any flag is set or there is no observation: such data stays out of SLO decisions (the
    latency breaker, alerts).
    """

    name: str
    count: float | None
    sum: float | None
    quantiles: dict[float, Quantile | None]
    flags: tuple[str, ...] = ()
    slo_usable: bool = False
    reason: str | None = None

    def p(self, q: float) -> Quantile | None:
        """The quantile for ``q`` (e.g. 0.99), or None."""
        return self.quantiles.get(q)


def latency_summary(hist: Any, quantiles: Iterable[float] = (0.5, 0.9, 0.95, 0.99), *,
                    name: str = "ttft_seconds", finished_total: Any = None, running: Any = None,
                    counter: InvalidSampleCounter | None = None) -> LatencySummary:
    """Quantiles of ``hist`` (document or :class:`Histogram`) plus plausibility flags.

    Checks (each counted in ``counter`` under ``name``): ``_sum`` 0 with observations
    (F03a: every bucket 208 incl. le=0.001 and sum 0 → p50 0.0005 s, flagged); mean outside
    the non-empty buckets' range; ``_count`` ≠ the +Inf bucket; non-monotonic buckets; and,
    when both ``finished_total`` and ``running`` are known (cumulative histograms only),
    observations > finished + running requests (F03b: 8060 > 3918 + 0). ``hist`` None or
    no observations (F04: an empty window) → every quantile None.
    """
    qs = tuple(quantiles)
    empty = {q: None for q in qs}
    if hist is None:
        return LatencySummary(name, None, None, empty, (), False, "no histogram")
    try:
        h = to_histogram(hist)
    except InvalidHistogram as exc:
        if counter is not None:
            counter.record(name, "invalid")
        return LatencySummary(name, None, None, empty, ("invalid",), False, str(exc))
    flags: list[str] = []
    fixed, forced = _monotonic(h.buckets)
    if forced:
        flags.append("non_monotonic")
    obs = fixed[-1][1]
    if h.count is not None and abs(h.count - obs) > 1e-9 * max(1.0, obs):
        flags.append("count_mismatch")
    if obs == 0:
        return LatencySummary(name, 0.0, h.sum, empty, tuple(flags), False, "no observations")
    values = {q: histogram_quantile(q, Histogram(tuple(fixed), h.sum, h.count)) for q in qs}
    if h.sum is not None:
        if h.sum == 0:
            flags.append("implausible_zero_sum")
        else:
            mean = h.sum / obs
            lo_i = next(i for i, (_, c) in enumerate(fixed) if c > 0)
            hi_i = next(i for i in range(len(fixed)) if fixed[i][1] >= obs)
            lower = 0.0 if lo_i == 0 else fixed[lo_i - 1][0]
            upper = fixed[hi_i][0]
            tol = 1e-9 * max(1.0, abs(mean))
            if mean < lower - tol or mean > upper + tol:
                flags.append("mean_outside_buckets")
    fin = validate_nonneg(finished_total, f"{name}.finished_total", counter)
    run = validate_nonneg(running, f"{name}.running", counter)
    if fin.value is not None and run.value is not None:   # both known, or no check
        requests = fin.value + run.value
        if obs > requests:
            flags.append("count_exceeds_requests")
    for f in flags:
        if counter is not None:
            counter.record(name, f)
    reason = None
    if flags:
        reason = "kept out of SLO decisions: " + ", ".join(flags)
    return LatencySummary(name, obs, h.sum, values, tuple(flags), not flags, reason)


# --------------------------------------------------------------------------- output quality
def prompt_len_bucket(tokens: int, edges: Sequence[int] = PROMPT_LEN_EDGES,
                      labels: Sequence[str] | None = None) -> str:
    """Bucket label for a prompt length; each bucket includes its lower edge. With the
    default edges: 511 → "<512", 8191 → "2k-8k", 8192 → ">=8k" (as the engine's label)."""
    if labels is None:
        labels = PROMPT_LEN_LABELS if tuple(edges) == PROMPT_LEN_EDGES else _edge_labels(edges)
    if len(labels) != len(edges) + 1:
        raise ValueError(f"labels: need {len(edges) + 1} labels for {len(edges)} edges")
    for edge, label in zip(edges, labels):
        if tokens < edge:
            return label
    return labels[-1]


def _edge_labels(edges: Sequence[int]) -> tuple[str, ...]:
    out = [f"<{edges[0]}"]
    out += [f"{a}-{b}" for a, b in zip(edges, edges[1:])]
    out.append(f">={edges[-1]}")
    return tuple(out)


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
    if rec.get("finish_reason") == "repetition":
        return True
    s = validate_ratio(_seq_rep(rec, n), f"seq_rep_{n}", counter)
    if s.value is None:
        return None
    return s.value >= threshold


@dataclass(frozen=True)
class BucketRate:
    """Degenerate outputs out of the outputs scored in one group; ``rate`` None for 0 of 0."""

    degenerate: int
    total: int

    @property
    def rate(self) -> float | None:
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
    are excluded and counted. No record → every value None (F04). F20: edges (8192,) give
    0/3 below 8k and 3/3 at 8k and above.
    """
    if labels is None:
        labels = PROMPT_LEN_LABELS if tuple(edges) == PROMPT_LEN_EDGES else _edge_labels(edges)
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
            else _no_data(name_rep, "no scored output in the window"))
    rate = (Signal("degenerate_ratio", deg / total, None, False,
                   {"degenerate": deg, "outputs": total}) if total
            else _no_data("degenerate_ratio", "no scored output in the window"))
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
    it; F20: 3/3 long in full precision vs 0/3 short → long context, not int8);
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
        return _no_data(name, "no valid perplexity in the window")
    return Signal(name, sum(vals) / len(vals), None, False, {"outputs": len(vals)})


# --------------------------------------------------------------------------- OOM records
_UNITS = MappingProxyType({"b": 1, "byte": 1, "bytes": 1, "kib": 1 << 10, "mib": MIB,
                           "gib": GIB, "tib": 1 << 40, "kb": 1 << 10, "mb": MIB, "gb": GIB,
                           "tb": 1 << 40})
_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(bytes|byte|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)"


def parse_size(text: str) -> int:
    """``"41.56 MiB"`` → 43578819 bytes (binary units, as PyTorch's ``format_size``).
    Raises ``ValueError`` naming the text when it is not a size."""
    m = re.fullmatch(r"\s*" + _SIZE + r"\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"size: {text!r} is not '<number> <unit>'")
    return int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))


def format_bytes(n: float | None) -> str:
    """Bytes in words with binary units and two decimals, as PyTorch prints them:
    43578819 → "41.56 MiB"; None → "no data"."""
    if n is None:
        return "no data"
    n = float(n)
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} bytes"


@dataclass(frozen=True)
class OomNumbers:
    """Numbers from a CUDA OOM message (bytes; None where the message does not say)."""

    requested_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None


_OOM_PATTERNS = MappingProxyType({
    "requested_bytes": (r"Tried to allocate " + _SIZE,),
    "total_bytes": (r"total capacity of " + _SIZE, _SIZE + r" total capacity"),
    "free_bytes": (r"of which " + _SIZE + r" is free", _SIZE + r" free"),
    "allocated_bytes": (_SIZE + r" is allocated by PyTorch", _SIZE + r" already allocated"),
    "reserved_unallocated_bytes": (_SIZE + r" is reserved by PyTorch but unallocated",),
})


def parse_oom_message(text: str | None) -> OomNumbers:
    """Parse PyTorch's CUDA OOM message, both formats:

    * ≥ 2.1: "CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of
      31.40 GiB of which 41.56 MiB is free. ... Of the allocated memory 13.73 GiB is allocated
      by PyTorch, and 736.86 MiB is reserved by PyTorch but unallocated."
    * older: "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already
      allocated; 3.12 MiB free; 14.59 GiB reserved in total by PyTorch)" — there U =
      reserved in total − already allocated.

    Fields the message lacks are None; never raises on odd text.
    """
    if not isinstance(text, str) or not text:   # a non-string message has no numbers
        return OomNumbers()
    found: dict[str, int | None] = {}
    for key, pats in _OOM_PATTERNS.items():
        found[key] = None
        for pat in pats:
            m = re.search(pat, text, re.IGNORECASE)
            if m:
                found[key] = int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))
                break
    if found["reserved_unallocated_bytes"] is None and found["allocated_bytes"] is not None:
        m = re.search(_SIZE + r" reserved in total", text, re.IGNORECASE)
        if m:
            reserved = int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))
            found["reserved_unallocated_bytes"] = max(0, reserved - found["allocated_bytes"])
    return OomNumbers(**found)


def classify_oom(numbers: OomNumbers) -> str | None:
    """The kind of an OOM (F13): ``impossible`` when requested > total (no amount of freeing
    helps: reject with 4xx, no switch), ``fragmentation`` when reserved-but-unallocated ≥
    requested (freeing the cache can satisfy it), else ``exhaustion`` (the int8 switch).
    None when the requested size is unknown."""
    r = numbers.requested_bytes
    if r is None:
        return None
    if numbers.total_bytes is not None and r > numbers.total_bytes:
        return "impossible"
    if numbers.reserved_unallocated_bytes is not None and numbers.reserved_unallocated_bytes >= r:
        return "fragmentation"
    return "exhaustion"


_HARDWARE_TEXT = re.compile(
    r"\bxid\b|gpu is lost|gpuislost|fallen off the bus|uncorrectable ecc|ecc error|"
    r"uncorrectable error|double bit ecc|row remapping failure|nvrm:",
    re.IGNORECASE)


def hardware_fault_evidence(text: str | None) -> str | None:
    """The phrase in ``text`` that marks a hardware fault (Xid, GPU lost / fallen off the bus,
    uncorrectable ECC), or None. An engine may report such a fault as "out of memory"; it is
    never an int8 trigger."""
    if not isinstance(text, str) or not text:
        return None
    m = _HARDWARE_TEXT.search(text)
    return m.group(0) if m else None


# --------------------------------------------------------------------------- GPU snapshots
#: ``GpuSnapshot`` number fields that are never negative (bytes, counts, watts, MHz, codes).
GPU_NONNEG_FIELDS = ("memory_total_bytes", "memory_used_bytes", "memory_free_bytes",
                     "memory_reserved_bytes", "power_watts", "power_limit_watts", "clocks_sm_mhz",
                     "clocks_mem_mhz", "ecc_corrected", "ecc_uncorrected", "recovery_action")
#: ``GpuSnapshot`` ratio fields (0..1).
GPU_RATIO_FIELDS = ("utilization_ratio", "memory_bandwidth_utilization_ratio", "fan_ratio")
#: ``GpuSnapshot`` temperatures (°C): finite and not below absolute zero (−273.15 °C).
GPU_TEMPERATURE_FIELDS = ("temperature_celsius", "memory_temperature_celsius")
ABSOLUTE_ZERO_CELSIUS = -273.15


def clean_gpu_snapshot(snap: Any, counter: InvalidSampleCounter | None = None) -> list[str]:
    """Replace every impossible value of a ``GpuSnapshot`` with ``None`` (no data), in place,
    and return the names of the fields replaced (each counted as ``gpu_<field>``).

    Impossible: a number field that is not a finite number (a string, NaN, an integer beyond
    float range), a negative byte count / power / clock / counter, a ratio outside 0..1, a
    temperature below absolute zero, ``used``/``free``/``reserved`` memory above ``total`` by
    more than the MiB rounding of nvidia-smi and DCGM (``MEMORY_ROUNDING_TOLERANCE_BYTES``), an
    ``index`` that is not an integer >= 0. ``lost`` that is not a bool is read as its truth
    value (a rail never resets a GPU that might be lost). A whole reading is never dropped for
    one bad field: the rest stays usable."""
    bad: list[str] = []

    def drop(field: str, code: str) -> None:
        setattr(snap, field, None)
        bad.append(field)
        if counter is not None:
            counter.record(f"gpu_{field}", code)

    for field in GPU_NONNEG_FIELDS:
        v = getattr(snap, field, None)
        if v is not None and validate_nonneg(v).value is None:
            drop(field, _reason(v))
    for field in GPU_RATIO_FIELDS:
        v = getattr(snap, field, None)
        if v is not None and validate_ratio(v).value is None:
            drop(field, _reason(v, ratio=True))
    for field in GPU_TEMPERATURE_FIELDS:
        v = getattr(snap, field, None)
        if v is None:
            continue
        ok = not isinstance(v, bool) and isinstance(v, (int, float))
        try:
            ok = ok and math.isfinite(float(v)) and float(v) >= ABSOLUTE_ZERO_CELSIUS
        except OverflowError:
            ok = False
        if not ok:
            drop(field, "out_of_range" if isinstance(v, (int, float)) else "not_a_number")
    total = snap.memory_total_bytes
    if total is not None:
        for field in ("memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes"):
            v = getattr(snap, field)
            if v is not None and v > total + MEMORY_ROUNDING_TOLERANCE_BYTES:
                drop(field, "above_total")
    index = getattr(snap, "index", None)
    if index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
        drop("index", "not_an_index")
    if not isinstance(snap.lost, bool):
        snap.lost = bool(snap.lost)
        bad.append("lost")
        if counter is not None:
            counter.record("gpu_lost", "not_a_bool")
    return bad


def _reason(v: Any, ratio: bool = False) -> str:
    """The reason code :func:`_check_number` would count for ``v``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "not_a_number"
    try:
        f = float(v)
    except OverflowError:
        return "inf"
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf"
    if f < 0:
        return "negative"
    return "above_one" if ratio else "out_of_range"
