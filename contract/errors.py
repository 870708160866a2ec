"""The engine API's error envelope: :class:`APIError` and the pydantic-error mapping.

Every client error of the engine's HTTP API (and of any router in front of it, which
validates with the same models) is an :class:`APIError`, rendered as the OpenAI error object::

    {"error": {"message": str, "type": str, "param": str | null, "code": str | null}}

``type`` is ``invalid_request_error`` for every 4xx and ``server_error`` otherwise, unless the
raiser names another (``service_unavailable_error`` for a 503). ``param`` names the offending
field, dotted for nested fields with ``[i]`` for list positions (``messages[0].content``).
FastAPI's own 422 shape is never used: :func:`validation_error_to_api_error` turns pydantic
errors into one 400 naming the first field.
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """A request failure rendered as an OpenAI error object.

    Attributes: ``status`` (HTTP status), ``message``, ``param`` (the offending field, dotted
    for nested fields, or None), ``code`` (a short machine-readable reason or None),
    ``err_type`` (the OpenAI ``type``; ``invalid_request_error`` for every 4xx),
    ``headers`` (extra response headers such as ``Retry-After``).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, err_type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param
        self.code = code
        if err_type is None:
            err_type = "invalid_request_error" if 400 <= self.status < 500 else "server_error"
        self.err_type = err_type
        self.headers = dict(headers or {})

    def body(self) -> dict:
        """The OpenAI error document: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.err_type,
                          "param": self.param, "code": self.code}}


def loc_to_param(loc: tuple) -> str | None:
    """Pydantic error location → OpenAI ``param``: ``("messages", 0, "content")`` →
    ``"messages[0].content"``; an empty location → None."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or None


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (``...`` marks the cut)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _body_loc(err: dict) -> tuple:
    """The error's location without FastAPI's leading ``"body"`` (it prefixes body fields)."""
    loc = tuple(err.get("loc", ()))
    return loc[1:] if loc and loc[0] == "body" else loc


def validation_error_to_api_error(errors: list[dict]) -> APIError:
    """Turn pydantic/FastAPI validation errors (``ValidationError.errors()``) into one 400.

    The first error names ``param`` and ``code`` (the pydantic error type); the message lists
    every error as ``"<param>: <reason> (got <value>)"``.
    """
    if not errors:
        return APIError(400, "invalid request", code="invalid_request")
    parts = []
    for err in errors:
        param = loc_to_param(_body_loc(err))
        msg = str(err.get("msg", "invalid value"))
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        text = f"{param}: {msg}" if param else msg
        if ("input" in err and err.get("type") not in ("missing", "json_invalid", "extra_forbidden") and param
                and "got" not in msg):
            text += f" (got {_short(err['input'])})"
        parts.append(text)
    first = errors[0]
    return APIError(400, "; ".join(parts), param=loc_to_param(_body_loc(first)),
                    code=str(first.get("type") or "invalid_value"))


#: The OpenAI-style ``code`` for each body-refusal reason of :mod:`inferctl.contract.http`
#: (``BodyRejected.reason``), shared by every API that renders those refusals (the engine, the
#: router), so a client sees the same code wherever it sends a bad body.
REJECTION_CODES: dict[str, str] = {
    "bad_length": "invalid_header",
    "too_large": "request_too_large",
    "unsupported_media_type": "unsupported_media_type",
    "disconnected": "client_disconnected",
    "empty": "invalid_json",
    "not_utf8": "invalid_json",
    "invalid_json": "invalid_json",
    "too_deep": "invalid_json",
    "invalid_unicode": "invalid_unicode",
    "not_object": "invalid_type",
}
