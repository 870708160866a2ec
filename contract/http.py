"""HTTP plumbing both APIs share: the bearer-token check and the strict JSON body reader.

The engine's admin API and the controller's action API both take ``Authorization: Bearer
<token>`` and strict JSON bodies. The checks live here once; each API renders the failures in
its own error envelope (the engine: the OpenAI object of :mod:`inferctl.contract.errors`; the
controller: ``{"error": {"code", "message", "field"}}``), from the failure's ``reason``,
``status`` and numbers.

* :func:`check_bearer` — raises :class:`Unauthorized` (401, ``WWW-Authenticate: Bearer``).
* :func:`read_body` / :func:`parse_json` / :func:`read_json_body` — raise
  :class:`BodyRejected` (413 above the size limit, 400 otherwise).

No web framework is imported: a request is anything with ``headers`` and an async
``stream()`` (Starlette's ``Request``); a client that disconnects mid-body (Starlette's
``ClientDisconnect``) is recognized by name.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, Protocol

from inferctl.contract.errors import loc_to_param

#: Why a body was refused (the renderers key their codes and wording on it).
BodyReason = Literal["bad_length", "too_large", "disconnected", "empty", "not_utf8", "invalid_json",
                     "too_deep", "invalid_unicode", "not_object"]


class RequestRejected(Exception):
    """A request refused before any route logic ran.

    Attributes: ``status`` (HTTP status), ``reason`` (a stable machine key), ``message``
    (a sentence for the client), ``param`` (the offending field or None), ``headers``
    (response headers the refusal needs).
    """

    def __init__(self, status: int, reason: str, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = int(status)
        self.reason = reason
        self.message = message
        self.param = param
        self.headers = dict(headers or {})


class Unauthorized(RequestRejected):
    """401: ``reason`` is ``"missing_token"`` (no ``Bearer`` credentials) or ``"wrong_token"``;
    ``headers`` carries ``WWW-Authenticate: Bearer`` (RFC 6750 section 3)."""

    def __init__(self, missing: bool) -> None:
        reason = "missing_token" if missing else "wrong_token"
        message = ("missing bearer token (Authorization: Bearer <token>)" if missing else "wrong bearer token")
        super().__init__(401, reason, message, headers={"WWW-Authenticate": "Bearer"})
        self.missing = missing


class BodyRejected(RequestRejected):
    """A refused request body: 413 for ``reason="too_large"``, 400 for every other
    :data:`BodyReason`. ``size`` is the body's size in bytes when known (the declared
    ``Content-Length``; None when the limit was crossed while streaming), ``limit`` the limit
    in bytes (``too_large``) or levels (``too_deep``), ``detail`` the parser's own words
    (``not_utf8``, ``invalid_json``). ``message`` is a complete sentence an API may send as is.
    """

    def __init__(self, status: int, reason: BodyReason, message: str, *, param: str | None = None,
                 size: int | None = None, limit: int | None = None, detail: str | None = None) -> None:
        super().__init__(status, reason, message, param=param)
        self.size = size
        self.limit = limit
        self.detail = detail


class BodySource(Protocol):
    """What the reader needs of a request (Starlette's ``Request`` has both)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


# ---------------------------------------------------------------------------------------------
# Bearer token


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive,
    surrounding spaces stripped); None for a missing header, another scheme or no token."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token.strip()


def check_bearer(authorization: str | None, expected: str) -> None:
    """Check an ``Authorization`` header value against ``expected`` in constant time
    (:func:`hmac.compare_digest`).

    Raises:
        Unauthorized: ``missing=True`` without ``Bearer`` credentials, ``missing=False`` for
            a wrong token.
        ValueError: ``expected`` is empty (an API with an empty token would be open).
    """
    if not expected:
        raise ValueError("expected: the bearer token must not be empty")
    given = bearer_token(authorization)
    if given is None:
        raise Unauthorized(missing=True)
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise Unauthorized(missing=False)


# ---------------------------------------------------------------------------------------------
# Strict JSON body


def _is_disconnect(exc: BaseException) -> bool:
    """Starlette's ``ClientDisconnect`` (matched by name: no framework import here)."""
    return type(exc).__name__ == "ClientDisconnect"


