"""SSE chunk templates give byte for byte what ``sse(doc)`` gives (the streaming fast path)."""

import math

import numpy as np
import pytest

from inferctl.engine.entrypoints.sse import HOLE, ChunkTemplate, dumps, sse


def _doc(index, text, finish, model="stories260K", usage=True):
    doc = {"id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": model,
           "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}]}
    if usage:
        doc["usage"] = None
    return doc


@pytest.mark.parametrize("values", [
    (0, "hello", None), (3, "", "length"), (1, 'quote " back \\ nl \n tab \t nul \x00', "stop"),
    (0, "héllo ☃ 日本 \U0001F600", None), (7, "</s>", "repetition"),
])
@pytest.mark.parametrize("usage", [True, False])
def test_fill_equals_sse(values, usage):
    tmpl = ChunkTemplate(_doc(HOLE, HOLE, HOLE, usage=usage))
    assert tmpl.fill(*values) == sse(_doc(*values, usage=usage))


def test_fill_with_a_value_it_does_not_encode_itself_goes_through_sse():
    tmpl = ChunkTemplate(_doc(HOLE, HOLE, HOLE))
    # a NaN becomes null exactly as sse() makes it; a numpy int as sse() encodes it
    assert tmpl.fill(0, "a", math.nan) == sse(_doc(0, "a", math.nan)) == sse(_doc(0, "a", None))
    assert tmpl.fill(np.int64(2), "a", None) == sse(_doc(2, "a", None))
    assert tmpl.fill(True, "a", None) == sse(_doc(True, "a", None))


def test_the_mark_inside_the_document_falls_back_to_sse():
    model = "weird\x00hole\x00model"
    tmpl = ChunkTemplate(_doc(HOLE, HOLE, HOLE, model=model))
    assert tmpl.fill(0, "x", None) == sse(_doc(0, "x", None, model=model))


def test_fill_counts_its_values():
    with pytest.raises(ValueError, match="3 values expected, got 2"):
        ChunkTemplate(_doc(HOLE, HOLE, HOLE)).fill(0, "x")


def test_dumps_fast_path_is_the_strict_json_of_json_safe():
    assert dumps({"a": [1.5, math.inf, -math.inf, math.nan], "b": np.float32(0.5), "c": "é"}) == \
        '{"a":[1.5,null,null,null],"b":0.5,"c":"é"}'
    assert dumps({"x": np.int64(3), "t": (1, 2)}) == '{"x":3,"t":[1,2]}'
