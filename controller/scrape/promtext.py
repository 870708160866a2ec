"""Prometheus text exposition -> samples, tolerant of a damaged scrape.

Plain sample lines (``name{label="value",...} value [timestamp]`` with no escape in a label
value: every line of a vLLM, TGI, llama.cpp or dcgm-exporter scrape) are read by one regular
expression, with prometheus-client's own naming (a counter family's bare sample gets ``_total``);
any other line is parsed by prometheus-client
(``prometheus_client.parser.text_string_to_metric_families``) with its ``# TYPE`` line, and the
lines that still fail are returned instead of failing the scrape (a truncated scrape, an excerpt
with ``...``). Why: prometheus-client's parser reads character by character, about 30 µs a
sample, the largest CPU cost of a poll at 1,024 engines; the regular expression is ~10× less.
tests/unit/test_sources_promtext_fast.py checks both give the same samples. With ``keep`` (the
families a caller reads) and a plain ASCII text, one regular expression over the whole text finds
the lines that matter and the rest is never split nor stripped in Python
(tests/unit/test_sources_promtext_wanted.py: the same answer as the line loop). Used for
engines' ``/metrics`` (vLLM, TGI, llama.cpp, the bundled engine) and dcgm-exporter.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Iterable

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, init=False)
class PromSample:
    """One sample line: ``name{labels} value``.

    Immutable like any frozen dataclass; its ``__init__`` fills the instance dict in one call
    instead of the generated three ``object.__setattr__`` calls (one sample per kept line of
    every scrape; as ``controller.signals.values.Signal`` does)."""

    name: str
    labels: dict[str, str]
    value: float

    def __init__(self, name: str, labels: dict[str, str], value: float) -> None:
        object.__setattr__(self, "__dict__", {"name": name, "labels": labels, "value": value})


#: A plain sample line: metric name, optional label block, value, optional timestamp
#: (https://prometheus.io/docs/instrumenting/exposition_formats/#text-format-details).
_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^{}\\]*)\})?[ \t]+([^ \t]+)(?:[ \t]+-?[0-9]+)?[ \t]*")
#: One ``name="value"`` pair of a label block (no escapes: a block with a backslash is not fast).
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"]*)"[ \t]*(?:,|$)')
#: Values prometheus-client reads (Go's ParseFloat: no ``_`` separators, no ``infinity`` words).
_VALUE = re.compile(r"[+-]?(?:[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+\.|Inf|NaN)")


#: Sample-name suffixes of a family (histogram/summary parts, counters' ``_total``/``_created``).
_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")


def family_filter(names: Iterable[str]) -> frozenset[str]:
    """The sample names to keep for the metric ``names`` a caller reads (bare or suffixed:
    ``vllm:prompt_tokens_total`` keeps ``vllm:prompt_tokens`` and ``..._total``; a histogram base
    keeps its ``_bucket``/``_sum``/``_count``), for :func:`parse_prometheus_text`'s ``keep``."""
    out: set[str] = set()
    for n in names:
        base = n
        for suf in _SUFFIXES:
            if n.endswith(suf):
                base = n[: -len(suf)]
                break
        out.add(n)
        out.add(base)
        out.update(base + suf for suf in _SUFFIXES)
    return frozenset(out)


def _sample_name(line: str) -> str:
    """The metric name a sample line starts with (up to ``{``, a space or a tab)."""
    end = len(line)
    for sep in ("{", " ", "\t"):
        i = line.find(sep, 0, end)
        if i >= 0:
            end = i
    return line[:end]


#: What :func:`_sample_name` returns: the text up to the first ``{``, space or tab.
_HEAD = re.compile(r"[^{ \t]*")
#: A metric name (https://prometheus.io/docs/concepts/data_model/#metric-names-and-labels).
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


#: ASCII characters at which ``str.splitlines`` splits (besides ``\n``) or that ``str.strip`` drops
#: (besides blanks and tabs): a text with one of them, or not ASCII (``\x85``, ``\u2028``, Unicode
#: blanks), takes the line loop; :func:`_wanted_lines` assumes neither.
_ODD_ASCII = ("\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f")


