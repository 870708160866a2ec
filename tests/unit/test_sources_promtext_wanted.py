"""The whole-text pass of parse_prometheus_text with ``keep`` (controller/scrape/promtext.py
``_wanted_lines``/``_parse_wanted``: one regex finds the lines that matter) gives exactly what the
line loop gives: the same samples, names, bad lines and snapshots (fields, "no data", invalid),
on the vLLM captures in ../shared/fixtures and on damaged and odd texts."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest

from inferctl.controller.engines import bundled
from inferctl.controller.engines import promtext as engines_promtext
from inferctl.controller.scrape import promtext

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
KEEPS = {**engines_promtext._KEEP, "bundled": bundled._KEEP}
ODD = ["\r", "\r\n", "\v", "\f", "\x1c", "\x1f", "\x85", "\u2028", "\ufeff", "\xa0", "é", "\x00", "\t", "  ", "#", "{",
       "}", "\\", '"', "=", ",", " TYPE ", "_total", "_bucket", "..."]
SMALL = [
    "", "\n\n", "garbage", "...", "{engine=\"0\"} 3\n", "vllm:num_requests_running",
    "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions 4\n",
    "vllm:num_preemptions 4\n# TYPE vllm:num_preemptions counter\nvllm:num_preemptions 5\n",
    "#x TYPE vllm:num_preemptions counter\nvllm:num_preemptions 4\n",
    " # TYPE vllm:num_preemptions counter\n vllm:num_preemptions 1",
    "# TYPE vllm:num_preemptions counter extra\nvllm:num_preemptions 4\n",
    "#TYPE vllm:num_preemptions counter\nvllm:num_preemptions 4\n",
    "vllm:num_requests_running{engine=\"0\",engine=\"1\"} 2\n", "vllm:num_requests_running{a=\"b\"}3\n",
    "vllm:num_requests_running {} 3\n", "vllm:num_requests_running{} 3 1700000000000\n",
    "vllm:num_requests_running\t\t3\t",
    "vllm:num_requests_runningx 3\n", "vllm:num_requests_running{\n",
    "vllm:num_requests_running 3 # comment\n",
    "9vllm:num_requests_running 3\n", "vllm:num_requests_running-x 3\n", "vllm:num_requests_waiting{a=\"\\\"\"} 3\n",
    "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} -0.4\n",
    "vllm:num_requests_running 3\r\nvllm:num_requests_waiting 4\r\n", "\ufeffvllm:num_requests_running 3\n",
    "vllm:num_requests_running 3\x1fvllm:num_requests_waiting 4\n",
    "tgi_queue_size 2\n# TYPE tgi_request_success counter\ntgi_request_success 4\n",
    "llamacpp:requests_processing 1\nllamacpp:kv_cache_usage_ratio 0.3\n",
]


def loop(text: str, keep: frozenset[str] | None, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """parse_prometheus_text by the line loop only (the reference)."""
    with monkeypatch.context() as m:
        m.setattr(promtext, "_plain_text", lambda _text: False)
        return promtext.parse_prometheus_text(text, keep)


def texts() -> list[str]:
    vllm = FIXTURES / "vllm" / "metrics_samples.txt"
    if not vllm.exists():
        pytest.skip("no vLLM captures in ../shared/fixtures")
    whole = vllm.read_text()
    blocks = ["# SOURCE" + b for b in whole.split("# SOURCE")[1:]] + [whole]
    rng = random.Random(5)
    out = list(blocks) + SMALL
    for b in blocks:
        lines = b.splitlines()
        for i, line in enumerate(lines):
            def put(new: str, i: int = i) -> None:
                out.append("\n".join(lines[:i] + [new] + lines[i + 1:]))
            out.append("\n".join(lines[:i]))                              # truncated
            put(line[: len(line) // 2])                                   # a cut line
            put(line.replace(" ", "\t"))
            put(line.replace('"', '\\"', 1))
            put(line + " 123")
            put(line.replace("vllm:", "vllm: ", 1))
            put(line.replace("vllm:", "", 1))
            put("x" + line)
            put(line.replace("{", " {", 1))
            put(line.rsplit(" ", 1)[0] + " " + rng.choice(["NaN", "-1", "+Inf", "1e5", "x", "1_0", "0x10", "2.5"]))
            put(line.replace("gauge", "counter").replace("_total", ""))
            put(line.replace("# TYPE", "#TYPE"))
            j = rng.randint(0, len(line))
            put(line[:j] + rng.choice(ODD) + line[j:])
            out.append("\n".join(lines[i:] + lines[:i]))                # the order of TYPE and samples changes
    return out


def test_the_wanted_lines_pass_equals_the_line_loop_on_captures_and_damaged_texts(monkeypatch):
    n_fast = 0
    for t in texts():
        for keep in KEEPS.values():
            got = repr(promtext.parse_prometheus_text(t, keep))       # repr: NaN values compare equal
            assert got == repr(loop(t, keep, monkeypatch)), (t[:300], sorted(keep)[:3])
            n_fast += promtext._plain_text(t) and promtext._parse_wanted(t, keep) is not None
    assert n_fast > 1000                   # most of them took the new pass


def test_snapshots_are_the_same_fields_missing_and_invalid(monkeypatch):
    for t in texts()[:800]:
        for flavor in engines_promtext.FLAVORS:
            fast = engines_promtext.snapshot_from_metrics_text(t, name="e", flavor=flavor, now=5.0)
            with monkeypatch.context() as m:
                m.setattr(promtext, "_plain_text", lambda _text: False)
                ref = engines_promtext.snapshot_from_metrics_text(t, name="e", flavor=flavor, now=5.0)
            assert repr(dataclasses.asdict(fast)) == repr(dataclasses.asdict(ref)), (flavor, t[:300])


def test_families_not_read_are_no_data_and_never_reach_the_sample_parser(monkeypatch):
    seen: list[str] = []
    real = promtext._fast_sample
    monkeypatch.setattr(promtext, "_fast_sample", lambda line, counters: seen.append(line) or real(line, counters))
    text = ("# HELP vllm:request_queue_time_seconds x\n# TYPE vllm:request_queue_time_seconds histogram\n"
            + "".join(f'vllm:request_queue_time_seconds_bucket{{le="{i}"}} {i}\n' for i in range(50))
            + "vllm:num_requests_running 3\n")
    samples, bad = promtext.parse_prometheus_text(text, engines_promtext._KEEP["vllm"])
    assert [(s.name, s.value) for s in samples] == [("vllm:num_requests_running", 3.0)] and bad == []
    assert seen == ["vllm:num_requests_running 3"]
    snap = engines_promtext.snapshot_from_metrics_text(text, name="e", flavor="vllm")
    assert snap.running == 3 and snap.waiting is None and "waiting" in snap.missing and snap.invalid == []


def test_a_counter_type_line_counts_only_before_its_samples():
    keep = engines_promtext._KEEP["vllm"]
    text = "vllm:num_preemptions 4\n# TYPE vllm:num_preemptions counter\nvllm:num_preemptions 5\n"
    samples, _ = promtext.parse_prometheus_text(text, keep)
    assert [s.name for s in samples] == ["vllm:num_preemptions", "vllm:num_preemptions_total"]


def test_a_line_for_prometheus_client_and_odd_characters_take_the_line_loop(monkeypatch):
    keep = engines_promtext._KEEP["vllm"]
    escaped = 'vllm:request_success_total{finished_reason="a\\"b"} 2\n'
    assert promtext._parse_wanted(escaped, keep) is None           # needs prometheus-client's parser
    samples, bad = promtext.parse_prometheus_text(escaped, keep)
    assert [(s.labels, s.value) for s in samples] == [({"finished_reason": 'a"b'}, 2.0)] and bad == []
    for odd in ("\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\u2028", "é"):
        text = f"vllm:num_requests_running 3{odd}\nvllm:num_requests_waiting 4\n"
        assert not promtext._plain_text(text)
        assert repr(promtext.parse_prometheus_text(text, keep)) == repr(loop(text, keep, monkeypatch))
    assert promtext._plain_text("vllm:num_requests_running 3\t\x00\n")


def test_the_garbage_lines_are_still_reported():
    text = "...\nvllm:num_requests_running 2\n???\n"
    samples, bad = promtext.parse_prometheus_text(text, engines_promtext._KEEP["vllm"])
    assert [s.value for s in samples] == [2.0] and bad == ["...", "???"]


@pytest.mark.parametrize("words", [["a"], ["a", "ab", "abc", "b"], ["ab", "ac"], ["x:y_total", "x:y", "x:y_count"],
                                   sorted(engines_promtext._KEEP["vllm"])])
def test_the_name_alternation_matches_exactly_its_words(words):
    pattern = re.compile("(?:" + promtext._trie(words) + ")")
    assert all(pattern.fullmatch(w) for w in words)
    others = {w[:-1] for w in words} | {w + "x" for w in words} | {w + "_" for w in words} | {"", "b" + words[0]}
    assert not [w for w in others - set(words) if pattern.fullmatch(w)]
