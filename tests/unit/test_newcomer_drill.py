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


# ------------------------------------------------------------------ item 8: plot and live view
def _report():
    from inferctl.tools.drill.report import DrillReport, RequestRecord

    reqs = [RequestRecord(id=i, client=i, phase="pressure", kind="long", start=10.0 + i, end=11.0 + i,
                          outcome="ok", tokens=2, token_times=[10.2 + i]) for i in range(3)]
    samples = [Sample(9.0 + i, "full" if i < 3 else "int8", "full", 9_187_000, 4_000_000 + i, 8_757_000, 0.5, 1, 0,
                      1, "pressure") for i in range(6)]
    # phases a few hundredths of a second apart and OOM / int8 instants 0.02 s apart: the labels
    # of the old plot ("OOM8") and the phase names collided there
    return DrillReport("http://e", "http://c", "stories260K", 9.0, 30.0, {},
                       [("baseline", 9.0), ("pressure", 9.05), ("recovery", 9.1), ("rollback", 25.0)], reqs,
                       samples, [], {"time": 10.0, "source": "budget", "kind": "exhaustion", "injected": False},
                       int8_seen=10.02, full_seen=20.0, recovery_start=15.0, final_precision="full")


def test_plot_names_the_marker_lines_in_a_legend_and_phase_names_do_not_overlap(tmp_path):
    import matplotlib.pyplot as plt

    from inferctl.tools.drill.plot import build_figure, plot_report

    fig = build_figure(_report())
    top = fig.axes[0]
    legend = top.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["OOM", "int8 reported", "full precision again"]
    renderer = fig.canvas.get_renderer()
    names = [t for t in top.texts]
    assert [t.get_text() for t in names] == ["baseline", "pressure", "recovery", "rollback"]
    boxes = [t.get_window_extent(renderer) for t in names]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)
    assert fig.axes[1].get_ylabel() == "memory (MiB)"
    plt.close(fig)
    png = plot_report(_report(), tmp_path / "d.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_live_view_event_lines_have_one_width_with_an_ellipsis():
    short = {"id": 1, "kind": "transition", "source": "precision", "reason": "ok"}
    long = {"id": 2, "kind": "action", "source": "precision", "reason": "degrade " + "x" * 300}
    assert view.fit("abc", 6) == "abc   "
    assert view.fit("abcdefgh", 6) == "abcde…"
    widths = set()
    for events in ([short], [long], [short, long]):
        out = _text(view.live_table(_run(events)))
        lines = [ln for ln in out.splitlines() if "event #" in ln]
        assert lines
        widths |= {len(ln) for ln in lines}
        assert all("x" * 300 not in ln for ln in lines)
    assert len(widths) == 1                             # the same width in every frame
    assert "…" in _text(view.live_table(_run([long])))