def _plain_text(text: str) -> bool:
    """True when ``text`` is ASCII without :data:`_ODD_ASCII` (``isascii`` and ``in`` are C scans;
    a character-class regex search costs ~8 ns a character)."""
    if not text.isascii():
        return False
    for c in _ODD_ASCII:
        if c in text:
            return False
    return True


def _trie(words: list[str]) -> str:
    """A regex alternation matching exactly ``words`` (non-empty), with common prefixes factored
    out (``vllm:(?:num_requests_(?:running|waiting)|...)``): the regex engine tries one branch
    per character instead of every word (a flat ``a|b|...`` of 60 names cost 4x the scan)."""
    groups: dict[str, list[str]] = {}
    end = False
    for w in words:
        if w:
            groups.setdefault(w[0], []).append(w[1:])
        else:
            end = True
    alts = [re.escape(c) + _trie(rest) for c, rest in groups.items()]
    if not alts:
        return ""
    body = alts[0] if len(alts) == 1 and not end else "(?:" + "|".join(alts) + ")"
    return body + "?" if end else body


@functools.lru_cache(maxsize=64)
def _wanted_lines(keep: frozenset[str]) -> re.Pattern[str]:
    """A pattern whose ``findall`` over ``"\n" + text`` (``text`` plain: :func:`_plain_text`)
    returns, in order, ``(type_line, sample_line, other_line)`` for exactly the lines that can
    change :func:`parse_prometheus_text`'s answer (one of the three non-empty, with its leading
    blanks): a comment whose second word is ``TYPE`` and third a name in ``keep`` (a family read:
    it may make a counter), a line starting with a name in ``keep``, and a non-blank line that
    starts neither with ``#`` nor with a metric name (garbage, to be reported). Skipped without a
    Python step: blank lines, the other comments (``# HELP``, the ``# TYPE`` lines of families not
    read: only prometheus-client's slow path needs those, and it is never taken here) and the
    samples of the families not read, most of a vLLM scrape. Each match starts with a literal
    newline, so the regex engine jumps from line to line (``^`` with ``re.M`` tries every
    character: 3x slower). Cached per ``keep`` set (one per flavor)."""
    names = _trie(sorted(keep))
    return re.compile(r"\n[ \t]*(?:(#[^ \t\n]*+[ \t]+TYPE[ \t]+(?:" + names + r")(?=[ \t\n]|$)[^\n]*)"
                      r"|((?:" + names + r")(?=[{ \t\n]|$)[^\n]*)"
                      r"|((?:[^#a-zA-Z_: \t\n]|[a-zA-Z_:][a-zA-Z0-9_:]*+[^a-zA-Z0-9_:{ \t\n])[^\n]*))")


def _parse_wanted(text: str, keep: frozenset[str]) -> tuple[list[PromSample], list[str]] | None:
    """:func:`parse_prometheus_text` of a plain ``text`` (:func:`_plain_text`) over the lines of
    :func:`_wanted_lines` only, or None when a line needs prometheus-client's parser (whose header
    lookup needs every ``# TYPE`` line): the caller then runs the whole line loop. The same
    samples, names and bad lines as the loop (tests/unit/test_sources_promtext_wanted.py)."""
    samples: list[PromSample] = []
    bad: list[str] = []
    counters: set[str] = set()
    for type_line, sample_line, other in _wanted_lines(keep).findall("\n" + text):
        if type_line:
            parts = type_line.split()
            if len(parts) >= 4 and parts[1] == "TYPE" and parts[3] == "counter" and not parts[2].endswith("_total"):
                counters.add(parts[2])
            continue
        line = (sample_line or other).strip()
        if sample_line:
            sample = _fast_sample(line, counters)
            if sample is not None:
                samples.append(sample)
                continue
        if " " in line or "\t" in line:
            return None                 # the slow path: needs the loop's header lookup
        bad.append(line)                # no blank, so no value (as the loop)
    return samples, bad


