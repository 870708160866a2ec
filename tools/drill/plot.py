"""The drill's PNG plot: precision mode, memory and request latency over time (matplotlib, Agg)."""

from __future__ import annotations

import math
from pathlib import Path

from inferctl.contract.units import MiB
from inferctl.tools.drill.report import DrillReport


def plot_report(report: DrillReport, path: str | Path) -> Path:
    """PNG: precision mode, memory (allocated, reserved, budget) and request latency over
    time, with the OOM, int8 and rollback instants marked. Matplotlib, Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = report.started
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, sharex=True, figsize=(10, 8))
    ts = [s.t - t0 for s in report.samples]
    ax1.step(ts, [1 if s.precision == "int8" else 0 if s.precision == "full" else math.nan for s in report.samples],
             where="post", color="tab:purple")
    ax1.set_yticks([0, 1], ["full", "int8"])
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
    marks = [("OOM", report.oom["time"] if report.oom else None, "red"),
             ("int8", report.int8_seen, "purple"), ("full again", report.full_seen, "green")]
    for ax in (ax1, ax2, ax3):
        for label, t, color in marks:
            if t is not None:
                ax.axvline(t - t0, color=color, linestyle="--", linewidth=1)
        for ph, t in report.phases:
            ax.axvline(t - t0, color="grey", linestyle=":", linewidth=0.6)
    for label, t, color in marks:
        if t is not None:
            ax1.annotate(label, (t - t0, 1.05), color=color, fontsize="small")
    ends = [t for _, t in report.phases[1:]] + [report.ended]
    for (ph, t), end in zip(report.phases, ends):
        ax3.annotate(ph, ((t + end) / 2 - t0, 1.0), xycoords=("data", "axes fraction"), ha="center",
                     va="bottom", fontsize="small", color="grey")
    ax1.set_title(f"inferctl drill oom — {report.model}")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

