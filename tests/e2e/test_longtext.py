"""Long-text processing: reading real Gutenberg files, chunk plans, measures, the HTTP backend."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import typer
from typer.testing import CliRunner

from inferctl.tools import longtext as lt


# ------------------------------------------------------------------------------ reading
def test_decode_auto_utf8_cp1252_and_bom():
    assert lt.decode_text("café “q”".encode("utf-8")) == ("café “q”", "utf-8")
    assert lt.decode_text(b"\xef\xbb\xbfhi") == ("hi", "utf-8")
    # Windows-1252 smart quotes and an e-acute: not valid UTF-8
    assert lt.decode_text(b"caf\xe9 \x93q\x94") == ("café “q”", "cp1252")


def test_decode_errors_name_offset_and_option():
    with pytest.raises(lt.LongTextError) as e:
        lt.decode_text(b"abc\xe9def", "utf-8", name="book.txt")
    assert e.value.field == "encoding"
    assert "offset 3" in str(e.value) and "0xe9" in str(e.value) and "--encoding" in str(e.value)
    with pytest.raises(lt.LongTextError, match="unknown encoding 'nope'"):
        lt.decode_text(b"abc", "nope")
    # 0x81 is undefined in Windows-1252 and invalid UTF-8: auto refuses with the offset
    with pytest.raises(lt.LongTextError, match="offset 2"):
        lt.decode_text(b"ab\x81c")


def test_read_real_gutenberg_book(gutenberg_dir):
    book = lt.read_book(gutenberg_dir / "pg84.txt")
    assert book.encoding == "cp1252" and book.gutenberg
    assert book.text.startswith("Frankenstein;")
    assert "\r" not in book.text
    assert "*** END OF" not in book.text and "*** START OF" not in book.text
    assert "PROJECT GUTENBERG LICENSE" not in book.text.upper()
    assert book.raw_bytes == (gutenberg_dir / "pg84.txt").stat().st_size
    # the indented END line of pg1342 is found too
    pp = lt.read_book(gutenberg_dir / "pg1342.txt")
    assert "END OF THE PROJECT GUTENBERG" not in pp.text
    assert pp.text.endswith("CHANCERY LANE, LONDON.") and "Gutenberg" not in pp.text[-2000:]


def test_read_book_errors(tmp_path):
    with pytest.raises(lt.LongTextError, match="no such file"):
        lt.read_book(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("*** START OF THE PROJECT GUTENBERG EBOOK X ***\r\n\r\n*** END OF THE "
                                        "PROJECT GUTENBERG EBOOK X ***\r\n")
    with pytest.raises(lt.LongTextError, match="no text between"):
        lt.read_book(tmp_path / "empty.txt")
    (tmp_path / "plain.txt").write_bytes(b"line one\r\nline two\rthree")
    b = lt.read_book(tmp_path / "plain.txt")
    assert b.text == "line one\nline two\nthree" and not b.gutenberg


# -------------------------------------------------------------------------------- plans
def test_chunk_spans_cover_every_token_once_as_new():
    spans = lt.chunk_spans(10, 4, 1)
    assert spans == [(0, 4), (3, 7), (6, 10)]
    spans = lt.chunk_spans(1000, 511, 64)
    new = [range(s if i == 0 else s + 64, e) for i, (s, e) in enumerate(spans)]
    flat = [t for r in new for t in r]
    assert flat == list(range(1000))
    with pytest.raises(ValueError):
        lt.chunk_spans(10, 4, 4)


def test_plan_generation_caps_prompt_plus_output():
    window = [1] + list(range(100, 611))          # BOS + 511 tokens = 512
    prompt, n = lt.plan_generation(window, 1, 1024, 512)
    assert n == 256 and len(prompt) == 256 and prompt[0] == 1 and prompt[1:] == window[-255:]
    prompt, n = lt.plan_generation(window, 1, 1024, 1536)
    assert n == 1024 and prompt == window
    prompt, n = lt.plan_generation(window, 1, 100, 1536)
    assert n == 100 and prompt == window


def test_plan_chunks_windows_and_limits():
    cfg = lt.LongTextConfig(chunk_size=8, overlap=2, max_new_tokens=4)
    plans, total = lt.plan_chunks(list(range(10, 30)), cfg, bos_id=1, max_model_len=16)
    assert total == 4                                # 7 text tokens per window, stride 5: 0,5,10,15
    assert [p.window[0] for p in plans] == [1, 1, 1, 1]
    assert [(p.start, p.end) for p in plans] == [(0, 7), (5, 12), (10, 17), (15, 20)]
    assert [p.first_new for p in plans] == [1, 3, 3, 3]
    assert all(len(p.prompt) + p.max_tokens <= 16 for p in plans)
    sample, total = lt.plan_chunks(list(range(10, 30)), lt.LongTextConfig(chunk_size=8, overlap=2, max_chunks=2),
                                   bos_id=1, max_model_len=16)
    assert [p.index for p in sample] == [0, 3] and total == 4
    with pytest.raises(lt.LongTextError) as e:
        lt.plan_chunks([5] * 50, lt.LongTextConfig(chunk_size=600), 1, 512)
    assert e.value.field == "chunk_size" and "512" in str(e.value)


def test_config_validation_names_fields():
    with pytest.raises(lt.LongTextError) as e:
        lt.LongTextConfig(chunk_size=64, overlap=63)
    assert e.value.field == "overlap"
    with pytest.raises(lt.LongTextError, match="repetition_penalty"):
        lt.LongTextConfig(repetition_penalty=float("nan"))
    with pytest.raises(lt.LongTextError, match="max_chunks"):
        lt.LongTextConfig(max_chunks=0)


def test_seq_rep_and_perplexity():
    assert lt.seq_rep_n(["the"] * 10, 1) == pytest.approx(0.9)
    assert lt.seq_rep_n([1, 2, 1, 2, 1, 2], 2) == pytest.approx(0.6)
    assert lt.seq_rep_n([1, 2], 3) is None
    assert lt.perplexity([-1.0, -3.0]) == pytest.approx(math.exp(2.0))
    assert lt.perplexity([None, -1.0]) is None
    assert lt.perplexity([]) is None


# ----------------------------------------------------------------------- run (fake engine)
class FakeBackend:
    """Character tokenizer; logprob of a token = -0.01 × its position (so every number is known)."""

    name = "fake"
    max_model_len = 16
    max_window = 16
    bos_id = 1

    def tokenize(self, text):
        return [ord(c) for c in text]

    def score(self, windows):
        return [[None] + [-0.01 * i for i in range(1, len(w))] for w in windows]

    def generate(self, prompts, max_tokens, config):
        return [lt.Generation([7, 7, 7, 8][:m] * 1, [-0.5] * min(m, 4), "abc", "length") for m in max_tokens]


def test_run_longtext_numbers():
    book = lt.Book("b.txt", "x" * 40, "utf-8", False, 40)
    cfg = lt.LongTextConfig(chunk_size=16, overlap=5, max_new_tokens=4, position_bucket=8)
    rep = lt.run_longtext(book, FakeBackend(), cfg)
    assert rep.total_tokens == 40 and rep.total_chunks == 4     # 15 text tokens, stride 10
    first = rep.chunks[0]
    assert first.new_tokens == 15 and first.nll_new == pytest.approx(0.01 * sum(range(1, 16)))
    second = rep.chunks[1]
    assert second.new_tokens == 10 and second.nll_new == pytest.approx(0.01 * sum(range(6, 16)))
    # positions 1..7 in bucket 0 for every window; position 0 (BOS) is never scored
    b0 = rep.positions[0]
    n_windows = len(rep.chunks)
    assert b0.tokens == 7 * n_windows
    assert b0.ppl == pytest.approx(math.exp(0.01 * sum(range(1, 8)) / 7))
    s = rep.summary()
    assert s["scored_tokens"] == 40
    assert s["seq_rep_1"] == pytest.approx(0.5)          # [7, 7, 7, 8]: 2 unique of 4
    assert s["gen_ppl_mean"] == pytest.approx(math.exp(0.5))
    row = lt.chunks_csv(rep).splitlines()[1].split(",")
    assert row[:5] == ["0", "0", "15", "16", "15"]


def test_run_longtext_without_prompt_logprobs_is_no_data():
    class NoScore(FakeBackend):
        def score(self, windows):
            return [None for _ in windows]

    rep = lt.run_longtext(lt.Book("b", "y" * 30, "utf-8", False, 30), NoScore(),
                          lt.LongTextConfig(chunk_size=16, overlap=4, max_new_tokens=2))
    assert all(c.ppl_new is None for c in rep.chunks)
    assert rep.summary()["ppl"] is None and all(b.ppl is None for b in rep.positions)
    assert any("no prompt logprobs" in n for n in rep.notes)
    assert json.loads(json.dumps(rep.to_dict(), allow_nan=False))["summary"]["ppl"] is None


# ---------------------------------------------------------------------------- HTTP backend
def vllm_like(prompt_logprobs: bool = True, tokenize: bool = True):
    """An httpx MockTransport answering like vLLM (char tokenizer, logprob -0.1 everywhere)."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        seen.append((path, body))
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 32}]})
        if path == "/tokenize":
            if not tokenize:
                return httpx.Response(404, json={"detail": "Not Found"})
            ids = [ord(c) % 200 + 3 for c in body["prompt"]]
            return httpx.Response(200, json={"tokens": ([1] if body["add_special_tokens"] else []) + ids})
        if path == "/v1/completions":
            p = body["prompt"]
            ch = {"text": "ab", "finish_reason": "length",
                  "logprobs": ({"tokens": ["a", "b"], "token_logprobs": [-0.2, -0.4]}
                               if body.get("logprobs") == 0 else None)}
            if body.get("prompt_logprobs") is not None and prompt_logprobs:
                ch["prompt_logprobs"] = [None] + [{str(t): {"logprob": -0.1, "rank": 1}} for t in p[1:]]
            return httpx.Response(200, json={"choices": [ch]})
        return httpx.Response(404, json={"error": {"message": "no"}})

    return httpx.MockTransport(handler), seen


