"""IncrementalDetokenizer: stop strings never leak, UTF-8 never emitted half, O(window) cost."""

from __future__ import annotations

import pytest

from inferctl.engine.detokenizer import IncrementalDetokenizer
from inferctl.engine.tokenizer import ByteTokenizer, Llama2cTokenizer

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
         "the park. One day, she saw a big, red ball. She wanted to play with it, but it was "
         "too high.")


@pytest.fixture(scope="module")
def tok(stories_dir):
    return Llama2cTokenizer(stories_dir / "tok512.bin")


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[list[str], str]:
    deltas = []
    for i in ids:
        text, stopped = detok.add(i)
        deltas.append(text)
        if stopped:
            break
    return deltas, detok.flush()


def _bytes_ids(s: str) -> list[int]:
    return [3 + b for b in s.encode("utf-8")]


def test_stream_equals_full_decode_with_and_without_prompt(tok):
    ids = tok.encode(STORY + " café 😀 é.")
    prompt, out = ids[:5], ids[5:]
    deltas, tail = _stream(IncrementalDetokenizer(tok, [], prompt_ids=prompt), out)
    full = tok.decode(prompt + out)
    assert "".join(deltas) + tail == full[len(tok.decode(prompt)):]
    assert full[len(tok.decode(prompt)):].startswith(", there was")
    detok = IncrementalDetokenizer(tok, [])
    deltas, tail = _stream(detok, out)
    assert "".join(deltas) + tail == tok.decode(out) == detok.text
    assert tail == ""  # nothing held without stop strings once the text is complete


def test_stop_spanning_three_tokens_is_not_leaked(tok):
    ids = tok.encode("Hello World! More text", bos=False)
    assert [tok.id_to_piece(i) for i in ids[4:7]] == ["W", "or", "ld"]
    detok = IncrementalDetokenizer(tok, ["World"])
    seen = ""
    for i in ids:
        text, stopped = detok.add(i)
        seen += text
        assert "W" not in seen  # not even the stop's first token, while it may be a stop
        if stopped:
            break
    assert stopped and detok.stop_reason == "World"
    assert seen == detok.text == " Hello "
    assert detok.add(ids[-1]) == ("", True)
    assert detok.flush() == ""


def test_stop_that_never_completes_is_released(tok):
    ids = tok.encode("Hello World!", bos=False)
    detok = IncrementalDetokenizer(tok, ["World peace"])
    deltas, tail = _stream(detok, ids)
    assert deltas[-3:-1] == ["", ""]  # "or", "ld" held with "W" as a possible "World peace"
    assert deltas[-1] == "World!"
    assert tail == "" and detok.text == " Hello World!" and not detok.stopped

    detok = IncrementalDetokenizer(tok, ["ld!!"])
    deltas, tail = _stream(detok, ids)
    assert "".join(deltas) == " Hello Wor"
    assert tail == "ld!"  # held to the end, released at flush
    assert detok.text == " Hello World!"


def test_hold_back_is_exactly_the_longest_stop_prefix():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, ["xyz", "yy"])
    deltas = [detok.add(i)[0] for i in _bytes_ids("axyaxyyb")]
    #            a    x   y   a      x   y   y: "yy" found, the "x" before it released
    assert deltas == ["a", "", "", "xya", "", "", "x", ""]
    assert detok.stopped and detok.stop_reason == "yy" and detok.text == "axyax"


def test_first_ending_stop_wins_independent_of_token_boundaries(tok):
    stops = ["World!", "or"]
    pieces = tok.encode("Hello World!", bos=False)
    per_byte = _bytes_ids(" Hello World!")
    results = []
    for ids in (pieces, per_byte):
        detok = IncrementalDetokenizer(tok, stops)
        _stream(detok, ids)
        results.append((detok.text, detok.stop_reason))
    assert results[0] == results[1] == (" Hello W", "or")


def test_multibyte_utf8_never_emitted_half(tok):
    ids = tok.encode("caf", bos=False) + _bytes_ids("é") + _bytes_ids(" 😀 ok")
    detok = IncrementalDetokenizer(tok, [])
    deltas, tail = _stream(detok, ids)
    assert all("\ufffd" not in d for d in deltas)
    n = len(tok.encode("caf", bos=False))
    assert deltas[n:n + 2] == ["", "é"]
    assert deltas[n + 2:n + 7] == [" ", "", "", "", "😀"]
    assert detok.text == " café 😀 ok" and tail == ""


def test_stop_string_with_emoji_split_over_byte_tokens(tok):
    ids = tok.encode("hi", bos=False) + _bytes_ids("😀!") + tok.encode("after", bos=False)
    detok = IncrementalDetokenizer(tok, ["😀!"])
    deltas, tail = _stream(detok, ids)
    assert detok.stopped and detok.text == " hi" and tail == ""
    assert all("\ufffd" not in d for d in deltas)


def test_incomplete_utf8_at_the_end_is_flushed_as_replacement(tok):
    ids = tok.encode("ok", bos=False) + _bytes_ids("😀")[:2]
    detok = IncrementalDetokenizer(tok, [])
    deltas, tail = _stream(detok, ids)
    assert "".join(deltas) == " ok"
    assert tail == "\ufffd" and detok.text == tok.decode(ids)


def test_invalid_bytes_are_released_and_later_characters_survive(tok):
    ids = [3 + 0xFF] * 20 + _bytes_ids("é") + tok.encode("ok", bos=False)
    detok = IncrementalDetokenizer(tok, [])
    deltas, tail = _stream(detok, ids)
    assert "".join(deltas) + tail == tok.decode(ids)
    assert detok.text.endswith("é ok")
    assert "".join(deltas[:19]).count("\ufffd") >= 10  # released before the end, not held


class _CountingTokenizer:
    def __init__(self, inner):
        self.inner = inner
        self.window_sizes: list[int] = []

    def decode(self, ids):
        self.window_sizes.append(len(ids))
        return self.inner.decode(ids)


def test_cost_per_token_is_bounded_by_a_window(tok):
    ids = tok.encode(STORY * 30, bos=False)
    assert len(ids) > 1500
    counting = _CountingTokenizer(tok)
    detok = IncrementalDetokenizer(counting, ["never appears"], prompt_ids=[1] + ids[:5])
    _stream(detok, ids)
    assert detok.text == tok.decode(ids)
    assert max(counting.window_sizes) <= 8
    assert sum(counting.window_sizes) <= 6 * len(ids)


def test_prompt_ending_inside_a_character(tok):
    prompt = [1] + _bytes_ids("😀")[:2]
    out = _bytes_ids("😀")[2:] + tok.encode("ok", bos=False)
    detok = IncrementalDetokenizer(tok, [], prompt_ids=prompt)
    deltas, tail = _stream(detok, out)
    assert "".join(deltas) + tail == tok.decode(out)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"stop\[1\]"):
        IncrementalDetokenizer(ByteTokenizer(), ["a", ""])
    with pytest.raises(ValueError, match="max_pending_tokens"):
        IncrementalDetokenizer(ByteTokenizer(), [], max_pending_tokens=3)
