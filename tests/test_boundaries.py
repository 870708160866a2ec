"""The house boundaries of DESIGN.md, enforced on the source tree.

- The controller reaches engines over HTTP only: no module of ``controller/`` imports
  ``engine`` (the CLI front door ``controller/cli.py`` attaches the engine's own commands
  and is the single exception).
- The engine knows nothing of the controller.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_controller_never_imports_engine():
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "controller").rglob("*.py")
        if p.name != "cli.py" and "engine" in _imports(p)
    ]
    assert offenders == []


def test_engine_never_imports_controller():
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "engine").rglob("*.py")
        if "controller" in _imports(p)
    ]
    assert offenders == []
