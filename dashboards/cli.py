"""``inferctl dashboards build|check``: regenerate or verify the observability files.

Attached to the ``inferctl`` CLI by the front door (``inferctl/cli.py``) with ``register(app)``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from inferctl.dashboards.alerts import DEFAULT_RUNBOOK_BASE_URL
from inferctl.dashboards.generate import REPO_ROOT, stale_files, write_all

RootOption = typer.Option(REPO_ROOT, "--root",
                          help="Repository root whose generated files are written or checked (default: this checkout).",
                          file_okay=False, dir_okay=True)
RunbookOption = typer.Option(DEFAULT_RUNBOOK_BASE_URL, "--runbook-base-url",
                             help="Prefix of every alert's runbook_url (ends with '/').")


def make_app() -> typer.Typer:
    """The ``dashboards`` sub-app (a fresh object per call; no module-level state)."""
    app = typer.Typer(name="dashboards", help="Grafana dashboards, Prometheus rules and Alertmanager config, as code.",
                      no_args_is_help=True, add_completion=False)

    @app.command("build")
    def build(root: Path = RootOption, runbook_base_url: str = RunbookOption) -> None:
        """Regenerate dashboards/*.json, Grafana provisioning, alerts/*.yaml and the PrometheusRule."""
        if not runbook_base_url.endswith("/"):
            raise typer.BadParameter("must end with '/'", param_hint="--runbook-base-url")
        changed = write_all(root, runbook_base_url)
        for rel in changed:
            typer.echo(f"wrote {rel}")
        typer.echo(f"{len(changed)} file(s) changed")

    @app.command("check")
    def check(root: Path = RootOption, runbook_base_url: str = RunbookOption) -> None:
        """Exit 1 (listing them) if any generated file is missing or stale."""
        stale = stale_files(root, runbook_base_url)
        for rel in stale:
            typer.echo(f"stale: {rel}", err=True)
        if stale:
            typer.echo("run `inferctl dashboards build` and commit the result", err=True)
            raise typer.Exit(code=1)
        typer.echo("all generated files are fresh")

    return app


def register(app: typer.Typer) -> None:
    """Add the ``dashboards`` command group to the ``inferctl`` app."""
    app.add_typer(make_app(), name="dashboards")
