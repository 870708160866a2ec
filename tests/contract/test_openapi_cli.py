"""``inferctl openapi [--check] [--out DIR]``: the front door's command for the committed OpenAPI
documents (tools/openapi_docs.py), the same as ``python -m inferctl.tools.openapi_docs``."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.tools import openapi_docs


def test_openapi_writes_the_three_documents_then_check_passes_then_names_a_stale_one(tmp_path):
    runner = CliRunner()
    out = tmp_path / "docs"
    r = runner.invoke(app, ["openapi", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["controller.json", "engine.json", "router.json"]
    engine = json.loads((out / "engine.json").read_text(encoding="utf-8"))
    assert "/v1/completions" in engine["paths"]
    # the CLI writes exactly what the committed check compares with
    assert (out / "router.json").read_text(encoding="utf-8") == openapi_docs.documents()["router.json"]
    r = runner.invoke(app, ["openapi", "--check", "--out", str(out)])
    assert r.exit_code == 0 and "3 OpenAPI documents current" in r.output
    (out / "controller.json").write_text("{}\n", encoding="utf-8")
    r = runner.invoke(app, ["openapi", "--check", "--out", str(out)])
    assert r.exit_code == 1
    assert "controller.json" in r.output and "engine.json" not in r.output
    assert (out / "controller.json").read_text(encoding="utf-8") == "{}\n"   # --check writes nothing


def test_openapi_check_of_the_committed_documents_and_a_bad_out(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["openapi", "--check"])
    assert r.exit_code == 0, r.output
    assert str(openapi_docs.DEFAULT_DIR) in r.output
    a_file = tmp_path / "f"
    a_file.write_text("x")
    r = runner.invoke(app, ["openapi", "--out", str(a_file)])
    assert r.exit_code == 2 and "--out" in r.output and "not a folder" in r.output
    assert "openapi" in runner.invoke(app, ["--help"]).output
