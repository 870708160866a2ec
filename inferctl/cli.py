"""The front door: the ``inferctl`` command, composed from the parts' own command groups."""

from __future__ import annotations

from inferctl.controller.cli import app

__all__ = ["app", "main"]


def main() -> None:
    """Run the ``inferctl`` command line (console script entry point)."""
    app()
