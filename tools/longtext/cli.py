"""``inferctl longtext BOOK``: the typer command (:func:`register` adds it to an app)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from inferctl.tools.longtext.book import read_book
from inferctl.tools.longtext.config import (DEFAULT_CHUNK_SIZE, DEFAULT_MAX_NEW_TOKENS, DEFAULT_OVERLAP,
                                            DEFAULT_POSITION_BUCKET, DEFAULT_REPETITION_PENALTY, DEFAULT_SEP_TEXT,
                                            LongTextConfig, LongTextError)
from inferctl.tools.longtext.http_backend import HttpBackend
from inferctl.tools.longtext.measure import run_longtext
from inferctl.tools.longtext.report import render_tables, write_outputs


def register(app: Any) -> None:
    """Add ``inferctl longtext BOOK`` to the typer ``app``."""
    import typer

    @app.command("longtext")
    def longtext(
        book: Path = typer.Argument(..., help="A text file (Gutenberg books: header/licence stripped)."),
        url: Optional[str] = typer.Option(None, "--url", help="A running engine (default: start one with --model)."),
        model: Optional[str] = typer.Option(None, "--model", help="Model to serve when no --url is given"
                                            " (.bin or HF dir); with --url, the served model name."),
        encoding: str = typer.Option("auto", "--encoding", help="auto (UTF-8, else Windows-1252) or a codec name."),
        chunk_size: Optional[int] = typer.Option(None, "--chunk-size", help=f"Tokens per window, BOS included "
                                                 f"(default {DEFAULT_CHUNK_SIZE}, or the longest window the engine"
                                                 " can score)."),
        overlap: int = typer.Option(DEFAULT_OVERLAP, "--overlap", help="Book tokens shared by consecutive windows."),
        max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, "--max-new-tokens"),
        repetition_penalty: float = typer.Option(DEFAULT_REPETITION_PENALTY, "--repetition-penalty"),
        temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
        seed: Optional[int] = typer.Option(None, "--seed"),
        max_chunks: Optional[int] = typer.Option(None, "--max-chunks",
                                                 help="Evenly spaced sample of windows (default all)."),
        position_bucket: int = typer.Option(DEFAULT_POSITION_BUCKET, "--position-bucket"),
        no_generate: bool = typer.Option(False, "--no-generate", help="Perplexity only."),
        concurrency: int = typer.Option(8, "--concurrency", help="Requests in flight."),
        max_model_len: Optional[int] = typer.Option(None, "--max-model-len",
                                                    help="For the engine this command starts."),
        out: Optional[Path] = typer.Option(None, "--out", help="Output prefix (default out/longtext/longtext-<book>-"
                                           "<model>-<YYYYmmdd-HHMMSS>): .csv and .json."),
        quiet: bool = typer.Option(False, "--quiet", help="Summary only (no per-chunk table)."),
        keep_logs: bool = typer.Option(False, "--keep-logs", help="Keep the started engine's log (deleted after a"
                                       " successful run by default)."),
        sep_every: Optional[int] = typer.Option(None, "--sep-every", metavar="N", help="Insert a marker before "
                                                "every book token at a multiple of N (the notes' [SEP] every 1024;"
                                                " never scored). docs/longtext.md."),
        sep_text: str = typer.Option(DEFAULT_SEP_TEXT, "--sep-text", metavar="TEXT", help="The marker, as the "
                                     "model's tokenizer encodes it (one token only where the vocabulary has it)."),
        memory_compression: str = typer.Option("none", "--memory-compression", metavar="none|mean", help="mean: "
                                               "feed the mean input embedding of the book before each window as one"
                                               " extra position after BOS (in-process: needs --model)."),
    ) -> None:
        """Process a book longer than the context in overlapping chunks; perplexity by position
        and repetition of the outputs. Prints the per-chunk table and saves CSV + JSON."""
        from inferctl.tools.drill.view import console as make_console

        console = make_console()
        err = make_console(stderr=True)
        try:
            cfg = LongTextConfig(chunk_size=DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size,
                                 overlap=overlap, max_new_tokens=max_new_tokens,
                                 repetition_penalty=repetition_penalty, temperature=temperature, seed=seed,
                                 position_bucket=position_bucket, max_chunks=max_chunks,
                                 generate=not no_generate, concurrency=concurrency, sep_every=sep_every,
                                 sep_text=sep_text, memory_compression=memory_compression)
            text = read_book(book, encoding)
        except LongTextError as exc:
            err.print(f"error: --{exc.field.replace('_', '-')}: {exc.message}" if exc.field and exc.field != "book"
                      else f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        if url is None and model is None:
            err.print("error: --model: give the model to measure (a llama2.c .bin or a Hugging Face directory),"
                      " or --url of a running engine; without either, longtext would measure the random demo"
                      " model (--model demo does that on purpose)", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        if cfg.memory_compression != "none" and url is not None:
            err.print("error: --memory-compression: mean compression feeds an embedding, which HTTP cannot carry; "
                      "give --model (it runs in this process) instead of --url", markup=False, highlight=False,
                      soft_wrap=True)
            raise typer.Exit(2)
        sup = None
        backend = None
        log = None
        ok = False
        try:
            if cfg.memory_compression != "none":
                backend = _in_process(model, max_model_len, err)
            else:
                if url is None:
                    sup, url, log = _start_engine(model, max_model_len, err)
                backend = HttpBackend(url, model=model if sup is None else None)
            if chunk_size is None and cfg.chunk_size > backend.max_window:
                # over HTTP a scored window is at most max_model_len - 1 tokens (max_tokens 1)
                cfg = replace(cfg, chunk_size=backend.max_window)
                err.print(f"note: --chunk-size {cfg.chunk_size}: the longest window {backend.name} "
                          f"can score (max_model_len {backend.max_model_len} - 1)", markup=False, highlight=False,
                          soft_wrap=True)
            last = {"t": 0.0}

            def progress(stage: str, done: int, total: int) -> None:
                if time.monotonic() - last["t"] > 2 or done == total:
                    last["t"] = time.monotonic()
                    err.print(f"{stage}: {done}/{total} windows", highlight=False, soft_wrap=True)

            report = run_longtext(text, backend, cfg, progress)
            ok = True
        except LongTextError as exc:
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except RuntimeError as exc:   # the engine did not start
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1)
        finally:
            if backend is not None:
                backend.close()
            if sup is not None:
                sup.stop()
            if log is not None:
                if ok and not keep_logs:
                    log.unlink(missing_ok=True)
                else:
                    err.print(f"note: the engine's log is kept: {log}", markup=False, highlight=False,
                              soft_wrap=True)
        tables = render_tables(report)
        for t in (tables[1:] if quiet else tables):
            console.print(t)
        for note in report.notes:
            err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
        prefix = out if out is not None else Path("out") / "longtext" / output_name(
            book, model or getattr(backend, "model", None))
        csv_path, json_path = write_outputs(report, prefix)
        err.print(f"wrote {csv_path} and {json_path}", markup=False, highlight=False, soft_wrap=True)


def _in_process(model: str, max_model_len: int | None, err: Any) -> Any:
    """The in-process backend (:mod:`.inproc`); raises RuntimeError when the model
    does not load (the caller prints it)."""
    from inferctl.tools.longtext.inproc import InProcessBackend

    err.print(f"loading {model} in this process (--memory-compression runs in-process)", highlight=False,
              soft_wrap=True)
    try:
        backend = InProcessBackend(model, max_model_len=max_model_len)
    except (FileNotFoundError, ValueError) as exc:
        raise RuntimeError(f"--model: {exc}") from None
    return backend


def output_name(book: Path, model: str | None, when: float | None = None) -> str:
    """``longtext-<book>-<model>-<YYYYmmdd-HHMMSS>`` (local time; the model's file or folder name,
    characters other than letters, digits, ``.``, ``_`` and ``-`` replaced): runs of other models
    or at other times do not overwrite each other."""
    import re

    name = Path(model.rstrip("/")).name if model else "model"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "model"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if when is None else when))
    return f"longtext-{book.stem}-{name}-{stamp}"


def _start_engine(model: str | None, max_model_len: int | None, err: Any) -> tuple[Any, str, Path]:
    """Start ``inferctl engine serve`` on a free loopback port; returns (supervisor, url, log path)."""
    import socket
    import tempfile

    from inferctl.controller.actions import EngineSupervisor, engine_serve_argv

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # past the model's own maximum on purpose (docs/longtext.md run C/D): the engine refuses that unless told
    extra = ["--max-model-len", str(max_model_len), "--allow-long-max-model-len"] if max_model_len else []
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.gettempdir()) / f"inferctl-longtext-engine-{port}.log"
    sup = EngineSupervisor("longtext", engine_serve_argv(port, model=model, extra=extra), url,
                           health_timeout_seconds=120.0, log_path=log)
    err.print(f"starting an engine for {model or 'the demo model'} on {url} (log: {log})", highlight=False,
              soft_wrap=True)
    sup.start()
    return sup, url, log
