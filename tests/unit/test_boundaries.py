"""The house boundaries (docs/architecture.md), enforced on the source tree.

Installed, every module is ``inferctl.<part>.…``; the repository keeps each part in its own
top-level folder (``pyproject.toml`` maps them). The rules:

- ``contract`` (what engine and controller must agree on) imports no other part.
- ``engine`` imports only ``contract``: it knows nothing of the controller, the router or the
  tools. ``controller`` and ``router`` import only ``contract``: they reach engines over HTTP.
- ``dashboards`` (observability as code) imports only ``contract`` and the two metric
  catalogs (``engine.metrics``, ``controller.metrics``).
- ``tools`` (drills, long text, planner) sit above the product: they may import any part
  except the front door.
- The front door ``inferctl.cli`` is the only module that composes engine, controller,
  dashboards and tools; nothing imports it.
- No import circle between project modules (lazy imports inside functions count too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: repository folder → installed package (pyproject.toml's package-dir).
PARTS = {
    "inferctl": "inferctl",
    "contract": "inferctl.contract",
    "engine": "inferctl.engine",
    "controller": "inferctl.controller",
    "router": "inferctl.router",
    "dashboards": "inferctl.dashboards",
    "tools": "inferctl.tools",
}

#: part → the parts it may import (besides itself).
ALLOWED = {
    "contract": set(),
    "engine": {"contract"},
    "controller": {"contract"},
    "router": {"contract"},
    "dashboards": {"contract", "engine.metrics", "controller.metrics", "router.metrics"},
    "tools": {"contract", "engine", "controller", "router", "dashboards"},
    "inferctl": {"contract", "engine", "controller", "router", "dashboards", "tools"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    folder = rel.parts[0]
    parts = [PARTS[folder], *rel.parts[1:-1]]
    if rel.stem != "__init__":
        parts.append(rel.stem)
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    mods = {}
    for folder in PARTS:
        base = ROOT / folder
        if base.is_dir():
            for p in base.rglob("*.py"):
                mods[_module_name(p)] = p
    return mods


def imports_of(path: Path, module: str, is_package: bool) -> set[str]:
    """Every ``inferctl.*`` module name ``path`` imports, anywhere in the file (relative imports
    resolved; ``from pkg import name`` yields ``pkg.name`` when that is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    pkg = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {f for f in found if f == "inferctl" or f.startswith("inferctl.")}


def _graph() -> dict[str, set[str]]:
    mods = project_modules()
    graph = {}
    for name, path in mods.items():
        raw = imports_of(path, name, path.name == "__init__.py")
        graph[name] = {m for m in raw if m in mods and m != name}
    return graph


def _part(module: str) -> str:
    rest = module.split(".")[1:]
    # the front door's own modules (inferctl/cli.py, __main__.py, help_names.py, ...) are part "inferctl"
    if not rest or rest[0] not in PARTS:
        return "inferctl"
    return rest[0]


def _allowed(src: str, dst: str) -> bool:
    a, b = _part(src), _part(dst)
    if a == b:
        return True
    rules = ALLOWED.get(a, set())
    sub = ".".join(dst.split(".")[1:])
    return b in rules or any(sub == r or sub.startswith(r + ".") for r in rules)


def test_every_part_exists_and_maps_to_the_inferctl_namespace():
    mods = project_modules()
    for part in ("inferctl", "contract", "engine", "controller", "dashboards", "tools"):
        assert PARTS[part] in mods, f"{part}/__init__.py missing"


def test_no_part_imports_one_it_may_not():
    offenders = sorted(f"{src} -> {dst}" for src, dsts in _graph().items() for dst in dsts
                       if not _allowed(src, dst))
    assert offenders == []


def test_only_the_front_door_composes_and_nothing_imports_it():
    graph = _graph()
    importers = sorted(src for src, dsts in graph.items() if "inferctl.cli" in dsts
                       and src not in ("inferctl.__main__",))
    assert importers == []
    composers = sorted(src for src, dsts in graph.items()
                       if {"engine", "controller", "tools"} <= {_part(d) for d in dsts} | {_part(src)}
                       and _part(src) != "tools")
    assert composers == ["inferctl.cli"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    # a package's __init__ re-exporting its own modules is not a circle of design
    graph = {src: {d for d in dsts if not (src.startswith(d + ".") and d == src.rpartition(".")[0])}
             for src, dsts in _graph().items()}
    graph = {src: {d for d in dsts
                   if not (d.startswith(src + ".") and Path(str(project_modules()[src])).name == "__init__.py")}
             for src, dsts in graph.items()}
    assert _cycles(graph) == []


def test_cycle_finder_and_rules_catch_bad_forms(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert not _allowed("inferctl.engine.server", "inferctl.controller.loop")
    assert not _allowed("inferctl.controller.loop", "inferctl.engine.model")
    assert _allowed("inferctl.dashboards.build", "inferctl.engine.metrics")
    assert not _allowed("inferctl.dashboards.build", "inferctl.engine.server")
    bad = tmp_path / "bad.py"
    bad.write_text("import inferctl.engine.server\nfrom inferctl.controller import loop\n"
                   "def f():\n    from . import x\n")
    got = imports_of(bad, "inferctl.tools.bad", False)
    assert {"inferctl.engine.server", "inferctl.controller.loop", "inferctl.tools.x"} <= got


@pytest.mark.parametrize("folder", ["engine", "controller", "contract", "dashboards", "tools", "router"])
def test_no_generic_top_level_import_forms(folder):
    """Project code imports itself as ``inferctl.<part>``, never as a bare ``engine``/``controller``."""
    base = ROOT / folder
    if not base.is_dir():
        pytest.skip(f"{folder}/ not present")
    bare = []
    for p in base.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [])
            bare += [f"{p.relative_to(ROOT)}: {n}" for n in names
                     if n.split(".")[0] in PARTS and n.split(".")[0] != "inferctl"]
    assert bare == []
