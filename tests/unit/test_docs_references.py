"""Every reference in the code and the docs resolves: cited docs exist, cited tests exist.

Code and tests cite ``docs/field-cases.md``, ``docs/design.md``, ``docs/performance.md`` …;
``docs/field-cases.md`` names the tests that hold each case as ``test_file.py::test_name``.
A renamed test or a moved page would leave a dangling citation; these tests catch it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("inferctl", "contract", "engine", "controller", "dashboards", "tools", "bench", "tests")


def _texts(suffixes: tuple[str, ...], dirs: tuple[str, ...]) -> dict[Path, str]:
    out = {}
    for d in dirs:
        for p in (ROOT / d).rglob("*"):
            if p.is_file() and p.suffix in suffixes:
                out[p] = p.read_text(encoding="utf-8", errors="replace")
    return out


def _test_index() -> dict[str, set[str]]:
    """test file basename → the test function names defined in it."""
    index: dict[str, set[str]] = {}
    for p in (ROOT / "tests").rglob("test_*.py"):
        names = set(re.findall(r"^(?:async )?def (test_\w+)", p.read_text(encoding="utf-8"), re.M))
        index.setdefault(p.name, set()).update(names)
    return index


def test_cited_docs_pages_exist():
    texts = _texts((".py", ".md", ".yaml"), SOURCE_DIRS + ("docs", "runbooks", "alerts", "dashboards"))
    texts[ROOT / "README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = sorted({f"{p.relative_to(ROOT)} -> {m}" for p, t in texts.items()
                      for m in re.findall(r"\bdocs/[\w.-]+\.md", t) if not (ROOT / m).exists()})
    assert missing == []


def test_no_citation_of_files_outside_the_repository():
    texts = _texts((".py",), SOURCE_DIRS)
    bad = sorted(f"{p.relative_to(ROOT)}: {m}" for p, t in texts.items()
                 for m in re.findall(r"\b(?:DESIGN\.md|PERFORMANCE\.md|/work/\w+|shared/cases)", t)
                 if p.name != "test_docs_references.py")
    assert bad == []


def test_tests_cited_by_the_docs_exist():
    index = _test_index()
    docs = _texts((".md",), ("docs",))
    cited = [(p.name, f, name) for p, t in docs.items()
             for f, name in re.findall(r"(test_\w+\.py)::(test_\w+)", t)]
    assert len(cited) > 50  # docs/field-cases.md cites the tests of every case
    dangling = sorted(f"{doc}: {f}::{name}" for doc, f, name in cited if name not in index.get(f, set()))
    assert dangling == []


def test_test_paths_cited_by_the_docs_exist():
    texts = _texts((".md",), ("docs", "alerts", "dashboards"))
    texts[ROOT / "README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    dangling = sorted({f"{p.relative_to(ROOT)} -> {m}" for p, t in texts.items()
                       for m in re.findall(r"\btests/[\w/]+\.py", t) if not (ROOT / m).exists()})
    assert dangling == []
