"""The front door: the ``inferctl`` command, composed from the parts' own command groups.

This is the only module that puts engine, controller, observability and tools together; nothing
in the project imports it (``python -m inferctl`` and the ``inferctl`` console script run
:func:`main`). Each part adds its commands with its own ``register(app)``:

- the controller (``inferctl.controller.cli``): ``status``, ``events``, the engine actions,
  ``reset-gpu``, ``release-gpu``, ``up``, ``controller run``;
- the engine (``inferctl.engine.cli``): ``engine serve``, ``generate``;
- the router (``inferctl.router.cli``): ``router``;
- observability (``inferctl.dashboards.cli``): ``dashboards build|check``;
- the tools: ``drill oom`` (``inferctl.tools.drill``), ``longtext`` (``inferctl.tools.longtext``),
  ``plan`` (``inferctl.tools.plan``) and ``openapi`` (``inferctl.tools.openapi_docs``).

The order of the calls is the order ``inferctl --help`` lists the commands (``up`` first: the
controller registers it first). Help is plain click text (``rich_markup_mode=None``): paragraphs
rewrapped to the terminal, flags without a ``<bool>`` placeholder, values with one that says
what to type (``--port PORT``, ``--model PATH``, ``--memory-budget SIZE``:
:mod:`inferctl.help_names`). ``inferctl --version`` prints the installed package's version.
"""

from __future__ import annotations

import typer

from inferctl.controller.cli import register as register_controller
from inferctl.dashboards.cli import register as register_dashboards
from inferctl.engine.cli import register as register_engine
from inferctl.help_names import name_placeholders
from inferctl.router.cli import register as register_router
from inferctl.tools.drill.cli import register as register_drill
from inferctl.tools.longtext.cli import register as register_longtext
from inferctl.tools.openapi_docs import register as register_openapi
from inferctl.tools.plan import register as register_plan

__all__ = ["app", "build_app", "main"]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"inferctl {version('inferctl')}")
        except PackageNotFoundError:
            typer.echo("inferctl (not installed: run `pip install -e .`)")
        raise typer.Exit(0)


def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Operations control plane for LLM inference: engine, controller, admin commands. Start with
    `inferctl up` (an engine and the controller), then `inferctl status`."""


def build_app() -> typer.Typer:
    """A new root ``inferctl`` typer app with every part's commands attached."""
    root = typer.Typer(
        name="inferctl",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
    )
    root.callback()(_root)
    for register in (register_controller, register_engine, register_router, register_dashboards, register_drill,
                     register_longtext, register_plan, register_openapi):
        register(root)
    name_placeholders(root)
    return root


#: The ``inferctl`` command (tests invoke it with typer's ``CliRunner``).
app = build_app()


def main() -> None:
    """Run the ``inferctl`` command line (console script entry point)."""
    app()
