"""Prometheus text exposition -> samples, tolerant of a damaged scrape.

Parsing is prometheus-client's (``prometheus_client.parser.text_string_to_metric_families``);
when a scrape does not parse as a whole (truncated, an excerpt with ``...``), it is parsed line
by line and the lines that still fail are returned instead of failing the scrape. Used for
engines' ``/metrics`` (vLLM, TGI, llama.cpp, the bundled engine) and dcgm-exporter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class PromSample:
    """One sample line: ``name{labels} value``."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus_text(text: str) -> tuple[list[PromSample], list[str]]:
    """Parse Prometheus text exposition with prometheus-client's parser.

    Returns ``(samples, bad_lines)``. When the whole text does not parse (a truncated scrape,
    an excerpt with ``...``), it is parsed line by line and the lines that still fail are
    returned in ``bad_lines`` instead of failing the scrape. Counter samples keep the name the
    parser gives them (prometheus-client appends ``_total`` to a counter family's bare samples).
    """
    try:
        return _samples(text_string_to_metric_families(text)), []
    except (ValueError, TypeError, IndexError):
        pass
    samples: list[PromSample] = []
    bad: list[str] = []
    type_lines: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                type_lines[parts[2]] = line
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


def _samples(families: Iterable[Any]) -> list[PromSample]:
    out = []
    for fam in families:
        for s in fam.samples:
            out.append(PromSample(s.name, dict(s.labels), float(s.value)))
    return out
