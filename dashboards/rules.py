"""The rule types of the generated Prometheus rule files, shared by :mod:`dashboards.alerts`
and :mod:`dashboards.slo`: recording rules, alerting rules, groups, and :func:`spoken`
(a Prometheus duration in words for alert texts).

Rule file format: https://prometheus.io/docs/prometheus/latest/configuration/alerting_rules/
and https://prometheus.io/docs/prometheus/latest/configuration/recording_rules/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

_UNIT_WORDS = {"ms": "millisecond", "s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "y": "year"}


def spoken(duration: str, one: str = "") -> str:
    """A Prometheus duration in words for alert texts: ``"5m"`` -> ``"5 minutes"``; a single
    unit -> ``one`` + the unit (``"1h"`` -> ``"hour"``, with ``one="a "``: ``"a day"``); a
    compound duration (``"1h30m"``) is returned as is."""
    unit = duration.lstrip("0123456789")
    count = duration[:len(duration) - len(unit)]
    if unit not in _UNIT_WORDS or not count:
        return duration
    if count == "1":
        return f"{'an ' if one == 'a ' and unit == 'h' else one}{_UNIT_WORDS[unit]}"
    return f"{count} {_UNIT_WORDS[unit]}s"


@dataclass(frozen=True)
class RecordingRule:
    """``record``: the output name; ``labels``: the label names the output carries (for the
    lint of expressions that read it); ``static``: constant labels added by the rule."""

    record: str
    expr: str
    labels: tuple[str, ...]
    static: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        out: dict = {"record": self.record, "expr": self.expr}
        if self.static:
            out["labels"] = dict(self.static)
        return out


@dataclass(frozen=True)
class AlertRule:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    #: constant labels besides ``severity`` that tell rules of one alert name apart (promtool
    #: rejects two rules with the same name and labels), e.g. ``(("long_window", "1h"),)``.
    labels: tuple[tuple[str, str], ...] = ()

    def to_dict(self, runbook_base_url: str) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, **dict(self.labels)},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": f"{runbook_base_url}{self.name}.md",
            },
        }


@dataclass(frozen=True)
class RuleGroup:
    name: str
    rules: tuple[RecordingRule | AlertRule, ...]
