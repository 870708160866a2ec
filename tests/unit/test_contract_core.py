"""The shared contract's units, OOM texts, quality measures, metric builder and /stats words."""

from __future__ import annotations

import math

import pytest

from inferctl.contract import metrics, oom, quality, stats, units

MiB, GiB = units.MiB, units.GiB


def test_parse_size_modes():
    assert units.parse_size("500MB") == 500_000_000
    assert units.parse_size("500MB", decimal_si=False) == 500 * MiB
    assert units.parse_size("8000000") == 8_000_000
    assert units.parse_size("81559", default_unit="MiB", decimal_si=False) == 81559 * MiB
    with pytest.raises(units.SizeError, match="unit is required"):
        units.parse_size("1234", default_unit=None)
    with pytest.raises(units.SizeError, match="--flag"):
        units.parse_size("0", "--flag", min_bytes=1)
    with pytest.raises(ValueError, match="size"):
        units.parse_size("-5MiB")
    assert units.parse_size_or_none("lots") is None and units.parse_size_or_none(None) is None


def test_format_bytes_and_c10_format_size():
    assert units.format_bytes(43578819) == "41.56 MiB"
    assert units.format_bytes(None) == "no data"
    assert units.format_bytes(1024) == "1.00 KiB" and units.format_size(1024) == "1024 bytes"


def test_oom_parser_lenient_and_strict():
    msg = ("CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of "
           "31.40 GiB of which 41.56 MiB is free.")
    info = oom.parse_oom_message(msg)
    assert (info.requested_bytes, info.format, info.device) == (96 * MiB, "new", 0)
    assert oom.classify_oom(info) == "exhaustion"
    assert oom.parse_oom_message(None) == oom.OomInfo()
    assert oom.parse_oom_message("something else") == oom.OomInfo()
    assert oom.classify_oom(oom.OomInfo()) is None
    with pytest.raises(ValueError, match="Tried to allocate"):
        oom.parse_oom_message_strict("CUDA error: out of memory")
    assert oom.DEFAULT_OOM_ERROR_CODES == frozenset({2, 800})
    assert oom.classify_error_text("CUDA error: operation not permitted") == "oom"
    assert oom.classify_error_text("CUDA error 700", {700}) == "hardware"


def test_quality_measures():
    assert quality.seq_rep_n(["the"] * 10, 1) == pytest.approx(0.9)
    assert quality.perplexity([-1.0, -3.0]) == (pytest.approx(math.exp(2.0)), 0)
    assert quality.perplexity_value([-1.0, float("nan")]) is None
    assert quality.is_degenerate(["the"] * 10)
    assert quality.prompt_len_bucket(8192) == ">=8k"
    assert quality.prompt_len_bucket(5, (4, 10)) == "4-10"
    assert quality.is_degenerate_rep(None) is None


def test_build_registry_and_stats_words():
    spec: metrics.MetricSpec = {"name": "x_total", "type": "counter", "unit": "things",
                                "help": "x.", "labels": ("a",)}
    _, ms = metrics.build_registry([spec])
    assert list(ms) == ["x_total"]
    assert stats.FINISH_REASONS == ("stop", "length", "repetition", "abort", "error")
    assert stats.FAULT_KINDS == ("oom",)
