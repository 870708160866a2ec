"""Issue 13, pure pieces: a stop described for people (item 10), the longtext output name and
summary (item 9)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from inferctl.controller.runtime import describe_exit
from inferctl.tools.longtext.cli import output_name
from inferctl.tools.longtext.measure import ChunkResult, LongTextReport
from inferctl.tools.longtext.report import render_tables


def test_a_stop_is_described_not_a_negative_code():
    assert describe_exit(-15) == "ended by SIGTERM"
    assert describe_exit(-9) == "ended by SIGKILL"
    assert describe_exit(0) == "exit code 0, clean stop"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(None) == "still running"


def test_longtext_output_name_has_the_model_and_a_timestamp():
    a = output_name(Path("data/pg84.txt"), "../shared/models/stories260K/stories260K.bin", when=0.0)
    b = output_name(Path("data/pg84.txt"), "../shared/models/stories260K/stories260K.bin", when=3600.0)
    c = output_name(Path("data/pg84.txt"), "models/SmolLM2 135M/", when=0.0)
    assert a.startswith("longtext-pg84-stories260K.bin-") and a != b
    assert c.startswith("longtext-pg84-SmolLM2_135M-")
    assert len(a.rsplit("-", 2)[1]) == 8 and len(a.rsplit("-", 1)[1]) == 6     # YYYYmmdd-HHMMSS


def test_longtext_summary_reads_as_words_with_a_sample():
    chunk = ChunkResult(chunk=0, start=0, end=100, window_tokens=100, new_tokens=100, nll_new=200.0, ppl_new=7.4,
                        ppl_window=7.4, prompt_tokens=50, gen_tokens=12, finish_reason="length",
                        seq_rep={"1": 0.1, "2": 0.0, "3": 0.0, "4": 0.0}, gen_ppl=3.0,
                        gen_text="Once upon a time\\nthere was a cat.".replace("\\n", "\n"))
    rep = LongTextReport(book={"path": "data/pg84.txt"}, engine={"backend": "http x (stories260K)"}, config={},
                         total_tokens=100, total_chunks=1, chunks=[chunk], positions=[], seconds=1.0)
    buf = io.StringIO()
    Console(file=buf, width=10_000).print(render_tables(rep)[-1])
    out = buf.getvalue()
    assert "book perplexity (teacher-forced)" in out and "windows processed" in out
    assert "chunks_processed" not in out and "seq_rep_4" not in out
    assert "sample output (chunk 0, 12 tokens)" in out and "Once upon a time there was a cat." in out


# ------------------------------------------------------------------ item 5: config checked at load
def test_a_bad_budget_in_the_config_is_refused_at_load_naming_the_users_key():
    import pytest

    from inferctl.controller.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as err:
        parse_config({"engines": [{"name": "main", "launch": {"memory_budget": "12QB"}}]})
    assert str(err.value).startswith("engines[0].launch.memory_budget: '12QB' is not a size")
    ok = parse_config({"engines": [{"name": "main", "launch": {"memory_budget": "512MiB"}}]})
    assert ok.engines[0].launch.memory_budget == "512MiB"


def test_hub_ids_are_told_apart_from_paths():
    from inferctl.controller.config import looks_like_hub_id

    assert looks_like_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert not looks_like_hub_id("models/missing.bin")           # a file name: a path
    assert not looks_like_hub_id("../shared/models/stories260K")  # relative path
    assert not looks_like_hub_id("/abs/path")
