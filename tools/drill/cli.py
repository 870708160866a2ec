"""``inferctl drill oom`` and ``drill fleet``: the typer commands (:func:`register` adds them to an app)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from inferctl.tools.drill.config import DrillConfig, DrillError
from inferctl.tools.drill.fleet_cli import register as register_fleet
from inferctl.tools.drill.passages import load_passages
from inferctl.tools.drill.plot import plot_report
from inferctl.tools.drill.scenario import run_drill
from inferctl.tools.drill.stack import discover, stack_config, start_stack
from inferctl.tools.drill.view import console, live_table, stop_live, summary_table


def _budget(value: Any) -> str:
    """A budget as the config holds it (bytes or ``512MiB``) in binary units for people."""
    from inferctl.contract.units import SizeError, format_bytes, parse_size

    try:
        return format_bytes(parse_size(str(value), "memory_budget")) if value is not None else "none"
    except SizeError:
        return str(value)


def register(app: Any) -> None:
    """Add ``inferctl drill oom`` to the typer ``app`` (as the sub-app ``drill``)."""
    import typer

    drill_app = typer.Typer(help="Game-day drills against a running (or self-started) stack.",
                            no_args_is_help=True)
    app.add_typer(drill_app, name="drill")
    register_fleet(drill_app)

    @drill_app.command("oom")
    def oom(
        url: Optional[str] = typer.Option(None, "--url", help="A running controller (default: start `inferctl up`)."),
        engine: Optional[str] = typer.Option(None, "--engine", help="Engine name at --url (default: the only one)."),
        token: Optional[str] = typer.Option(None, "--token", envvar="INFERCTL_ADMIN_TOKEN",
                                            help="Engine admin token (for the fallback OOM injection)."),
        model: Optional[str] = typer.Option(None, "--model", help="Model of the stack the drill starts."),
        memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="Budget of the started engine."),
        engine_arg: list[str] = typer.Option([], "--engine-arg", help="Extra `inferctl engine serve` argument."),
        data: Path = typer.Option(Path("../shared/data/gutenberg"), "--data",
                                  help="Folder of .txt files (or one file)."),
        encoding: str = typer.Option("auto", "--encoding", help="auto (UTF-8, else Windows-1252) or a codec."),
        clients: int = typer.Option(16, "--clients", min=1),
        baseline_clients: int = typer.Option(2, "--baseline-clients", min=1),
        max_tokens: int = typer.Option(32, "--max-tokens", min=1),
        long_chars: int = typer.Option(660, "--long-chars", min=1, help="Characters of a pressure prompt."),
        baseline_seconds: float = typer.Option(3.0, "--baseline-seconds", min=0),
        pressure_seconds: float = typer.Option(30.0, "--pressure-seconds", min=0,
                                               help="Wait this long for a real OOM before injecting one."),
        no_inject: bool = typer.Option(False, "--no-inject", help="Never inject an OOM (fail without a real one)."),
        recovery_seconds: float = typer.Option(90.0, "--recovery-seconds", min=0,
                                               help="Wait this long for the rollback."),
        hold_seconds: float = typer.Option(3.0, "--hold-seconds", min=0, help="Precision hold of the started stack."),
        poll_seconds: float = typer.Option(0.1, "--poll-seconds", min=0.02, help="The drill's /stats poll interval."),
        controller_poll: float = typer.Option(0.2, "--controller-poll", min=0.05,
                                              help="Engine poll interval of the controller the drill starts."),
        out: Path = typer.Option(Path("out/drill"), "--out", help="Folder for drill-oom.json and drill-oom.png."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON (stdout)."),
        no_live: bool = typer.Option(False, "--no-live", help="No live view."),
        keep_logs: bool = typer.Option(False, "--keep-logs", help="Keep the started stack's temporary folder"
                                       " (config, event log, logs); by default it is deleted after a passing"
                                       " drill (a failing drill keeps it and says where)."),
    ) -> None:
        """OOM game day: load, memory pressure until an OOM, int8 switch, recovery, rollback.
        Exit 1 if a request failed or was lost or the stack did not return to full precision."""
        from rich.live import Live

        err = console(stderr=True)

        def die(msg: str, code: int) -> None:
            err.print(f"error: {msg}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(code)

        try:
            cfg = DrillConfig(clients=clients, baseline_clients=min(baseline_clients, clients), max_tokens=max_tokens,
                              long_chars=long_chars, baseline_seconds=baseline_seconds,
                              pressure_seconds=pressure_seconds, recovery_seconds=recovery_seconds,
                              poll_seconds=poll_seconds, inject_fallback=not no_inject)
            longs, shorts = load_passages(data, cfg.long_chars, cfg.short_chars, encoding)
        except DrillError as exc:
            die(str(exc), 2)
        stack = None
        workdir = None
        try:
            if url is None:
                if model is not None and not Path(model).exists():
                    die(f"--model: {model} does not exist", 2)
                workdir = Path(tempfile.mkdtemp(prefix="inferctl-drill-"))
                conf = stack_config(model, workdir, memory_budget, engine_arg, hold_seconds, controller_poll)
                err.print(f"starting inferctl up (model {model or 'demo'}, budget "
                          f"{_budget(conf['engines'][0]['launch'].get('memory_budget'))}; log {workdir})",
                          highlight=False, soft_wrap=True)
                stack = start_stack(conf, workdir)
                engine_name, engine_url, ctl_url, tok = "main", stack.engine_url, stack.controller_url, stack.token
            else:
                engine_name, engine_url = discover(url, engine)
                ctl_url, tok = url, token
            view = None
            if not no_live:
                live_ctx = Live(console=err, refresh_per_second=4, transient=False)
                live_ctx.start()
                view = lambda run: live_ctx.update(live_table(run))  # noqa: E731
            try:
                report = run_drill(engine_url, ctl_url, longs=longs, shorts=shorts, config=cfg, token=tok,
                                   engine_name=engine_name, live=view)
            finally:
                if view is not None:
                    stop_live(live_ctx)
        except DrillError as exc:
            die(str(exc), 1)
        finally:
            if stack is not None:
                code = stack.stop()
                if code not in (0, None):
                    err.print(f"note: inferctl up exited with code {code} (log {stack.log})",
                              highlight=False, soft_wrap=True)
        summary = report.summary()
        keep = keep_logs or not summary["ok"]      # a failed drill keeps its stack's logs to read
        if stack is not None:
            report.stack = {"started_by_drill": True, "log": str(stack.log), "workdir": str(workdir),
                            "kept": keep}
        out.mkdir(parents=True, exist_ok=True)
        json_path = out / "drill-oom.json"
        json_path.write_text(json.dumps(report.to_dict(), indent=1, default=str), encoding="utf-8")
        png = plot_report(report, out / "drill-oom.png")
        if workdir is not None:
            if keep:
                err.print(f"note: the started stack's logs are kept in {workdir}", highlight=False, soft_wrap=True)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        if as_json:
            sys.stdout.write(json.dumps(summary | {"report": str(json_path), "plot": str(png),
                                                   "notes": report.notes}, indent=1) + "\n")
        else:
            console().print(summary_table(report))
        for n in report.notes:
            err.print(f"note: {n}", markup=False, highlight=False, soft_wrap=True)
        err.print(f"wrote {json_path} and {png}", highlight=False, soft_wrap=True)
        raise typer.Exit(0 if summary["ok"] else 1)