def test_http_backend_vllm_shapes():
    transport, seen = vllm_like()
    be = lt.HttpBackend("http://x", transport=transport)
    assert be.max_model_len == 32 and be.max_window == 31 and be.bos_id == 1
    rep = lt.run_longtext(lt.Book("b", "hello world " * 5, "utf-8", False, 60), be,
                          lt.LongTextConfig(chunk_size=31, overlap=4, max_new_tokens=8, concurrency=2))
    assert rep.total_tokens == 60
    assert rep.summary()["ppl"] == pytest.approx(math.exp(0.1))
    gens = [b for p, b in seen if p == "/v1/completions" and b.get("logprobs") == 0]
    assert gens and all(b["repetition_penalty"] == 1.2 and len(b["prompt"]) + b["max_tokens"] <= 32 for b in gens)
    assert rep.chunks[0].gen_ppl == pytest.approx(math.exp(0.3))


def test_http_backend_missing_capabilities():
    transport, _ = vllm_like(tokenize=False)
    with pytest.raises(lt.LongTextError, match="no POST /tokenize"):
        lt.HttpBackend("http://x", transport=transport)
    transport, _ = vllm_like(prompt_logprobs=False)
    be = lt.HttpBackend("http://x", transport=transport)
    rep = lt.run_longtext(lt.Book("b", "abc " * 10, "utf-8", False, 40), be,
                          lt.LongTextConfig(chunk_size=20, overlap=2, max_new_tokens=4, generate=False))
    assert rep.summary()["ppl"] is None and rep.notes


