"""One log line per finished ``/v1`` request, carrying the request id (``X-Request-Id``).

:class:`RequestLogMiddleware` (pure ASGI, outside the API-key check) gives every ``/v1/*``
request a :class:`RequestRecord`: its request id is the client's ``X-Request-Id`` when safe
(1..200 visible ASCII characters), else a new one (:func:`inferctl.contract.http.request_id`,
the router's rule); a generated id is written into the request's headers, so the handler
echoes the same id and the engine's bookkeeping gets it. While the request runs, the record is
the value of a :class:`contextvars.ContextVar` (per asyncio task, copied into the tasks the
handler starts), so the generation helpers note into it without a parameter through every
layer: :func:`note_jobs` (OpenAI id, model, prompt tokens), :func:`note_first_output`
(time to first token), :func:`note_finished` (completion tokens, finish reasons).

When the answer is sent (or the client left), logger ``inferctl.engine.requests`` writes one
record (INFO; WARNING for a 5xx; DEBUG for a successful ``GET`` such as ``/v1/models``, which the
router polls) with the ``extra`` fields ``request_id``, ``id`` (``cmpl-…`` /
``chatcmpl-…``), ``model``, ``endpoint``, ``status``, ``stream``, ``prompt_tokens``,
``completion_tokens`` (the choices that finished), ``finish_reasons`` (one per choice, in
choice order; None for a choice that did not finish), ``ttft_seconds`` (handler start → first
generated token), ``e2e_seconds`` (handler start → last byte), ``client_disconnect`` and, on
an error, ``error_code`` (the OpenAI error object's ``code``). Never the prompt or the output
text. ``--log-format json`` makes it one JSON object per line (:mod:`inferctl.contract.logs`).
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from inferctl.contract.http import request_id as safe_request_id

#: The logger of the per-request lines.
REQUEST_LOGGER = "inferctl.engine.requests"
#: The paths that get a record and a line.
LOGGED_PREFIX = "/v1/"
#: Bytes of an error body kept to read its ``code`` (an OpenAI error object is far smaller).
MAX_ERROR_BODY_BYTES = 65536

log = logging.getLogger(REQUEST_LOGGER)

#: The record of the request the current task serves (None outside a /v1 request).
_CURRENT: ContextVar[RequestRecord | None] = ContextVar("inferctl_engine_request_record", default=None)


@dataclass(slots=True)
class RequestRecord:
    """What the line of one request says (times from :func:`time.monotonic`, seconds)."""

    request_id: str
    endpoint: str
    start: float
    method: str = "POST"
    status: int | None = None
    stream: bool = False
    completed: bool = False
    id: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    jobs: list[str] = field(default_factory=list)
    completion_tokens: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, str | None] = field(default_factory=dict)
    first_token: float | None = None
    error_body: bytes = b""

    def fields(self, now: float) -> dict[str, Any]:
        """The line's ``extra`` fields (see the module docstring)."""
        status = self.status if self.status is not None else 500
        disconnected = status == 499 or not self.completed
        doc: dict[str, Any] = {
            "request_id": self.request_id, "id": self.id, "model": self.model, "endpoint": self.endpoint,
            "status": status, "stream": self.stream, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": sum(self.completion_tokens.values()) if self.completion_tokens else None,
            "finish_reasons": [self.finish_reasons.get(j) for j in self.jobs] if self.jobs else None,
            "ttft_seconds": None if self.first_token is None else round(self.first_token - self.start, 6),
            "e2e_seconds": round(now - self.start, 6), "client_disconnect": disconnected}
        if status >= 400 and status != 499:
            doc["error_code"] = error_code(self.error_body, status)
        return doc