def parse_prometheus_text(text: str, keep: frozenset[str] | None = None) -> tuple[list[PromSample], list[str]]:
    """Parse Prometheus text exposition (see the module doc: a fast path for plain lines,
    prometheus-client's parser for the rest).

    ``keep``: when given (from :func:`family_filter`), a sample line whose metric name is not in
    it is skipped before it is parsed (a vLLM or engine scrape carries many families the
    controller never reads; skipping them is most of the parse's cost). A line that does not
    start with a metric name is still parsed, so garbage is still reported.

    Returns ``(samples, bad_lines)``: the lines neither reads are returned in ``bad_lines``
    instead of failing the scrape. Counter samples keep the name prometheus-client gives them
    (it appends ``_total`` to a counter family's bare samples).
    """
    if keep is not None and _plain_text(text):
        # only the lines that matter (see _wanted_lines), found in one C pass
        found = _parse_wanted(text, keep)
        if found is not None:
            return found
    samples: list[PromSample] = []
    bad: list[str] = []
    type_lines: dict[str, str] = {}
    counters: set[str] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if "TYPE" not in line:     # a HELP line or a comment: no split needed to skip it
                continue
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                type_lines[parts[2]] = line
                if parts[3] == "counter" and not parts[2].endswith("_total"):
                    counters.add(parts[2])
            continue
        if keep is not None:
            name = _HEAD.match(line).group()       # _sample_name(line) in one C call
            if name not in keep and _NAME.fullmatch(name) is not None:
                continue
        sample = _fast_sample(line, counters)
        if sample is not None:
            samples.append(sample)
            continue
        if " " not in line and "\t" not in line:
            # no blank, so no value: prometheus-client refuses every such line (a truncated
            # scrape's last line, an excerpt's ``...``); its parser took ~0.1 ms to say so
            bad.append(line)
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        header = ""
        for fam, tl in type_lines.items():
            if name == fam or name.startswith(fam + "_"):
                header = tl + "\n"
                break
        try:
            samples.extend(_samples(text_string_to_metric_families(header + line + "\n")))
        except (ValueError, TypeError, IndexError):
            bad.append(line)
    return samples, bad


def _fast_sample(line: str, counters: set[str]) -> PromSample | None:
    """``line`` as a sample when it is plain (see :data:`_LINE`), else None (the slow path)."""
    m = _LINE.fullmatch(line)
    if m is None:
        return None
    name, block, value = m.groups()
    if _VALUE.fullmatch(value) is None:
        return None
    if block:
        pairs = _label_pairs(block)
        if pairs is None:
            return None
        labels = dict(pairs)      # each sample its own dict (a caller may edit it)
    else:
        labels = {}
    if name in counters:
        name += "_total"
    return PromSample(name, labels, float(value))


@functools.lru_cache(maxsize=4096)
def _label_pairs(block: str) -> tuple[tuple[str, str], ...] | None:
    """A plain label block (the text between ``{`` and ``}``) -> its ``(name, value)`` pairs in
    order, or None when it is not plain (a gap the label pattern does not cover, a label given
    twice): the slow path decides then.

    Cached by the raw block string (a pure function; bounded, least recently used out): the
    same few blocks (``engine="0",model_name="..."``) recur on every line of every scrape of
    every engine of a model, so the regex pass runs once per distinct block, not per line."""
    labels: dict[str, str] = {}
    pos = 0
    for lm in _LABEL.finditer(block):
        if lm.start() != pos or lm.group(1) in labels:
            return None
        labels[lm.group(1)] = lm.group(2)
        pos = lm.end()
    if pos != len(block):
        return None
    return tuple(labels.items())


def _samples(families: Iterable[Any]) -> list[PromSample]:
    out = []
    for fam in families:
        for s in fam.samples:
            out.append(PromSample(s.name, dict(s.labels), float(s.value)))
    return out
