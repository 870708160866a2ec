"""One distribution, one namespace: pyproject.toml installs every part under ``inferctl.*``.

The repository keeps one top-level folder per part (engine/, controller/, …); setuptools'
``package-dir`` maps each to ``inferctl.<part>``. A sub-package missing from the explicit
``packages`` list would silently be left out of a wheel, so this test lists the folders.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def test_every_package_folder_is_listed_under_the_inferctl_namespace():
    cfg = _setuptools()
    roots = cfg["package-dir"]
    assert all(name == "inferctl" or name.startswith("inferctl.") for name in roots)
    expected = set()
    for pkg, folder in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            expected.add(".".join((pkg, *rel)))
    assert set(cfg["packages"]) == expected


def test_no_generic_top_level_package_is_installed():
    cfg = _setuptools()
    assert {p.split(".")[0] for p in cfg["packages"]} == {"inferctl"}


def test_console_script_is_the_front_door():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"] == {"inferctl": "inferctl.cli:main"}


def test_no_two_test_files_share_a_name_across_tiers():
    """`pytest` alone collects every tier (testpaths = ["tests"]) with rootdir imports and no
    `__init__.py`: two files of one basename in two tiers stop the collection ("import file mismatch")."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, str] = {}
    clashes = []
    for f in sorted(tests.glob("*/test_*.py")):
        if f.name in seen:
            clashes.append(f"{seen[f.name]} and {f.parent.name}/{f.name}")
        seen.setdefault(f.name, f"{f.parent.name}/{f.name}")
    assert clashes == []
