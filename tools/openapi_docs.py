"""The committed OpenAPI documents of the three servers: ``docs/openapi/{engine,router,controller}.json``.

Each server serves its document at ``GET /openapi.json`` (contract/openapi.py builds it from the
pydantic models the server validates with). The copies under ``docs/openapi/`` let a reader, a
client generator or a reviewer see the API without running anything, and a change to the API
shows in review as a diff of these files. They are generated, never edited by hand::

    inferctl openapi                 # write docs/openapi/*.json
    inferctl openapi --check         # exit 1 naming each stale or missing file
    inferctl openapi --out DIR       # write (or with --check, compare) another folder
    python -m inferctl.tools.openapi_docs [--check] [--dir DIR]   # the same, without the front door

The documents are built in process from each server's ``create_app`` with neutral settings
(the built-in demo model as ``main`` without an API key; a router with one placeholder replica;
the controller API over a stand-in with an empty metrics registry): nothing is started, no port
is opened. Rendering is ``json.dumps(indent=2, sort_keys=True)`` plus a final newline, so the
same API gives the same bytes. tests/contract/test_openapi_committed.py runs the check in CI.

Exit codes: 0 written / current, 1 stale (``--check``), 2 bad usage (``--out`` a file, or a
folder that cannot be written).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path
from typing import Callable, Optional

#: where the documents go, relative to the repository root
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "docs" / "openapi"
#: the placeholder admin token of the in-process apps (never a real server's)
_TOKEN = "openapi-document-placeholder-token"


def _engine() -> dict:
    from inferctl.engine.async_engine import AsyncLLMEngine
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.entrypoints.app import create_app
    from inferctl.engine.loader import build_demo_model

    engine = AsyncLLMEngine(LLMEngine(build_demo_model(max_seq_len=512),
                                      EngineConfig(num_threads=1, served_model_name="main")))
    return create_app({"main": engine}, admin_token=_TOKEN, default_model="main").openapi()


def _router() -> dict:
    from inferctl.router.app import create_app
    from inferctl.router.config import EngineSpec, RouterConfig

    return create_app(RouterConfig(engines=(EngineSpec("r0", "http://127.0.0.1:9"),))).openapi()


def _controller() -> dict:
    from prometheus_client import CollectorRegistry

    from inferctl.controller.api import create_app

    # the routes read the controller only when called; building the document needs its registry
    return create_app(types.SimpleNamespace(registry=CollectorRegistry()), _TOKEN).openapi()


#: server name → its document's builder
BUILDERS: dict[str, Callable[[], dict]] = {"engine": _engine, "router": _router, "controller": _controller}


def render(doc: dict) -> str:
    """The committed text of one document (stable: sorted keys, 2-space indent, final newline)."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def documents() -> dict[str, str]:
    """``{"engine.json": text, "router.json": text, "controller.json": text}``, built now."""
    return {f"{name}.json": render(build()) for name, build in BUILDERS.items()}


def stale(directory: Path = DEFAULT_DIR, built: dict[str, str] | None = None) -> list[str]:
    """The file names under ``directory`` that are missing or differ from the built documents."""
    built = documents() if built is None else built
    out = []
    for name, text in built.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def run(directory: Path, check: bool, out=print, err=None) -> int:
    """Write the documents into ``directory`` (created), or with ``check`` compare them; the exit
    code of the module docstring. ``out``/``err`` print a line (err defaults to stderr)."""
    err = err or (lambda line: print(line, file=sys.stderr))
    if directory.exists() and not directory.is_dir():
        err(f"error: --out: {directory} is a file, not a folder")
        return 2
    built = documents()
    if check:
        bad = stale(directory, built)
        if bad:
            err(f"stale OpenAPI documents in {directory}: {', '.join(bad)}; regenerate them with inferctl openapi")
            return 1
        out(f"{len(built)} OpenAPI documents current in {directory}")
        return 0
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in built.items():
            (directory / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        err(f"error: --out: cannot write {directory}: {exc.strerror or exc}")
        return 2
    out(f"wrote {', '.join(sorted(built))} in {directory}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m inferctl.tools.openapi_docs",
                                     description="Write or check docs/openapi/*.json.")
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed document is stale")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the documents are (docs/openapi)")
    args = parser.parse_args(argv)
    return run(args.dir, args.check)


def register(app) -> None:
    """Add ``inferctl openapi [--check] [--out DIR]`` to the typer ``app`` (the front door's)."""
    import typer

    @app.command("openapi")
    def openapi(
        check: bool = typer.Option(False, "--check", help="Exit 1 naming each stale or missing document; "
                                                          "write nothing."),
        out_dir: Optional[Path] = typer.Option(None, "--out", metavar="DIR",
                                               help="The folder of the documents (default: docs/openapi of "
                                                    "this checkout)."),
    ) -> None:
        """Write (or --check) the OpenAPI documents of the engine, router and controller APIs:
        engine.json, router.json, controller.json, built in process, nothing started (docs/api.md)."""
        code = run(out_dir or DEFAULT_DIR, check, out=typer.echo, err=lambda line: typer.echo(line, err=True))
        if code:
            raise typer.Exit(code)


if __name__ == "__main__":
    sys.exit(main())
