"""Load passages for the drill's load: long (pressure) and short (baseline) Gutenberg passages."""

from __future__ import annotations

import re
from pathlib import Path

from inferctl.tools.drill.config import DrillError
from inferctl.tools.longtext.book import read_book
from inferctl.tools.longtext.config import LongTextError


def load_passages(data: str | Path, long_chars: int, short_chars: int, encoding: str = "auto",
                  limit: int = 4000) -> tuple[list[str], list[str]]:
    """Long and short passages from every ``*.txt`` under ``data`` (a folder or one file),
    decoded with :func:`inferctl.tools.longtext.book.read_book` (Gutenberg header/licence stripped),
    cut at word boundaries. Returns ``(long, short)``, each at most ``limit`` passages.

    Raises:
        DrillError: no ``.txt`` file, or a file that does not decode (the message names the
            file and the ``--encoding`` option).
    """
    p = Path(data)
    files = sorted(p.glob("*.txt")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise DrillError(f"--data: no .txt files in {p}")
    longs: list[str] = []
    shorts: list[str] = []
    per_file = limit // len(files) + 1
    for f in files:
        try:
            text = read_book(f, encoding).text
        except LongTextError as exc:
            raise DrillError(f"--data: {exc}") from None
        words = re.sub(r"\s+", " ", text).split(" ")
        for size, out in ((long_chars, longs), (short_chars, shorts)):
            cur: list[str] = []
            n = made = 0
            for w in words:
                cur.append(w)
                n += len(w) + 1
                if n - 1 >= size:
                    out.append(" ".join(cur))
                    cur, n, made = [], 0, made + 1
                    if made >= per_file:
                        break
    if not longs or not shorts:
        raise DrillError(f"--data: the texts in {p} are too short for passages of {long_chars} characters")
    return longs[:limit], shorts[:limit]

