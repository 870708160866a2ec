"""``inferctl``: the admin CLI (typer + rich).

The engine's own commands (``inferctl engine serve``, ``inferctl generate``) live in
``engine/cli.py`` and are attached here; every other command talks to a running controller
or engine over HTTP.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="inferctl",
    help="Operations control plane for LLM inference: engine, controller, admin commands.",
    no_args_is_help=True,
    add_completion=False,
)

try:  # the engine's commands; absent only in a partial checkout
    from engine.cli import register as _register_engine_commands
except ImportError:  # pragma: no cover
    _register_engine_commands = None
if _register_engine_commands is not None:
    _register_engine_commands(app)


if __name__ == "__main__":  # pragma: no cover
    app()
