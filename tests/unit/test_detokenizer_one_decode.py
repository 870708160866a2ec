"""IncrementalDetokenizer decodes once per token (cached prefix text) and gives exactly the text
of the two-decode algorithm (vLLM's prefix/read offsets) on the real stories260K and SmolLM2 GGUF
tokenizers, over long random streams with byte-fallback / partial UTF-8 tokens and stop strings."""

from __future__ import annotations

import random

import pytest

from inferctl.engine.detokenizer import IncrementalDetokenizer
from inferctl.engine.gguf import open_gguf, read_metadata, tokenizer_from_metadata
from inferctl.engine.tokenizer import Llama2cTokenizer
from tests.gguf_helpers import require_smollm


class _TwoDecodeReference(IncrementalDetokenizer):
    """The algorithm before the cache: every commit moves the window's start to the old
    read_offset and forgets its text, so each token decodes the prefix and the full window."""

    def _commit(self, full, prefix_text, upto, keep_start=False):
        return super()._commit(full, prefix_text, upto, keep_start=False)


class _Counting:
    def __init__(self, inner):
        self.inner, self.calls, self.ids = inner, 0, 0

    def decode(self, ids):
        self.calls += 1
        self.ids += len(ids)
        return self.inner.decode(ids)


@pytest.fixture(scope="module")
def stories_tok(stories_dir):
    return Llama2cTokenizer(stories_dir / "tok512.bin")


@pytest.fixture(scope="module")
def smollm_tok():
    p = require_smollm()
    return tokenizer_from_metadata(read_metadata(open_gguf(p)), p)


def _streams(tok, seed: int, n: int, partial: list[int]):
    """Random output streams: runs of ordinary ids, ids that are partial UTF-8 on their own
    (byte-fallback or byte-level pieces), BOS/EOS, and runs of invalid bytes."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids = []
        while len(ids) < 300:
            r = rng.random()
            if r < 0.5:
                ids.append(rng.randrange(tok.vocab_size))
            elif r < 0.85:
                ids.extend(rng.choice(partial) for _ in range(rng.randrange(1, 5)))
            elif r < 0.9:
                ids.extend(rng.choice(partial) for _ in range(rng.randrange(5, 14)))
            else:
                ids.append(rng.choice([tok.bos_id, tok.eos_id]))
        prompt = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(0, 9))]
        out.append((prompt, ids))
    return out


def _run(cls, tok, prompt, ids, stop):
    d = cls(tok, stop, prompt_ids=prompt)
    deltas = []
    for i in ids:
        text, stopped = d.add(i)
        deltas.append(text)
        if stopped:
            break
    deltas.append(d.flush())
    return deltas, d.stop_reason


def _partial_ids(tok) -> list[int]:
    ids = []
    for i in range(tok.vocab_size):
        b = tok.token_bytes(i)
        if b:
            try:
                b.decode("utf-8")
            except UnicodeDecodeError:
                ids.append(i)
    return ids


@pytest.mark.parametrize("which", ["stories", "smollm"])
def test_same_deltas_as_two_decode_algorithm_and_one_decode_a_token(which, stories_tok, request):
    tok = stories_tok if which == "stories" else request.getfixturevalue("smollm_tok")
    partial = _partial_ids(tok)
    assert len(partial) >= 128   # byte-fallback <0x80>..<0xFF> / byte-level lead and tail bytes
    calls = tokens = 0
    for k, (prompt, ids) in enumerate(_streams(tok, 12, 20, partial)):
        stop = [] if k % 2 else [tok.decode(ids[150:152]) or "x", "\ufffd\ufffd\ufffd\ufffd", "e t"]
        stop = [s for s in stop if s]
        counting = _Counting(tok)
        got = _run(IncrementalDetokenizer, counting, prompt, ids, stop)
        assert got == _run(_TwoDecodeReference, tok, prompt, ids, stop)
        calls += counting.calls
        tokens += len(ids)
        if not stop:
            assert "".join(got[0]).endswith(tok.decode(ids)[-20:])
    # two decodes a token before; now one plus a window move every few tokens
    assert calls < 1.4 * tokens


def test_window_moves_keep_the_window_bounded(stories_tok):
    ids = stories_tok.encode("Once upon a time, there was a girl. " * 80, bos=False)
    counting = _Counting(stories_tok)
    d = IncrementalDetokenizer(counting, [], prompt_ids=[1] + ids[:5])
    for i in ids:
        d.add(i)
    assert d.text + d.flush() == stories_tok.decode(ids)
    assert counting.calls < 1.25 * len(ids)
    assert counting.ids < 7 * len(ids)


@pytest.mark.parametrize("which", ["stories", "smollm"])
def test_decode_table_path_equals_the_per_id_loop(which, stories_tok, request):
    """decode's joined-table path (no BOS) and its loop (BOS: dummy-prefix strip) agree with
    the documented rule: control ids skipped, a piece after BOS loses its leading space."""
    tok = stories_tok if which == "stories" else request.getfixturevalue("smollm_tok")
    rng = random.Random(3)
    for _ in range(2000):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(0, 12))]
        if rng.random() < 0.3 and tok.bos_id is not None:
            ids.insert(rng.randrange(len(ids) + 1), tok.bos_id)
        out, prev = bytearray(), None
        for i in ids:
            if i not in tok._skip:
                b = tok.token_bytes(i)
                out += b[1:] if prev == tok.bos_id and tok.add_dummy_prefix and b[:1] == b" " else b
            prev = i
        assert tok.decode(ids) == out.decode("utf-8", errors="replace")
    with pytest.raises(ValueError):
        tok.decode([0, tok.vocab_size])
    with pytest.raises(ValueError):
        tok.decode([-1])
