"""The engine's HTTP server, kept as an import path for the engine CLI: the app is built by
:func:`inferctl.engine.entrypoints.app.create_app` (routes split by family under
:mod:`inferctl.engine.entrypoints`)."""

from inferctl.engine.entrypoints.app import create_app

__all__ = ["create_app"]
