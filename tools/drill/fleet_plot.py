"""``inferctl drill fleet``'s PNG: each replica's share of answered requests over time (matplotlib, Agg)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def plot_fleet(summary: dict[str, Any], path: str | Path) -> Path:
    """PNG: per-replica share (0..1, from the router's ``X-Inferctl-Replica`` header) per time bin
    of ``summary["share"]``, a vertical marker and label per phase start (``summary["phases"]``),
    and a legend. A bin without answers is a gap (no data). Returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    share = summary["share"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    half = share["bin_seconds"] / 2
    for name, values in sorted(share["replicas"].items()):
        ax.plot([t + half for t in share["t"]], [math.nan if v is None else v for v in values],
                marker=".", label=name)
    for i, ph in enumerate(summary["phases"]):
        ax.axvline(ph["t"], color="grey", linestyle="--", linewidth=1)
        label = ph["name"] + (f" {ph['target']}" if ph.get("target") else "")
        ax.text(ph["t"], 1.02 + 0.06 * (i % 2), label, fontsize="small", ha="left", va="bottom")
    ax.set_ylim(0, 1.15)
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("share of answered requests")
    ax.set_title(f"drill fleet: {summary['requests']} requests, {summary['failed']} failed, {summary['lost']} lost",
                 fontsize="medium", pad=24)
    ax.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
