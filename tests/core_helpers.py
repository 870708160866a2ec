"""Helpers for the engine-core tests: drive an LLMEngine to completion, read Gutenberg text."""

from __future__ import annotations

from pathlib import Path

from inferctl.engine.engine import LLMEngine, RequestOutput


def drain(engine: LLMEngine, max_steps: int = 10_000) -> tuple[dict[str, list[int]], dict[str, RequestOutput]]:
    """Step until no request is unfinished. Returns (token ids per request, final output per
    request). Raises RuntimeError if it does not finish within ``max_steps``."""
    tokens: dict[str, list[int]] = {}
    final: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return tokens, final
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                final[out.request_id] = out
    raise RuntimeError(f"engine did not finish within {max_steps} steps")


def gutenberg_text(gutenberg_dir: Path, name: str = "pg1342.txt") -> str:
    """A Gutenberg book as text (the files are Windows-1252 with CRLF line ends)."""
    return (gutenberg_dir / name).read_bytes().decode("cp1252").replace("\r\n", "\n")
