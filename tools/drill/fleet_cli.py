"""``inferctl drill fleet``: the typer command (:func:`register` adds it to the ``drill`` sub-app)."""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from inferctl.contract.http import generate_admin_token
from inferctl.tools.drill.config import DrillError

DEFAULT_MODEL = "../shared/models/stories260K/stories260K.bin"
#: engine flags of the drill's replicas (as tests/e2e/test_fleet_e2e.py): short contexts, a roomy budget
ENGINE_ARGS = ["--max-model-len=512", "--memory-budget=512MiB"]


def register(drill_app: Any) -> None:
    """Add ``fleet`` to the typer ``drill_app``."""
    import typer

    @drill_app.command("fleet")
    def fleet(
        replicas: int = typer.Option(3, "--replicas", min=3, max=16, help="Replicas (>= 3: one per fault)."),
        model: Path = typer.Option(Path(DEFAULT_MODEL), "--model", help="Model of the replicas."),
        clients: int = typer.Option(16, "--clients", min=1, max=256),
        max_tokens: int = typer.Option(24, "--max-tokens", min=1),
        phase_seconds: float = typer.Option(6.0, "--phase-seconds", min=1.0, help="Length of each phase."),
        engine_arg: list[str] = typer.Option([], "--engine-arg", help="Extra `inferctl engine serve` argument."),
        out: Path = typer.Option(Path("out/drill"), "--out", help="Folder for drill-fleet.json and drill-fleet.png."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON (stdout)."),
    ) -> None:
        """Fleet game day: `inferctl up --replicas N` under load through the router; degrade main-0 to
        int8, restart main-1 (rolling), SIGKILL main-2. Exit 0 when nothing was lost, 0 failed outside
        the kill phase, and in it only streams main-2 had already started failed; else 1 (2: bad option)."""
        from inferctl.tools.drill.fleet import run_fleet_drill, start_fleet
        from inferctl.tools.drill.fleet_plot import plot_fleet

        def say(msg: str) -> None:
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()

        if not model.exists():
            say(f"error: --model: {model} does not exist")
            raise typer.Exit(2)
        workdir = Path(tempfile.mkdtemp(prefix="inferctl-drill-fleet-"))
        stack = None
        try:
            say(f"starting inferctl up --replicas {replicas} (model {model}; log {workdir})")
            stack = start_fleet(str(model), replicas, workdir, engine_arg or ENGINE_ARGS, generate_admin_token())
            say(f"router {stack.router_url}, controller {stack.controller_url}; {clients} clients")
            result = run_fleet_drill(stack.router_url, stack.controller_url, stack.token, replicas=replicas,
                                     clients=clients, phase_seconds=phase_seconds, max_tokens=max_tokens, log=say)
        except DrillError as exc:
            say(f"error: {exc}")
            raise typer.Exit(1) from None
        finally:
            if stack is not None:
                code = stack.stop()
                if code not in (0, None):
                    say(f"note: inferctl up exited with code {code} (log {stack.log})")
        out.mkdir(parents=True, exist_ok=True)
        summary = result.summary
        json_path = out / "drill-fleet.json"
        json_path.write_text(json.dumps({"summary": summary, "notes": result.notes, "workdir": str(workdir),
                                         "requests": [asdict(r) for r in result.requests]}, indent=1),
                             encoding="utf-8")
        png = plot_fleet(summary, out / "drill-fleet.png")
        if as_json:
            sys.stdout.write(json.dumps(summary | {"report": str(json_path), "plot": str(png),
                                                   "notes": result.notes}, indent=1) + "\n")
        else:
            for p, v in summary["by_phase"].items():
                sys.stdout.write(f"{p:9s} requests {v['requests']:5d}  failed {v['failed']:3d}  lost {v['lost']}\n")
            sys.stdout.write(f"total {summary['requests']} requests, {summary['failed']} failed,"
                             f" {summary['lost']} lost;"
                             f" {summary['killed_replica']} had started {summary['killed_started_streams']} streams,"
                             f" {summary['kill_failures_attributable']} of them failed; by replica"
                             f" {summary['by_replica']}\nverdict: {summary['verdict']}\n")
        for n in result.notes:
            say(f"note: {n}")
        say(f"wrote {json_path} and {png}")
        raise typer.Exit(0 if summary["ok"] else 1)
