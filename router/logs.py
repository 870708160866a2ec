"""Router logging: ``--log-format text|json``.

``json`` writes one JSON object per line: ``{"time", "level", "logger", "message", ...}`` plus
the record's ``extra`` fields (a request's line carries ``request_id``, ``replica``,
``status``, ``duration_seconds``, ``attempts``, ``reason``, ``path``).
"""

from __future__ import annotations

import json
import logging
import sys
import time

#: LogRecord attributes that are not ``extra`` fields.
_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record (UTC ISO-8601 ``time``; ``extra`` fields at the top level)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """``time level logger message key=value ...`` (the ``extra`` fields appended)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = [f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")]
        return line + (" " + " ".join(extra) if extra else "")


def configure_logging(log_format: str, level: str = "info") -> None:
    """Point the root logger at stderr with the chosen formatter (``text`` or ``json``).

    Raises ValueError for another format.
    """
    if log_format not in ("text", "json"):
        raise ValueError(f"log_format: must be text or json, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
