"""The quality summaries of an engine's recent-requests window, computed once per window.

An engine's ``requests.recent`` window changes only when a request finishes, while the
controller polls every second: most polls carry the same records as the poll before. The
summaries (:func:`~inferctl.controller.signals.quality.repetition_summary` and
:func:`~inferctl.controller.signals.quality.perplexity_summary`) are pure functions of the
records, so an equal window (``==`` on the list of records: every field of every record, in
order; each record is copied one level deep when stored) gives the same result, served from
memory instead of recomputed. The invalid samples the computation counted are counted again on
each reuse, so ``inferctl_invalid_samples_total`` grows exactly as if the window were recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from inferctl.controller.signals.quality import RepetitionSummary, perplexity_summary, repetition_summary
from inferctl.controller.signals.values import InvalidSampleCounter, Signal


class _Recorder:
    """Collects the ``(signal, reason)`` pairs a computation counts, in order."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str]] = []

    def record(self, signal: str, reason: str) -> None:
        self.records.append((signal, reason))


@dataclass(frozen=True)
class QualityWindow:
    """The summaries of one window: repetition (seq-rep-4, degenerate rate by bucket) and
    mean perplexity."""

    repetition: RepetitionSummary
    perplexity: Signal


class QualityMemo:
    """Per engine: the last window seen and its summaries. One per exporter; never global."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[list, QualityWindow, tuple[tuple[str, str], ...]]] = {}

    def summaries(self, engine: str, records: Sequence[Mapping[str, Any]],
                  counter: InvalidSampleCounter | None) -> QualityWindow:
        """The summaries of ``records`` (the /stats ``requests.recent`` list of dicts):
        recomputed when the window differs from ``engine``'s last one, else the last result,
        with its invalid samples counted in ``counter`` again."""
        last = self._last.get(engine)
        # compared with the stored window as given (``==`` on the records; a copy equals its
        # original), copied only when it is stored
        if last is not None and last[0] == records:
            for signal, reason in last[2]:
                if counter is not None:
                    counter.record(signal, reason)
            return last[1]
        # a copy of each record: the stored window cannot change under a later in-place edit
        window = [r.copy() if isinstance(r, dict) else r for r in records]
        rec = _Recorder()
        result = QualityWindow(repetition_summary(window, counter=rec), perplexity_summary(window, counter=rec))
        if counter is not None:
            for signal, reason in rec.records:
                counter.record(signal, reason)
        self._last[engine] = (window, result, tuple(rec.records))
        return result

    def forget(self, engine: str) -> None:
        """Drop ``engine``'s window (an engine removed from the configuration)."""
        self._last.pop(engine, None)
