"""The committed OpenAPI documents (docs/openapi/*.json) are the servers' current ones: an API
change without ``python -m inferctl.tools.openapi_docs`` fails here, in CI (like ``inferctl
dashboards check`` for the generated dashboards)."""

from __future__ import annotations

import json

import pytest

from inferctl.tools import openapi_docs


@pytest.fixture(scope="module")
def built():
    return openapi_docs.documents()


def test_the_committed_documents_are_current(built):
    assert openapi_docs.stale(openapi_docs.DEFAULT_DIR, built) == [], \
        "regenerate them: python -m inferctl.tools.openapi_docs"


def test_the_documents_are_the_three_servers_and_show_what_they_serve(built):
    assert sorted(built) == ["controller.json", "engine.json", "router.json"]
    engine, router, controller = (json.loads(built[f"{n}.json"]) for n in ("engine", "router", "controller"))
    assert {"/v1/completions", "/health", "/ready", "/stats"} <= set(engine["paths"])
    assert "instance_id" in engine["paths"]["/health"]["get"]["responses"]["200"]["content"][
        "application/json"]["schema"]["required"]
    assert "/v1/chat/completions" in router["paths"] and "/status" in controller["paths"]


def test_check_names_a_stale_or_missing_file(tmp_path, built, capsys):
    for name, text in built.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert openapi_docs.stale(tmp_path, built) == []
    (tmp_path / "router.json").write_text(built["router.json"].replace("inferctl router", "old router"))
    (tmp_path / "controller.json").unlink()
    assert openapi_docs.stale(tmp_path, built) == ["router.json", "controller.json"]
    assert openapi_docs.main(["--check", "--dir", str(tmp_path)]) == 1
    assert "router.json, controller.json" in capsys.readouterr().err
