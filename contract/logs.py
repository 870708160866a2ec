"""Log configuration shared by the router and the engine: ``--log-format text|json``.

``json`` writes one JSON object per line: ``{"time", "level", "logger", "message", ...}``
plus the record's ``extra`` fields at the top level (a request's line carries
``request_id``, the ``X-Request-Id`` that travels router → engine; see docs/observability.md).
``text`` writes ``time level logger message key=value ...``. Stdlib :mod:`logging` only.
"""

from __future__ import annotations

import json
import logging
import sys
import time

#: The formats ``--log-format`` accepts.
LOG_FORMATS: tuple[str, ...] = ("text", "json")

#: LogRecord attributes that are not ``extra`` fields.
_STANDARD = frozenset(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime", "taskName",
                                                                                   "color_message"}


def extra_fields(record: logging.LogRecord) -> dict:
    """The ``extra={...}`` fields of ``record`` (its attributes that LogRecord does not define)."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC ISO-8601, milliseconds, ``Z``), ``level``
    (lower case), ``logger``, ``message``, the ``extra`` fields, ``exc_info`` (the traceback
    text) when the record has one. Values JSON cannot hold are written with ``str()``."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        doc.update(extra_fields(record))
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """``time level logger message key=value ...`` (the ``extra`` fields appended)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = [f"{k}={v}" for k, v in extra_fields(record).items()]
        return line + (" " + " ".join(extra) if extra else "")


def check_log_format(log_format: str) -> str:
    """``log_format`` when it is one of :data:`LOG_FORMATS`; ValueError naming ``--log-format`` otherwise."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format: must be text or json, got {log_format!r}")
    return log_format


#: ``--log-level`` values (any case): the stdlib's level names, which uvicorn takes too.
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")


def check_log_level(level: str, flag: str = "--log-level") -> str:
    """``level`` lowercased when it is one of :data:`LOG_LEVELS` (any case); ValueError naming
    ``flag`` and the accepted values otherwise (``trace`` reached ``logging`` and stopped the
    engine and the router with a traceback)."""
    if not isinstance(level, str) or level.lower() not in LOG_LEVELS:
        raise ValueError(f"{flag}: must be one of {', '.join(LOG_LEVELS)} (any case), got {level!r}")
    return level.lower()


def formatter_for(log_format: str) -> logging.Formatter:
    """A :class:`JsonFormatter` or :class:`TextFormatter` (ValueError for another format)."""
    return JsonFormatter() if check_log_format(log_format) == "json" else TextFormatter()


class StderrHandler(logging.StreamHandler):
    """A stream handler that writes to whatever ``sys.stderr`` is at the time of each record
    (like :data:`logging.lastResort`), not the stream it was built with: a process (or a test
    runner) that swaps or closes ``sys.stderr`` never leaves the root logger writing to a
    closed file ("--- Logging error --- ValueError: I/O operation on closed file")."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # noqa: ANN201 - the current sys.stderr
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # noqa: ANN001 - StreamHandler.__init__ assigns it
        pass


def configure_logging(log_format: str, level: str = "info") -> None:
    """Point the root logger at stderr with the chosen formatter (``text`` or ``json``) and
    level (``debug``/``info``/``warning``/``error``, any case). Run uvicorn with
    ``log_config=None`` so its loggers propagate here and share the format.

    Raises ValueError for another format or an unknown level.
    """
    handler = StderrHandler()
    handler.setFormatter(formatter_for(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