def test_parse_prompt_logprobs_forms():
    w = [1, 5, 6]
    assert lt.parse_prompt_logprobs([None, {"5": {"logprob": -1.0}}, {"6": {"logprob": -2.0}, "9": {"logprob": -0.1}}],
                                    w) == [None, -1.0, -2.0]
    assert lt.parse_prompt_logprobs([None, -1.5, -0.5], w) == [None, -1.5, -0.5]
    assert lt.parse_prompt_logprobs([None, {"9": {"logprob": -1.0}}, -1.0], w) is None     # token absent
    assert lt.parse_prompt_logprobs([None, -1.0], w) is None                               # wrong length
    assert lt.parse_prompt_logprobs(None, w) is None


# ------------------------------------------------------------------------------------ CLI
def _app() -> typer.Typer:
    app = typer.Typer()
    lt.register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps typer from flattening the app
        pass

    return app


def test_cli_bad_encoding_is_a_clear_error(gutenberg_dir):
    r = CliRunner().invoke(_app(), ["longtext", str(gutenberg_dir / "pg84.txt"), "--encoding", "utf-8",
                                    "--url", "http://127.0.0.1:9"])
    assert r.exit_code == 2
    assert "does not decode as utf-8" in r.output and "Traceback" not in r.output


def test_cli_bad_option_and_unreachable_engine(gutenberg_dir):
    r = CliRunner().invoke(_app(), ["longtext", str(gutenberg_dir / "pg84.txt"), "--overlap", "600",
                                    "--url", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "--overlap" in r.output
    r = CliRunner().invoke(_app(), ["longtext", str(gutenberg_dir / "pg84.txt"), "--url", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "cannot reach http://127.0.0.1:9" in r.output and "Traceback" not in r.output


@pytest.mark.e2e
def test_cli_against_the_real_engine(tmp_path, stories_dir, gutenberg_dir):
    """`inferctl longtext BOOK --model stories260K` starts an engine and measures over HTTP
    (the engine serves /tokenize and prompt_logprobs, as vLLM's OpenAI server)."""
    r = CliRunner().invoke(_app(), ["longtext", str(gutenberg_dir / "pg84.txt"), "--model",
                                    str(stories_dir / "stories260K.bin"), "--max-chunks", "2",
                                    "--max-new-tokens", "8", "--out", str(tmp_path / "lt"), "--quiet"])
    assert r.exit_code == 0, r.output
    rows = (tmp_path / "lt.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("chunk,start,end")
    doc = json.loads((tmp_path / "lt.json").read_text())
    assert doc["book"]["encoding"] == "cp1252" and doc["summary"]["chunks_processed"] == 2
    assert all(c["gen_tokens"] <= 8 for c in doc["chunks"])
