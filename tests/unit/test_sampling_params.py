"""SamplingParams validation: every bad field raises SamplingParamsError naming the field."""

from __future__ import annotations

import math

import pytest

from inferctl.engine.sampling_params import SamplingLimits, SamplingParams, SamplingParamsError


def test_defaults_are_vllm_like():
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p) == (16, 1.0, -1, 1.0)
    assert (p.seed, p.repetition_penalty, p.stop, p.logprobs) == (None, 1.0, [], None)
    assert not p.is_greedy and not p.has_penalties


@pytest.mark.parametrize("field,value,bound", [
    ("max_tokens", 0, ">= 1"),
    ("max_tokens", -186, ">= 1"),
    ("max_tokens", "20", "integer"),
    ("max_tokens", 1e12, "integer"),
    ("max_tokens", True, "integer"),
    ("temperature", -0.1, "<= 2"),
    ("temperature", 2.01, "<= 2"),
    ("temperature", math.nan, "finite"),
    ("temperature", "hot", "number"),
    ("top_k", -2, ">= 1"),
    ("top_k", 1.5, "integer"),
    ("top_p", 0.0, "> 0 and <= 1"),
    ("top_p", 1.0001, "> 0 and <= 1"),
    ("top_p", math.inf, "finite"),
    ("seed", 2**64, "<= 18446744073709551615"),
    ("seed", 1.0, "integer"),
    ("repetition_penalty", 0.0, "> 0"),
    ("repetition_penalty", -1.2, "> 0"),
    ("presence_penalty", 2.5, "<= 2"),
    ("frequency_penalty", -2.5, ">= -2"),
    ("stop", [""], "empty"),
    ("stop", ["ok", 3], "string"),
    ("stop", ["x" * 257], "at most 256"),
    ("stop", [str(i) for i in range(17)], "at most 16"),
    ("stop", 5, "string"),
    ("stop_token_ids", [-1], ">= 0"),
    ("stop_token_ids", [1, "2"], "integer"),
    ("logprobs", 21, "<= 20"),
    ("logprobs", -1, ">= 0"),
    ("ignore_eos", 1, "true or false"),
    ("repetition_stop", "yes", "true or false"),
])
def test_each_bad_field_raises_with_its_name_and_bound(field, value, bound):
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**{field: value})
    err = info.value
    assert isinstance(err, ValueError)
    assert err.field == field
    assert str(err).startswith(f"{field}: ")
    assert bound in err.message


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 1), ("temperature", 0), ("temperature", 2), ("top_k", -1), ("top_k", 0),
    ("top_k", 1), ("top_p", 1e-9), ("top_p", 1), ("seed", -(2**63)), ("seed", 2**64 - 1),
    ("repetition_penalty", 1.2), ("repetition_penalty", 0.5), ("presence_penalty", -2),
    ("frequency_penalty", 2), ("logprobs", 0), ("logprobs", 20),
    ("stop", ["x" * 256]), ("stop", [str(i) for i in range(16)]),
])
def test_bounds_themselves_are_accepted(field, value):
    p = SamplingParams(**{field: value})
    assert getattr(p, field) == value


def test_single_stop_string_becomes_a_list_and_numbers_are_normalised():
    p = SamplingParams(stop="\n\n", temperature=1, stop_token_ids=(5, 7))
    assert p.stop == ["\n\n"]
    assert p.stop_token_ids == [5, 7]
    assert isinstance(p.temperature, float)


def test_limits_are_configurable():
    lim = SamplingLimits(max_stop_strings=2, max_stop_string_chars=4, max_logprobs=5)
    SamplingParams(stop=["ab", "abcd"], logprobs=5, limits=lim)
    with pytest.raises(SamplingParamsError, match="at most 2 stop strings"):
        SamplingParams(stop=["a", "b", "c"], limits=lim)
    with pytest.raises(SamplingParamsError, match="at most 4 characters"):
        SamplingParams(stop=["abcde"], limits=lim)
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(logprobs=6, limits=lim)
    assert info.value.field == "logprobs" and "<= 5" in info.value.message
    with pytest.raises(SamplingParamsError) as info:
        SamplingLimits(max_stop_strings=-1)
    assert info.value.field == "max_stop_strings"


def test_greedy_and_penalty_flags():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=1e-6).is_greedy
    assert not SamplingParams(temperature=1e-3).is_greedy
    assert SamplingParams(repetition_penalty=1.2).has_penalties
    assert SamplingParams(presence_penalty=0.1).has_penalties
    assert not SamplingParams(repetition_penalty=1.0).has_penalties
