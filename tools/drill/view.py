"""The drill's rich views: the live table while it runs and the summary table at the end."""

from __future__ import annotations

import sys
import time
from typing import Any

from inferctl.contract.units import format_bytes
from inferctl.tools.drill.report import DrillReport


def _mb(x: Any) -> str:
    """Bytes in binary units (``8.35 MiB``), as everywhere a person reads memory; ``-``: no data."""
    return "-" if x is None else format_bytes(x)


def _s(x: Any, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f} s"


#: Console width for a pipe or a file: wide enough that no row is cut (rich's default is 80)
PIPE_WIDTH = 10_000


def console(stderr: bool = False) -> Any:
    """A rich Console on stdout (``stderr``: stderr): the terminal's width on a terminal, else
    :data:`PIPE_WIDTH` so ``| cat`` / ``| tee`` / a log get full rows, with no ``…`` cut."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, highlight=False, width=None if tty else PIPE_WIDTH)


def stop_live(live: Any) -> None:
    """Stop a rich ``Live``; on a pipe or a file, end its last frame's line (rich leaves it open,
    and the next line — the drill's ``wrote …`` — would be glued onto the table's border)."""
    live.stop()
    if not live.console.is_terminal:
        live.console.line()


def live_table(run: Any) -> Any:
    """A rich Table of the running drill."""
    from rich.table import Table

    s = run.samples[-1] if run.samples else None
    counts = {"ok": 0, "failed": 0, "lost": 0}
    inflight = 0
    for r in run.requests:
        if r.end is None:
            inflight += 1
        else:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
    t = Table(title="inferctl drill oom", show_header=False)
    t.add_column("what", width=LABEL_WIDTH, no_wrap=True)
    t.add_column("value", width=VALUE_WIDTH, no_wrap=True, overflow="ellipsis")
    t0 = run.phases[0][1] if run.phases else None
    t.add_row("phase", f"{run.phase}  (load: {run.load}, {time.time() - t0:.1f} s)" if t0 else run.phase)
    t.add_row("engine precision", "-" if s is None else str(s.precision))
    t.add_row("controller policy", str(run.policy_state))
    if s is not None:
        t.add_row("memory", f"allocated {_mb(s.allocated_bytes)} / reserved {_mb(s.reserved_bytes)} / "
                            f"budget {_mb(s.budget_bytes)}")
        t.add_row("KV usage", "-" if s.kv_usage_ratio is None else f"{100 * s.kv_usage_ratio:.0f} %")
        t.add_row("running / waiting", f"{s.running} / {s.waiting}")
        t.add_row("OOM faults", str(s.oom_total))
    t.add_row("requests", f"ok {counts['ok']}, failed {counts['failed']}, lost {counts['lost']}, in flight {inflight}")
    if run.oom:
        t.add_row("OOM", f"{run.oom.get('source')} / {run.oom.get('kind')}"
                         + (" (injected by the drill)" if run.oom.get("injected") else ""))
    for e in run.events[-4:]:
        what = " ".join(str(e.get("reason") or e.get("message")).split())
        t.add_row(f"event #{e.get('id')}", fit(f"{e.get('kind')} {e.get('source')}: {what}", VALUE_WIDTH))
    return t


#: The live view's column widths (characters): the same every frame, whatever the events say
LABEL_WIDTH = 18
VALUE_WIDTH = 96


def fit(text: str, width: int) -> str:
    """``text`` on one line of exactly ``width`` characters: padded with spaces, or cut with
    ``…`` as its last character."""
    return text.ljust(width) if len(text) <= width else text[:width - 1] + "…"


def summary_table(report: DrillReport) -> Any:
    """The end-of-drill rich Table."""
    from rich.table import Table

    s = report.summary()
    c = s["requests"]
    t = Table(title=f"drill oom: {'PASSED' if s['ok'] else 'FAILED'}")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("OOM (source / kind)", f"{s['oom_source']} / {s['oom_kind']}"
              + (" — injected by the drill" if s["oom_injected_by_drill"] else ""))
    t.add_row("switch latency: OOM → first int8 token", _s(s["switch_latency_seconds"], 3))
    t.add_row("OOM → degrade decision", _s(s["oom_to_decision_seconds"], 3))
    t.add_row("OOM → engine reports int8", _s(s["oom_to_int8_reported_seconds"], 3))
    t.add_row("rollback: int8 → full", _s(s["rollback_seconds_from_int8"]))
    t.add_row("rollback: pressure end → full", _s(s["rollback_seconds_from_recovery"]))
    t.add_row("final precision", str(s["final_precision"]))
    t.add_row("requests (ok / failed / lost)", f"{c['total']} ({c['ok']} / {c['failed']} / {c['lost']})")
    for ph, v in s["latency_by_phase"].items():
        if v["requests"]:
            t.add_row(f"latency {ph} P50 / P99 ({v['requests']} req)",
                      f"{_s(v['p50_seconds'])} / {_s(v['p99_seconds'])}")
    t.add_row("controller events", ", ".join(f"{k} {v}" for k, v in sorted(s["events"].items())) or "none")
    t.add_row("duration", _s(s["duration_seconds"], 1))
    return t

