"""Every alert's runbook_url resolves to runbooks/<AlertName>.md with the four sections, and
what the runbooks tell an operator to run exists (PromQL over the catalog, inferctl commands)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from inferctl.dashboards.alerts import DEFAULT_RUNBOOK_BASE_URL, alert_rules, recorded_series
from inferctl.dashboards.build import dashboard_specs
from inferctl.dashboards.catalog import exposed_series, gauge_names
from inferctl.dashboards.promql_lint import check_expression

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "runbooks"
SECTIONS = ("Meaning", "Impact", "Diagnosis", "Mitigation")
ALERTS = sorted({r.name for r in alert_rules()})
FENCE = re.compile(r"^ *```(\w+)\n(.*?)^ *```", re.M | re.S)


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def runbook_path(url: str) -> Path:
    if not url.startswith(DEFAULT_RUNBOOK_BASE_URL):
        raise ValueError(f"runbook_url {url!r} does not start with {DEFAULT_RUNBOOK_BASE_URL!r}")
    return RUNBOOKS / url[len(DEFAULT_RUNBOOK_BASE_URL):]


def blocks(text: str, lang: str) -> list[str]:
    return [body for tag, body in FENCE.findall(text) if tag == lang]


def test_every_runbook_url_resolves_to_a_file_with_the_four_sections():
    urls = {r.name: f"{DEFAULT_RUNBOOK_BASE_URL}{r.name}.md" for r in alert_rules()}
    assert len(urls) >= 18
    for name, url in urls.items():
        path = runbook_path(url)
        assert path.is_file(), f"{name}: {path} missing"
        text = path.read_text(encoding="utf-8")
        assert text.startswith(f"# {name}\n"), name
        found = sections(text)
        assert list(found)[:4] == list(SECTIONS), (name, list(found))
        for sec in SECTIONS:
            assert len(found[sec]) > 80, f"{name}: section {sec} is too thin"


def test_no_orphan_runbooks():
    assert sorted(p.stem for p in RUNBOOKS.glob("*.md")) == ALERTS


@pytest.mark.parametrize("name", ALERTS)
def test_diagnosis_names_dashboards_promql_and_commands(name):
    found = sections((RUNBOOKS / f"{name}.md").read_text(encoding="utf-8"))
    titles = {d.title for d in dashboard_specs()}
    named = set(re.findall(r"\*\*(inferctl / [^*]+)\*\*", found["Diagnosis"]))
    assert named and named <= titles, (name, named - titles)
    assert blocks(found["Diagnosis"], "promql"), f"{name}: no PromQL in Diagnosis"
    assert "inferctl " in found["Diagnosis"], f"{name}: no inferctl command in Diagnosis"
    assert re.search(r"`[^`]+`", found["Mitigation"]), f"{name}: no command in Mitigation"


def test_runbook_promql_names_only_catalog_series():
    series, gauges, recorded = exposed_series(), gauge_names(), recorded_series()
    bad, count = [], 0
    for path in sorted(RUNBOOKS.glob("*.md")):
        for block in blocks(path.read_text(encoding="utf-8"), "promql"):
            expr = " ".join(line.strip() for line in block.splitlines() if line.strip())
            count += 1
            bad += [f"{path.name}: {p}" for p in check_expression(expr, series, recorded, gauges)]
    assert count >= 40
    assert bad == []


def inferctl_commands() -> list[tuple[str, list[str]]]:
    """``(runbook, argv after 'inferctl')`` of every inferctl line in a bash block."""
    out = []
    for path in sorted(RUNBOOKS.glob("*.md")):
        for block in blocks(path.read_text(encoding="utf-8"), "bash"):
            for line in block.splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("inferctl "):
                    out.append((path.name, shlex.split(line)[1:]))
    return out


def test_runbook_commands_exist_in_the_inferctl_cli():
    """Each ``inferctl ...`` line resolves to a real command of ``inferctl.cli:app`` and its
    options exist on that command (parsed with click, never executed)."""
    import typer

    from inferctl.cli import app

    root = typer.main.get_command(app)   # typer vendors click: use duck typing, not click.Group
    commands = inferctl_commands()
    assert len(commands) >= 30
    missing = []
    for runbook, argv in commands:
        cmd, rest = root, list(argv)
        while hasattr(cmd, "commands") and rest and rest[0] in cmd.commands:
            cmd, rest = cmd.commands[rest[0]], rest[1:]
        if hasattr(cmd, "commands"):
            missing.append(f"{runbook}: inferctl {' '.join(argv)} (no such command)")
            continue
        known = {opt for p in cmd.params
                 for opt in list(getattr(p, "opts", [])) + list(getattr(p, "secondary_opts", []))}
        for arg in rest:
            if arg.startswith("--") and arg.split("=")[0] not in known:
                missing.append(f"{runbook}: inferctl {' '.join(argv)} (no option {arg})")
    assert missing == []
