"""Read a book: decode strictly (UTF-8, else Windows-1252), normalise line ends, keep the text
between Project Gutenberg's ``*** START OF`` and ``*** END OF`` lines when present."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from inferctl.tools.longtext.config import LongTextError

_START = re.compile(r"^[ \t]*\*\*\*[ \t]*START OF (?:THE |THIS )?PROJECT GUTENBERG EBOOK.*$",
                    re.IGNORECASE | re.MULTILINE)
_END = re.compile(r"^[ \t]*\*\*\*[ \t]*END OF (?:THE |THIS )?PROJECT GUTENBERG EBOOK.*$",
                  re.IGNORECASE | re.MULTILINE)

@dataclass
class Book:
    """A decoded book: ``text`` (``\\n`` line ends, Gutenberg header/licence removed when
    found), the ``encoding`` used, whether the Gutenberg markers were found, raw size."""

    path: str
    text: str
    encoding: str
    gutenberg: bool
    raw_bytes: int


def decode_text(raw: bytes, encoding: str = "auto", name: str = "file") -> tuple[str, str]:
    """Decode ``raw`` strictly. ``encoding`` ``auto``: UTF-8 (a BOM is dropped), else
    Windows-1252. Returns ``(text, encoding used)``.

    Raises:
        LongTextError: (field ``encoding``) unknown codec, or bytes that do not decode — the
            message names the byte offset, the byte, and the ``--encoding`` option.
    """
    if encoding == "auto":
        try:
            return raw.decode("utf-8-sig"), "utf-8"
        except UnicodeDecodeError:
            pass
        try:
            return raw.decode("cp1252"), "cp1252"
        except UnicodeDecodeError as exc:
            raise LongTextError("encoding", (
                f"{name} is neither UTF-8 nor Windows-1252: byte 0x{raw[exc.start]:02x} at offset "
                f"{exc.start} does not decode; pass --encoding (e.g. latin-1, utf-16)")) from None
    try:
        return raw.decode(encoding), encoding
    except LookupError:
        raise LongTextError("encoding", f"unknown encoding {encoding!r} (use a Python codec name, "
                                        "e.g. utf-8, cp1252, latin-1)") from None
    except UnicodeDecodeError as exc:
        raise LongTextError("encoding", (
            f"{name} does not decode as {encoding}: byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start} ({exc.reason}); try --encoding auto, cp1252 or latin-1")) from None


def strip_gutenberg(text: str) -> tuple[str, bool]:
    """The book text between the ``*** START OF ... ***`` and ``*** END OF ... ***`` lines.

    Returns ``(text, True)`` when the start marker is found (the end marker is optional);
    ``(text, False)`` unchanged otherwise. Leading/trailing blank space is stripped.
    """
    start = _START.search(text)
    if start is None:
        return text.strip(), False
    body = text[start.end():]
    end = _END.search(body)
    if end is not None:
        body = body[:end.start()]
    return body.strip(), True


def read_book(path: str | Path, encoding: str = "auto") -> Book:
    """Read and decode a text file (see :func:`decode_text`, :func:`strip_gutenberg`);
    CRLF and CR line ends become ``\\n``.

    Raises:
        LongTextError: the file is missing or unreadable (field ``book``), does not decode
            (field ``encoding``), or holds no text.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise LongTextError("book", f"{p}: no such file") from None
    except OSError as exc:
        raise LongTextError("book", f"{p}: cannot read ({exc.strerror or exc})") from None
    text, used = decode_text(raw, encoding, name=str(p))
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    body, found = strip_gutenberg(text)
    if not body:
        raise LongTextError("book", f"{p}: no text" + (" between the Gutenberg START and END lines"
                                                         if found else ""))
    return Book(path=str(p), text=body, encoding=used, gutenberg=found, raw_bytes=len(raw))

