"""Issue 13, ``inferctl longtext`` as a newcomer meets it: no silent demo model (item 9), the
output named after book, model and time (item 9), the started engine's log removed (item 10)."""

from __future__ import annotations

from typer.testing import CliRunner

from inferctl.cli import app


def test_longtext_without_a_model_refuses(gutenberg_dir):
    r = CliRunner().invoke(app, ["longtext", str(gutenberg_dir / "pg84.txt")])
    assert r.exit_code == 2
    assert "--model: give the model to measure" in r.output and "random demo model" in r.output


def test_longtext_names_its_output_and_removes_the_engine_log(tmp_path, monkeypatch, gutenberg_dir):
    """The command's own bookkeeping, with the engine and the measurement stood in for."""
    from inferctl.tools.longtext import cli as lt_cli
    from inferctl.tools.longtext.measure import LongTextReport

    log = tmp_path / "engine.log"
    log.write_text("uvicorn lines")
    stopped = []

    class Sup:
        def stop(self):
            stopped.append(True)

    class Backend:
        max_window, max_model_len, model, base_url = 10_000, 10_001, "served", "http://x"

        def __init__(self, *a, **k):
            pass

        def close(self):
            pass

    monkeypatch.setattr(lt_cli, "_start_engine", lambda model, mml, err: (Sup(), "http://x", log))
    monkeypatch.setattr(lt_cli, "HttpBackend", Backend)
    monkeypatch.setattr(lt_cli, "run_longtext", lambda text, backend, cfg, progress: LongTextReport(
        book={"path": "pg84.txt"}, engine={"backend": "stub"}, config={}, total_tokens=0, total_chunks=0,
        chunks=[], positions=[], seconds=0.0))
    monkeypatch.chdir(tmp_path)
    args = ["longtext", str(gutenberg_dir / "pg84.txt"), "--model", "models/stories260K.bin", "--quiet"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    outs = sorted(p.name for p in (tmp_path / "out" / "longtext").iterdir())
    assert len(outs) == 2 and all(n.startswith("longtext-pg84-stories260K.bin-2") for n in outs), outs
    assert stopped and not log.exists()                 # the engine's log was deleted
    log.write_text("again")
    r = CliRunner().invoke(app, args + ["--keep-logs"])
    assert r.exit_code == 0 and log.exists() and f"log is kept: {log}" in r.output
