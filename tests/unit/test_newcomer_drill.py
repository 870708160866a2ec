"""Issue 13 for the drill's views: piped output at full width with the last live frame ended
(item 2), binary units (item 7), event lines of one fixed width (item 8)."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

from rich.console import Console
from rich.live import Live
from rich.table import Table

from inferctl.tools.drill import view
from inferctl.tools.drill.report import Sample


def _run(events: list[dict] | None = None) -> SimpleNamespace:
    s = Sample(t=time.time(), precision="full", policy_state="full", budget_bytes=9_187_000,
               allocated_bytes=4_000_000, reserved_bytes=8_757_000, kv_usage_ratio=0.5, running=2, waiting=1,
               oom_total=0, phase="pressure")
    return SimpleNamespace(samples=[s], requests=[], phases=[("baseline", time.time() - 1)], phase="pressure",
                           load="16 clients", policy_state="full", oom=None, events=events or [])


def _text(renderable, width: int = 10_000) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, highlight=False).print(renderable)
    return buf.getvalue()


def test_console_on_a_pipe_is_wide_enough_for_full_rows(capsys):
    con = view.console()
    assert con.width == view.PIPE_WIDTH
    t = Table()
    t.add_column("x")
    t.add_row("y" * 300)
    con.print(t)
    out = capsys.readouterr().out
    assert "y" * 300 in out and "…" not in out


def test_stop_live_ends_the_last_frame_on_a_pipe():
    buf = io.StringIO()
    live = Live(console=Console(file=buf, width=80), auto_refresh=False)
    live.start()
    live.update("frame")
    view.stop_live(live)
    live.console.print("wrote out/drill-oom.json")
    assert "\nwrote out/drill-oom.json" in buf.getvalue()


def test_live_view_memory_in_binary_units():
    out = _text(view.live_table(_run()))
    assert "budget 8.76 MiB" in out and "reserved 8.35 MiB" in out
    assert " MB" not in out
