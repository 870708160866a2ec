"""``inferctl longtext --sep-every N`` and ``--memory-compression mean`` (tools/longtext/markers.py,
inproc.py): markers at the right book positions and never scored; the summary position carries
the mean input embedding of the text before the window; the one-prefill path gives the same numbers."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.tools.longtext import Book, Generation, LongTextConfig, LongTextError, plan_chunks, run_longtext
from inferctl.tools.longtext.markers import SUMMARY_PLACEHOLDER_ID, insert_separators, insert_summary

BOS, SEP = 1, [7, 8]


def _plans(n=2000, **kw):
    ids = list(range(100, 100 + n))            # token id = 100 + book index
    return ids, plan_chunks(ids, LongTextConfig(**kw), BOS, 4096)[0]


def test_sep_markers_sit_before_every_book_multiple_of_n_and_book_tokens_are_kept():
    ids, plans = _plans(chunk_size=512, overlap=64)
    seen = set()
    for p in plans:
        insert_separators(p, SEP, 128, nbos=1)
        x, idx = p.model_input, p.book_index
        assert [x[j] for j in idx] == p.window                     # every book token is there, in order
        expect = [k for k in range(p.start + 1, p.end) if k % 128 == 0]
        got = [x[j + 2] - 100 for j in range(len(x) - 2) if x[j:j + 2] == SEP]
        assert got == expect                                         # a marker right before book token k
        assert len(x) == len(p.window) + 2 * len(expect)
        seen.update(got)
    assert seen == {k for k in range(1, 2000) if k % 128 == 0}       # 15, none lost at window edges


class _Recorder:
    """A fake backend: logprob -1 for a book token, -50 for a marker token or what follows BOS."""
    name, max_model_len, max_window, bos_id = "fake", 4096, 4096, BOS

    def __init__(self):
        self.sent = []

    def tokenize(self, text):
        return SEP if text == "[SEP]" else list(range(100, 1100))

    def score(self, windows):
        self.sent += windows
        return [[None] + [-50.0 if t in SEP else -1.0 for t in w[1:]] for w in windows]

    def generate(self, prompts, max_tokens, config):
        return [Generation([5, 5, 6], [-1.0] * 3, "x", "length") for _ in prompts]


def test_markers_are_input_only_never_scored():
    fake = _Recorder()
    rep = run_longtext(Book("b", "text", "utf-8", False, 4), fake,
                       LongTextConfig(chunk_size=300, overlap=20, sep_every=100, max_new_tokens=3))
    assert any(w.count(7) for w in fake.sent)                        # markers were sent ...
    assert rep.summary()["ppl"] == pytest.approx(math.e)             # ... and none was scored
    assert sum(b.tokens for b in rep.positions) == sum(c.window_tokens - 1 for c in rep.chunks)
    assert rep.engine["sep_ids"] == SEP and any("[SEP]" in n for n in rep.notes)


def test_options_are_validated_naming_the_field():
    with pytest.raises(LongTextError, match="sep_every"):
        LongTextConfig(sep_every=0)
    with pytest.raises(LongTextError, match="memory_compression"):
        LongTextConfig(memory_compression="max")
    fake = _Recorder()      # no embedding input: mean compression is refused, not silently skipped
    with pytest.raises(LongTextError, match="memory_compression"):
        run_longtext(Book("b", "t", "utf-8", False, 1), fake, LongTextConfig(chunk_size=300, overlap=20,
                                                                             memory_compression="mean"))


def test_cli_refuses_mean_compression_over_http(tmp_path):
    book = tmp_path / "b.txt"
    book.write_text("Some text. " * 50)
    r = CliRunner().invoke(app, ["longtext", str(book), "--url", "http://127.0.0.1:9", "--memory-compression", "mean"])
    assert r.exit_code == 2 and "--memory-compression" in r.output and "--model" in r.output


@pytest.fixture(scope="module")
def stories(stories_dir):
    from inferctl.tools.longtext.inproc import InProcessBackend

    return InProcessBackend(stories_dir / "stories260K.bin", pack=3)


def test_mean_compression_feeds_the_mean_embedding_of_the_earlier_text(stories):
    text = "Once upon a time there was a little dog. The dog liked to run in the park with Lily. " * 20
    ids = stories.tokenize(text)
    plan = plan_chunks(ids, LongTextConfig(chunk_size=128, overlap=16), stories.bos_id, 512)[0][2]
    assert plan.start > 0
    vec = stories.mean_embedding(ids[:plan.start])
    with torch.inference_mode():
        direct = stories.model.embed(torch.tensor(ids[:plan.start])).float().mean(0)
    assert torch.allclose(vec, direct, atol=1e-6)
    plain = stories.score([plan.window])[0]
    insert_summary(plan, vec, nbos=1)
    x = plan.model_input
    assert x[0] == stories.bos_id and x[1] == SUMMARY_PLACEHOLDER_ID and x[2:] == plan.window[1:]
    assert plan.embeds.keys() == {1} and plan.book_index[1:] == list(range(2, len(x)))
    withsum = stories.score([x], embeds=[plan.embeds])[0]
    # the summary changes what the model sees: the logprob of the same book token differs ...
    assert withsum[2] != pytest.approx(plain[1], abs=1e-4)
    # ... and exactly as a forward with that vector at position 1 (not the placeholder's embedding)
    other = stories.score([x])[0]
    assert withsum[2] != pytest.approx(other[2], abs=1e-4)


def test_one_prefill_gives_the_same_numbers_as_score_then_generate(stories):
    ids = stories.tokenize("Lily and Ben went to the park. They saw a big red ball. " * 8)
    windows = [[stories.bos_id] + ids[:60], [stories.bos_id] + ids[20:100]]
    cfg = LongTextConfig(max_new_tokens=12)
    scores, gens = stories.score_and_generate(windows, [12, 12], cfg)
    for a, b in zip(scores, stories.score(windows)):
        assert a[0] is None and b[0] is None and a[1:] == pytest.approx(b[1:], abs=1e-4)
    for g, h in zip(gens, stories.generate(windows, [12, 12], cfg)):
        assert g.tokens == h.tokens and g.logprobs == pytest.approx(h.logprobs, abs=1e-4)
