"""The fast path of the Prometheus text parser (controller/scrape/promtext.py) gives the same
samples as prometheus-client's parser, on real captures and on the awkward corners of the format."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferctl.controller.scrape.promtext import _fast_sample, parse_prometheus_text

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"


def reference(text: str) -> list[tuple]:
    return [(s.name, dict(s.labels), float(s.value)) for f in text_string_to_metric_families(text) for s in f.samples]


def ours(text: str) -> list[tuple]:
    samples, bad = parse_prometheus_text(text)
    assert bad == []
    return [(s.name, s.labels, s.value) for s in samples]


def same(a: list[tuple], b: list[tuple]) -> bool:
    norm = [[(n, sorted(lab.items()), "nan" if math.isnan(v) else v) for n, lab, v in x] for x in (a, b)]
    return sorted(norm[0]) == sorted(norm[1])


def captures() -> list[str]:
    texts = []
    vllm = FIXTURES / "vllm" / "metrics_samples.txt"
    if vllm.exists():
        texts += ["# SOURCE" + b for b in vllm.read_text().split("# SOURCE")[1:]]
    dcgm = FIXTURES / "dcgm" / "metrics_samples.txt"
    if dcgm.exists():
        texts.append(dcgm.read_text())
    good = []
    for t in texts:
        try:
            reference(t)
        except (ValueError, TypeError, IndexError):
            continue                       # damaged excerpts: the line-by-line path, tested below
        good.append(t)
    return good


def test_real_captures_parse_the_same_as_prometheus_client():
    texts = captures()
    if not texts:
        pytest.skip("no captures in ../shared/fixtures")
    for t in texts:
        assert same(ours(t), reference(t)), t[:200]


def test_a_prometheus_client_registry_parses_the_same():
    reg = CollectorRegistry()
    Counter("reqs", "r", ["model"], registry=reg).labels(model='a "quoted" \\ one\nline').inc(3)
    Counter("done_total", "d", registry=reg).inc()
    Gauge("kv:usage", "k", ["engine"], registry=reg).labels(engine="0").set(float("nan"))
    h = Histogram("ttft_seconds", "t", ["model"], registry=reg)
    h.labels(model="m").observe(0.3)
    h.labels(model="m").observe(float("inf"))
    text = generate_latest(reg).decode()
    assert same(ours(text), reference(text))


@pytest.mark.parametrize("line", [
    'x{a="b",} 1 123', "y 1e3", "v +Inf", "w -Inf", "n NaN", 'z{a="1",b="2"} 0.5', "t 7 -1700000000",
])
def test_plain_lines_take_the_fast_path_with_the_reference_value(line):
    fast = _fast_sample(line, set())
    assert fast is not None
    assert same([(fast.name, fast.labels, fast.value)], reference(line + "\n"))


@pytest.mark.parametrize("line", [
    'z{a="q\\"x"} 2', 'p{path="/{id}"} 1', "u 1_000", 'd{a="1",a="2"} 1', "bad{a=b} 1", "...", "x y",
])
def test_other_lines_are_left_to_prometheus_client(line):
    assert _fast_sample(line, set()) is None


def test_a_counter_family_bare_sample_gets_total_and_damaged_lines_are_returned():
    samples, bad = parse_prometheus_text("# TYPE foo counter\nfoo 3\n...\nbar{a=\"1\"} 2\ngarbage {{{\n")
    assert [(s.name, s.value) for s in samples] == [("foo_total", 3.0), ("bar", 2.0)]
    assert bad == ["...", "garbage {{{"]


def test_label_blocks_cached_by_text_give_each_sample_its_own_dict() -> None:
    """The label block -> labels cache: a repeated block gives equal but separate dicts (a caller
    editing one does not change the next parse), a block with a label given twice still goes to
    the slow path (and is reported), and a block differing by one character is parsed anew."""
    text = 'a{engine="0",model_name="m"} 1\nb{engine="0",model_name="m"} 2\nc{engine="1",model_name="m"} 3\n'
    first, bad = parse_prometheus_text(text)
    assert bad == [] and [s.labels for s in first] == [{"engine": "0", "model_name": "m"}] * 2 + [
        {"engine": "1", "model_name": "m"}]
    assert first[0].labels is not first[1].labels
    first[0].labels["engine"] = "edited"
    again, _ = parse_prometheus_text(text)
    assert again[0].labels == {"engine": "0", "model_name": "m"}
    assert _fast_sample('d{x="1",x="2"} 4', set()) is None
    samples, bad = parse_prometheus_text('d{x="1",x="2"} 4\n')
    assert samples == [] and bad == ['d{x="1",x="2"} 4']


@pytest.mark.parametrize("line", ["...", "garbage{{{", 'x{a="1"}', "name_only", "12345", "5"])
def test_a_line_without_a_blank_is_damaged_without_asking_prometheus_client(line, monkeypatch):
    """A sample needs a blank before its value: prometheus-client refuses every line without one
    (checked here), and the parser reports it as damaged without running that parser (~0.1 ms a
    line: a truncated scrape, an excerpt's ``...``)."""
    with pytest.raises((ValueError, TypeError, IndexError)):
        list(text_string_to_metric_families(line + "\n"))
    import inferctl.controller.scrape.promtext as promtext

    def refuse(text: str):
        raise AssertionError(f"slow parser asked for {text!r}")
    monkeypatch.setattr(promtext, "text_string_to_metric_families", refuse)
    samples, bad = parse_prometheus_text(f"# TYPE {line} gauge\nok 1\n{line}\n")
    assert [(s.name, s.value) for s in samples] == [("ok", 1.0)] and bad == [line]


@pytest.mark.parametrize("line", ['a{b="1"} 2', "a 1", "a\t1", "a", "", "{x} 1", 'a_b:c{d="e f"} 3', " lead 1", "x{ 1"])
def test_the_sample_name_is_read_in_one_match(line):
    from inferctl.controller.scrape.promtext import _HEAD, _sample_name

    assert _HEAD.match(line).group() == _sample_name(line)


def test_help_lines_are_skipped_and_type_lines_still_read():
    text = ("# HELP foo The TYPE of foo is counter\n# TYPE foo counter\nfoo 3\n"
            "# HELP bar a counter named bar\nbar 4\n#TYPE baz counter\nbaz 5\n")
    samples, bad = parse_prometheus_text(text)
    assert [(s.name, s.value) for s in samples] == [("foo_total", 3.0), ("bar", 4.0), ("baz", 5.0)] and bad == []
    assert ours(text) == reference(text)
