"""Static checks of the PromQL that dashboards and rules carry.

A small lexer (no PromQL parser library is installed, and Prometheus' own parser is Go)
that finds, in one expression:

- the vector selectors (metric name + label matchers) and the calls enclosing each;
- the grouping label lists (``by``/``without``/``on``/``ignoring``/``group_left``/``group_right``);
- each division and whether its right operand is guarded against zero.

Lexical rules follow the PromQL reference
(https://prometheus.io/docs/prometheus/latest/querying/basics/): identifiers
``[a-zA-Z_:][a-zA-Z0-9_:]*``, strings in ``"``, ``'`` or backticks, label matchers in ``{}``,
ranges/subqueries in ``[]``. Grafana's ``$__rate_interval``-style variables are skipped inside
``[]`` and lexed as a duration after ``offset``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from inferctl.dashboards.catalog import Series

AGGREGATORS = frozenset({
    "sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk",
    "quantile", "count_values", "limitk", "limit_ratio",
})
GROUPING_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
OTHER_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "Inf", "NaN"})

_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(r"(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(?:ms|s|m|h|d|w|y)*")
_MATCHER = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"
                      r"(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*,?")
_VARIABLE = re.compile(r"\$(?:\{[A-Za-z0-9_:.]+\}|[A-Za-z_][A-Za-z0-9_]*)")   # Grafana: $__interval, ${x}
_OPS = ("==", "!=", ">=", "<=", "=~", "!~")


class PromQLSyntaxError(ValueError):
    """The expression could not be lexed (unterminated string, bracket, or a stray character)."""


@dataclass(frozen=True)
class Token:
    kind: str    # ident, number, string, matchers, range, op, lparen, rparen, comma
    text: str
    pos: int


@dataclass
class Selector:
    """A vector selector: ``name`` (``None`` when only matchers are given), its matchers as
    ``(label, op, value)`` and the calls that enclose it, innermost first."""

    name: str | None
    matchers: tuple[tuple[str, str, str], ...]
    enclosing: tuple[str, ...]


@dataclass
class Analysis:
    selectors: list[Selector] = field(default_factory=list)
    grouping_labels: set[str] = field(default_factory=set)
    divisions: list[tuple[int, bool]] = field(default_factory=list)   # (position, guarded)


def _read_delimited(expr: str, start: int, close: str) -> int:
    """Index just past the ``close`` that ends the bracket opened at ``start`` (strings skipped)."""
    i = start + 1
    while i < len(expr):
        ch = expr[i]
        if ch in "\"'`":
            i = _read_string(expr, i)
            continue
        if ch == close:
            return i + 1
        i += 1
    raise PromQLSyntaxError(f"unterminated {expr[start]!r} at {start} in {expr!r}")


def _read_string(expr: str, start: int) -> int:
    quote = expr[start]
    i = start + 1
    while i < len(expr):
        if expr[i] == "\\" and quote != "`":
            i += 2
            continue
        if expr[i] == quote:
            return i + 1
        i += 1
    raise PromQLSyntaxError(f"unterminated string at {start} in {expr!r}")


def tokenize(expr: str) -> list[Token]:
    """Split ``expr`` into tokens. Raises :class:`PromQLSyntaxError` on a stray character."""
    tokens: list[Token] = []
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch.isspace():
            i += 1
        elif ch in "\"'`":
            j = _read_string(expr, i)
            tokens.append(Token("string", expr[i:j], i))
            i = j
        elif ch == "{":
            j = _read_delimited(expr, i, "}")
            tokens.append(Token("matchers", expr[i + 1:j - 1], i))
            i = j
        elif ch == "[":
            j = _read_delimited(expr, i, "]")
            tokens.append(Token("range", expr[i + 1:j - 1], i))
            i = j
        elif ch == "(":
            tokens.append(Token("lparen", ch, i))
            i += 1
        elif ch == ")":
            tokens.append(Token("rparen", ch, i))
            i += 1
        elif ch == ",":
            tokens.append(Token("comma", ch, i))
            i += 1
        elif ch.isdigit() or (ch == "." and i + 1 < len(expr) and expr[i + 1].isdigit()):
            m = _NUMBER.match(expr, i)
            if m is None or m.end() == i:
                raise PromQLSyntaxError(f"bad number at {i} in {expr!r}")
            tokens.append(Token("number", m.group(0), i))
            i = m.end()
        elif _IDENT.match(expr, i):
            m = _IDENT.match(expr, i)
            tokens.append(Token("ident", m.group(0), i))
            i = m.end()
        elif ch == "$":
            m = _VARIABLE.match(expr, i)
            if m is None:
                raise PromQLSyntaxError(f"bad Grafana variable at {i} in {expr!r}")
            tokens.append(Token("variable", m.group(0), i))
            i = m.end()
        elif expr[i:i + 2] in _OPS:
            tokens.append(Token("op", expr[i:i + 2], i))
            i += 2
        elif ch in "+-*/%^<>":
            tokens.append(Token("op", ch, i))
            i += 1
        else:
            raise PromQLSyntaxError(f"unexpected character {ch!r} at {i} in {expr!r}")
    return tokens


def parse_matchers(text: str) -> tuple[tuple[str, str, str], ...]:
    """``job="x", mode=~"a|b"`` → ``(("job", "=", "x"), ("mode", "=~", "a|b"))``."""
    out = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _MATCHER.match(text, pos)
        if m is None:
            raise PromQLSyntaxError(f"bad label matchers {{{text}}}")
        out.append((m.group(1), m.group(2), m.group(3)[1:-1]))
        pos = m.end()
    return tuple(out)


def _skip_label_list(tokens: list[Token], i: int, labels: set[str]) -> int:
    """At ``tokens[i]`` == ``(`` of a grouping list: collect the names; return index past ``)``."""
    i += 1
    while i < len(tokens) and tokens[i].kind != "rparen":
        if tokens[i].kind == "ident":
            labels.add(tokens[i].text)
        i += 1
    return i + 1


def _guarded(tokens: list[Token], i: int) -> bool:
    """Is the division's right operand, starting at ``tokens[i]``, safe against zero?

    Safe: a non-zero number literal, or a parenthesised expression whose last comparison is
    ``> 0`` (``/ (x > 0)``: where ``x`` is 0 the sample is dropped, so the quotient is no data
    rather than ±Inf or NaN; Prometheus issue #6611).
    """
    while (i < len(tokens) and tokens[i].kind == "ident"
           and tokens[i].text in ("on", "ignoring", "group_left", "group_right", "bool")):
        i += 1
        if i < len(tokens) and tokens[i].kind == "lparen":
            i = _skip_label_list(tokens, i, set())
    if i >= len(tokens):
        return False
    tok = tokens[i]
    if tok.kind == "number":
        return float(re.sub(r"[a-z]+$", "", tok.text) or 0) != 0.0
    if tok.kind != "lparen":
        return False
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].kind == "lparen":
            depth += 1
        elif tokens[j].kind == "rparen":
            depth -= 1
            if depth == 0:
                return (j - 2 > i and tokens[j - 2].kind == "op" and tokens[j - 2].text == ">"
                        and tokens[j - 1].kind == "number" and float(tokens[j - 1].text) == 0.0)
    return False


def analyze(expr: str) -> Analysis:
    """Selectors, grouping labels and divisions of ``expr`` (see the module docstring)."""
    tokens = tokenize(expr)
    result = Analysis()
    stack: list[str | None] = []     # call name (or None for a plain parenthesis) per open paren
    pending: str | None = None       # a function/aggregator name waiting for its "("
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if tok.kind == "ident":
            word = tok.text
            if word in GROUPING_KEYWORDS:
                if nxt is not None and nxt.kind == "lparen":
                    i = _skip_label_list(tokens, i + 1, result.grouping_labels)
                    continue
            elif word in OTHER_KEYWORDS:
                pass
            elif word in AGGREGATORS and nxt is not None and (
                    nxt.kind == "lparen" or (nxt.kind == "ident" and nxt.text in ("by", "without"))):
                pending = word
            elif nxt is not None and nxt.kind == "lparen":
                pending = word
            else:
                matchers: tuple = ()
                if nxt is not None and nxt.kind == "matchers":
                    matchers = parse_matchers(nxt.text)
                    i += 1
                result.selectors.append(Selector(word, matchers, tuple(n for n in reversed(stack) if n)))
        elif tok.kind == "matchers":
            matchers = parse_matchers(tok.text)
            name = next((v for (lbl, op, v) in matchers if lbl == "__name__" and op == "="), None)
            result.selectors.append(Selector(name, matchers, tuple(n for n in reversed(stack) if n)))
        elif tok.kind == "lparen":
            stack.append(pending)
            pending = None
        elif tok.kind == "rparen":
            if not stack:
                raise PromQLSyntaxError(f"unbalanced ')' at {tok.pos} in {expr!r}")
            stack.pop()
        elif tok.kind == "op" and tok.text == "/":
            result.divisions.append((tok.pos, _guarded(tokens, i + 1)))
        i += 1
    if stack:
        raise PromQLSyntaxError(f"unbalanced '(' in {expr!r}")
    return result


def check_expression(expr: str, series: Mapping[str, Series], recorded: Mapping[str, frozenset[str]],
                     gauges: frozenset[str]) -> list[str]:
    """Problems with one expression, as sentences naming the culprit (empty list: fine).

    Args:
        expr: the PromQL text.
        series: the catalog's exposed series (:func:`dashboards.catalog.exposed_series`).
        recorded: recording-rule outputs this expression may also read, with their labels.
        gauges: catalog gauge names, which must not be summed (aggregate gauges with avg/max).

    Checks: every selector names a catalog/recorded series; every matcher's label exists on
    that series; every grouping label exists on some selected series; no ``sum`` directly over
    a gauge; every division's denominator is guarded (``/ (den > 0)``) or a non-zero constant.
    """
    problems: list[str] = []
    try:
        found = analyze(expr)
    except PromQLSyntaxError as exc:
        return [str(exc)]
    known_labels: set[str] = set()
    for sel in found.selectors:
        if sel.name is None:
            problems.append(f"selector without a metric name in {expr!r}")
            continue
        if sel.name in series:
            labels = series[sel.name].labels
        elif sel.name in recorded:
            labels = recorded[sel.name]
        else:
            problems.append(f"{sel.name!r} is not in the metric catalog (nor a recording rule): {expr!r}")
            continue
        known_labels |= labels
        for label, _op, _value in sel.matchers:
            if label != "__name__" and label not in labels:
                problems.append(f"{sel.name}: label {label!r} is not one of {sorted(labels)}")
        if sel.name in gauges and sel.enclosing and sel.enclosing[0] == "sum":
            problems.append(f"gauge {sel.name} is aggregated with sum (use avg or max): {expr!r}")
    for label in sorted(found.grouping_labels - known_labels):
        problems.append(f"grouping label {label!r} exists on none of the selected series: {expr!r}")
    for pos, guarded in found.divisions:
        if not guarded:
            problems.append(f"unguarded denominator at {pos} (write '/ (den > 0)'): {expr!r}")
    return problems
