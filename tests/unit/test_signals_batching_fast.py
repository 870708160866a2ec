"""The batch window's fast paths (controller/signals/batching.py ``batch_window``): when every
counter is a plain finite number >= 0, or none is reported (a vLLM engine), the window is
computed without counter_delta's Signals,
and gives the same Signals (values, reasons, inputs) as the general path; anything else (None,
NaN, a negative, a bool, a string, an integer beyond float range) takes the general path and is
counted as before."""

from __future__ import annotations

import random

import pytest

from inferctl.controller.signals import batching
from inferctl.controller.signals.batching import batch_window, counter_delta, effective_batch_size, padding_ratio
from inferctl.controller.signals.values import InvalidSampleCounter, first_missing
from inferctl.controller.types import EngineSnapshot

FIELDS = ("real_tokens_total", "padded_tokens_total", "step_sequences_total", "steps_total")


def snap(values) -> EngineSnapshot:
    s = EngineSnapshot(name="e0", kind="bundled", ok=True)
    for f, v in zip(FIELDS, values):
        setattr(s, f, v)
    return s


def general(prev: EngineSnapshot, curr: EngineSnapshot, counter) -> dict:
    """The window as the general path computes it (counter_delta per counter, then the ratios)."""
    real, pad, seqs, steps = (counter_delta(getattr(prev, f), getattr(curr, f), f, counter) for f in FIELDS)
    return {"padding_ratio": first_missing("padding_ratio", {}, real, pad) or padding_ratio(real.value, pad.value,
                                                                                            counter),
            "effective_batch_size": first_missing("effective_batch_size", {}, seqs, steps)
            or effective_batch_size(seqs.value, steps.value, counter)}


def test_plain_or_absent_counters_give_the_general_paths_signals_without_counter_delta(monkeypatch):
    rng = random.Random(7)
    cases = [((1000, 10, 500, 100), (1037, 13.7, 537, 112.3)),      # a window
             ((1000, 10, 500, 100), (1000, 10, 500, 100)),          # nothing happened: no data
             ((1000.0, 10.0, 500.0, 100.0), (30, 10, 6, 2)),        # reset (restart): the new values
             ((2 ** 53 + 1, 0, 0, 0), (float(2 ** 53), 0, 0, 1)),   # compared as floats, as the general path
             ((0, 0, 0, 0), (0.0, 5, 3, 0)),
             ((None,) * 4, (None,) * 4)]                              # an engine without them (vLLM)
    for _ in range(200):
        a = tuple(rng.choice([rng.randint(0, 10 ** 6), rng.uniform(0, 1e6)]) for _ in FIELDS)
        b = tuple(x + rng.choice([0, 0, rng.randint(0, 1000), -x]) for x in a)
        cases.append((a, b))
    expected = [general(snap(a), snap(b), None) for a, b in cases]

    def refuse(*args, **kw):
        raise AssertionError("counter_delta called on plain counters")
    monkeypatch.setattr(batching, "counter_delta", refuse)
    for (a, b), want in zip(cases, expected):
        assert batch_window(snap(a), snap(b)) == want, (a, b)


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -1.0, True, "12", 10 ** 400])
def test_other_values_take_the_general_path_and_are_counted_as_before(bad):
    for i in range(len(FIELDS)):
        for side in ("prev", "curr"):
            a, b = [100.0, 10.0, 50.0, 20.0], [150.0, 12.0, 70.0, 25.0]
            (a if side == "prev" else b)[i] = bad
            c1, c2 = InvalidSampleCounter(), InvalidSampleCounter()
            assert batch_window(snap(a), snap(b), c1) == general(snap(a), snap(b), c2)
            assert c1.snapshot() == c2.snapshot()
