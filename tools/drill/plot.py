"""The drill's PNG plot: precision mode, memory and request latency over time (matplotlib, Agg),
meant to be pasted into a post-mortem: the OOM / int8 / rollback instants are marker lines named
in a legend (not labels that collide when two instants are close), each phase is a shaded band
named once, rotated, at its start."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from inferctl.contract.units import MiB
from inferctl.tools.drill.report import DrillReport

#: The marker lines: (legend label, colour, line style)
MARKS = (("OOM", "red", "--"), ("int8 reported", "purple", "-."), ("full precision again", "green", ":"))
#: Phase bands alternate these two background colours
BANDS = ("#f2f2f2", "#ffffff")


def build_figure(report: DrillReport) -> Any:
    """The matplotlib Figure of :func:`plot_report` (three panels sharing the time axis, seconds
    since the drill started). Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = report.started
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, sharex=True, figsize=(11, 8.5))
    ts = [s.t - t0 for s in report.samples]
    ax1.step(ts, [1 if s.precision == "int8" else 0 if s.precision == "full" else math.nan for s in report.samples],
             where="post", color="tab:purple")
    ax1.set_yticks([0, 1], ["full", "int8"])
    ax1.set_ylim(-0.3, 1.3)
    ax1.set_ylabel("precision")
    for name, key in (("allocated", "allocated_bytes"), ("reserved", "reserved_bytes"), ("budget", "budget_bytes")):
        ax2.plot(ts, [(getattr(s, key) or math.nan) / MiB for s in report.samples], label=name)
    ax2.set_ylabel("memory (MiB)")
    ax2.legend(loc="upper left", fontsize="small")
    ok = [r for r in report.requests if r.outcome == "ok" and r.end is not None]
    bad = [r for r in report.requests if r.outcome != "ok"]
    ax3.scatter([r.end - t0 for r in ok], [r.latency for r in ok], s=6, label="ok")
    if bad:
        ax3.scatter([(r.end or report.ended) - t0 for r in bad], [(r.latency or 0) for r in bad], s=14,
                    color="red", marker="x", label="failed/lost")
    ax3.set_ylabel("request latency (s)")
    ax3.set_xlabel("seconds since the drill started")
    ax3.legend(loc="upper left", fontsize="small")
    # phases: shaded bands, each named once above the top panel at its start
    ends = [t for _, t in report.phases[1:]] + [report.ended]
    names = []
    for i, ((ph, t), end) in enumerate(zip(report.phases, ends)):
        for ax in (ax1, ax2, ax3):
            ax.axvspan(t - t0, end - t0, color=BANDS[i % 2], zorder=0, linewidth=0)
        names.append(ax1.text(t - t0, 1.02, ph, transform=ax1.get_xaxis_transform(), ha="left", va="bottom",
                              fontsize="small", color="dimgrey"))
    # the instants: marker lines, named in one legend
    times = (report.oom["time"] if report.oom else None, report.int8_seen, report.full_seen)
    handles = []
    for (label, color, style), t in zip(MARKS, times):
        if t is None:
            continue
        for ax in (ax1, ax2, ax3):
            line = ax.axvline(t - t0, color=color, linestyle=style, linewidth=1.2, label=label)
        handles.append(line)
    if handles:
        ax1.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small",
                   title="instants", title_fontsize="small")
    fig.suptitle(f"inferctl drill oom — {report.model}")
    fig.tight_layout()
    _unstack(fig, names)
    return fig


def _unstack(fig: Any, texts: list[Any], step: float = 0.14) -> None:
    """Lift each text one row (``step`` axes heights) above any earlier one it would overlap,
    so phase names that start close together stay readable."""
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    for text in texts:
        x, y = text.get_position()
        while any(text.get_window_extent(renderer).overlaps(o.get_window_extent(renderer)) for o in placed):
            y += step
            text.set_position((x, y))
        placed.append(text)
    if placed:
        fig.tight_layout()


def plot_report(report: DrillReport, path: str | Path) -> Path:
    """PNG: precision mode, memory (allocated, reserved, budget, MiB) and request latency over
    time, with the OOM, int8 and rollback instants as marker lines named in a legend and the
    phases as named bands (:func:`build_figure`). Matplotlib, Agg backend."""
    import matplotlib.pyplot as plt

    fig = build_figure(report)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