async def read_body(request: BodySource, max_bytes: int) -> bytes:
    """The raw request body, at most ``max_bytes`` bytes.

    Refused from ``Content-Length`` before reading anything, else while streaming (a chunked
    body is not read to the end).

    Raises:
        BodyRejected: 400 ``bad_length`` (a ``Content-Length`` that is not an integer),
            413 ``too_large`` (``size`` = the declared length, or None while streaming),
            400 ``disconnected`` (the client went away mid-body).
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BodyRejected(400, "bad_length", f"invalid Content-Length header {declared!r}") from None
        if size > max_bytes:
            raise BodyRejected(413, "too_large", f"request body is {size} bytes; the limit is {max_bytes} bytes",
                               size=size, limit=max_bytes)
    chunks = bytearray()
    try:
        async for chunk in request.stream():
            chunks += chunk
            if len(chunks) > max_bytes:
                raise BodyRejected(413, "too_large", f"request body is larger than the limit of {max_bytes} bytes",
                                   limit=max_bytes)
    except Exception as exc:
        if not _is_disconnect(exc):
            raise
        raise BodyRejected(400, "disconnected", "the client disconnected before sending the body") from None
    return bytes(chunks)


def json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text (brackets inside strings skipped).

    O(len(raw)); used to refuse deep bodies before the parser recurses into them.
    """
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:          # backslash
                escaped = True
            elif byte == 0x22:          # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):      # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):      # ] }
            depth -= 1
    return deepest


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes, *, allow_nan: bool = False, max_depth: int | None = None,
               check_unicode: bool = True, require_object: bool = True) -> Any:
    """Parse a request body as strict JSON (RFC 8259, UTF-8).

    Args:
        raw: the body bytes.
        allow_nan: accept the non-standard ``NaN``/``Infinity``/``-Infinity`` literals (then a
            typed model refuses them field by field, naming the field); refused by default.
        max_depth: refuse bodies nested deeper than this many ``[``/``{`` levels (None: no
            limit; the parser's recursion limit is still reported as ``invalid_json``).
        check_unicode: refuse strings and keys holding an unpaired UTF-16 surrogate
            (:func:`check_valid_unicode`).
        require_object: refuse a top-level value that is not a JSON object.

    Duplicate keys keep the last value (``json.loads``). Returns the parsed document.

    Raises:
        BodyRejected: 400 with ``reason`` ``empty``, ``too_deep`` (``limit`` = levels),
            ``not_utf8``, ``invalid_json`` (also an integer literal above Python's digit
            limit, or a refused constant), ``invalid_unicode`` (``param`` = the path) or
            ``not_object``.
    """
    if not raw:
        raise BodyRejected(400, "empty", "the request body is empty; a JSON object is required")
    if max_depth is not None and json_depth(raw) > max_depth:
        raise BodyRejected(400, "too_deep", f"the request body is nested more than {max_depth} levels deep",
                           limit=max_depth)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyRejected(400, "not_utf8", f"the request body is not UTF-8: {exc}", detail=str(exc)) from None
    try:
        obj = json.loads(text) if allow_nan else json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, a refused constant, and also an integer literal above
        # Python's digit limit ("Exceeds the limit (4300 digits) for integer string conversion")
        raise BodyRejected(400, "invalid_json", f"the request body is not valid JSON: {exc}",
                           detail=str(exc)) from None
    if check_unicode:
        check_valid_unicode(obj)
    if require_object and not isinstance(obj, dict):
        raise BodyRejected(400, "not_object", f"the request body must be a JSON object, got {type(obj).__name__}")
    return obj


async def read_json_body(request: BodySource, max_bytes: int, *, allow_nan: bool = False,
                         max_depth: int | None = None, check_unicode: bool = True,
                         require_object: bool = True) -> Any:
    """:func:`read_body` then :func:`parse_json` (same arguments, same :class:`BodyRejected`)."""
    raw = await read_body(request, max_bytes)
    return parse_json(raw, allow_nan=allow_nan, max_depth=max_depth, check_unicode=check_unicode,
                      require_object=require_object)


# ---------------------------------------------------------------------------------------------
# Valid Unicode


def _surrogate_at(text: str) -> int | None:
    """Index of the first unpaired UTF-16 surrogate in ``text`` (None when it is valid Unicode)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def check_valid_unicode(obj: Any) -> None:
    """Raise :class:`BodyRejected` 400 (``reason="invalid_unicode"``) when a string in a parsed
    JSON document holds an unpaired UTF-16 surrogate.

    JSON text may spell one (``"\\ud800"``; RFC 8259 section 8.2 leaves its meaning
    unpredictable) and ``json.loads`` accepts it, but such a string is not Unicode text: it
    cannot be encoded as UTF-8, so echoing it back, or giving it to a Rust tokenizer, fails
    deep inside a server. ``param`` is the path of the first offending string (document
    order, ``messages[0].content``), or of the object holding an offending key. O(size of the
    document): one C-speed encode of the whole of it, and a path-tracking walk only when that
    fails.
    """
    try:
        json.dumps(obj, ensure_ascii=False, check_circular=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    except (TypeError, ValueError, RecursionError):
        pass  # not a plain JSON document (NaN, odd types): walk it
    stack: list[tuple[Any, tuple]] = [(obj, ())]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, str):
            at = _surrogate_at(value)
            if at is not None:
                _refuse_surrogate(loc, f"the string holds an unpaired UTF-16 surrogate ({value[at]!r}) "
                                       f"at character {at}")
        elif isinstance(value, dict):
            for key in value:
                if _surrogate_at(key) is not None:
                    _refuse_surrogate(loc, "an object key holds an unpaired UTF-16 surrogate")
            stack.extend((v, loc + (k,)) for k, v in reversed(list(value.items()))
                         if isinstance(v, (str, dict, list)))
        elif isinstance(value, list):
            stack.extend((v, loc + (i,)) for i, v in reversed(list(enumerate(value)))
                         if isinstance(v, (str, dict, list)))


def _refuse_surrogate(loc: tuple, what: str) -> None:
    param = loc_to_param(loc)
    where = param or "the request body"
    raise BodyRejected(400, "invalid_unicode", f"{where}: {what}; strings must be valid Unicode", param=param)