def error_code(body: bytes, status: int) -> str:
    """The ``error.code`` of an OpenAI error object ``body``; ``http_<status>`` when the body
    is not one or has no code."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return code if isinstance(code, str) and code else f"http_{status}"


def current() -> RequestRecord | None:
    """The record of the request being served in this task (None: not a /v1 request)."""
    return _CURRENT.get()


def current_request_id() -> str | None:
    """The request id (``X-Request-Id``) of the request being served, or None."""
    record = _CURRENT.get()
    return None if record is None else record.request_id


def note_jobs(model: str, openai_id: str, jobs: list[Any]) -> None:
    """A request's prepared jobs (objects with ``request_id``, ``token_ids``, ``sample``):
    the served model, the OpenAI id, each choice's engine request id, the prompt tokens
    (each prompt once, however many samples ``n`` it has)."""
    record = _CURRENT.get()
    if record is None:
        return
    record.model = model
    record.id = openai_id
    record.jobs = [job.request_id for job in jobs]
    record.prompt_tokens = sum(len(job.token_ids) for job in jobs if job.sample == 0)


def note_first_output(out: Any) -> None:
    """A generation's first output arrived: the first one carrying tokens sets the TTFT."""
    record = _CURRENT.get()
    if record is not None and record.first_token is None and getattr(out, "new_token_ids", None):
        record.first_token = time.monotonic()


def note_finished(out: Any) -> None:
    """A generation finished (a RequestOutput with ``finished``): its completion tokens and
    finish reason, by its engine request id."""
    record = _CURRENT.get()
    if record is None:
        return
    rid = getattr(out, "request_id", None)
    record.completion_tokens[rid] = int(getattr(out, "completion_tokens", 0) or 0)
    record.finish_reasons[rid] = getattr(out, "finish_reason", None)
    if record.first_token is None and getattr(out, "new_token_ids", None):
        record.first_token = time.monotonic()


def _with_request_id(scope: dict, rid: str) -> dict:
    """``scope`` whose ``x-request-id`` header is ``rid`` (the only one)."""
    headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"x-request-id"]
    headers.append((b"x-request-id", rid.encode("ascii")))
    return {**scope, "headers": headers}


class RequestLogMiddleware:
    """Pure ASGI middleware: a :class:`RequestRecord` per ``/v1/*`` request and its log line
    when the answer ends (see the module docstring). Other paths pass through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not scope.get("path", "").startswith(LOGGED_PREFIX):
            await self.app(scope, receive, send)
            return
        given = None
        for key, value in scope.get("headers", ()):
            if key.lower() == b"x-request-id":
                given = value.decode("latin-1")
                break
        rid = safe_request_id(given)
        if rid != given:
            scope = _with_request_id(scope, rid)
        record = RequestRecord(request_id=rid, endpoint=scope["path"], start=time.monotonic(),
                               method=scope.get("method", "POST"))

        async def send_logged(message: dict) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                record.status = message["status"]
                for key, value in message.get("headers", ()):
                    if key.lower() == b"content-type":
                        record.stream = value.startswith(b"text/event-stream")
            elif kind == "http.response.body":
                if record.status is not None and record.status >= 400 \
                        and len(record.error_body) < MAX_ERROR_BODY_BYTES:
                    record.error_body += message.get("body", b"")
                if not message.get("more_body", False):
                    record.completed = True
            await send(message)

        token = _CURRENT.set(record)
        try:
            await self.app(scope, receive, send_logged)
        except Exception:
            if record.status is None:   # unhandled: the server's error middleware answers 500
                record.status, record.completed = 500, True
            raise
        finally:
            _CURRENT.reset(token)
            emit(record)


def emit(record: RequestRecord) -> None:
    """Write the request's line (INFO; WARNING for a 5xx; DEBUG for a successful GET)."""
    doc = record.fields(time.monotonic())
    status = doc["status"]
    level = logging.WARNING if status >= 500 else logging.DEBUG if record.method == "GET" and status < 400 \
        else logging.INFO
    if log.isEnabledFor(level):
        log.log(level, "%s %s %s", record.endpoint, doc["status"], record.request_id, extra=doc)
