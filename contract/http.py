"""HTTP plumbing the APIs share: the bearer-token check, the strict JSON body reader, the
JSON ``Content-Type`` rule (the ``Host`` rules live in :mod:`inferctl.contract.hosts`).

The engine's admin API and the controller's action API both take ``Authorization: Bearer
<token>`` and strict JSON bodies. The checks live here once; each API renders the failures in
its own error envelope (the engine: the OpenAI object of :mod:`inferctl.contract.errors`; the
controller: ``{"error": {"code", "message", "field"}}``), from the failure's ``reason``,
``status`` and numbers.

* :func:`check_bearer` — raises :class:`Unauthorized` (401, ``WWW-Authenticate: Bearer``).
* :func:`read_body` / :func:`parse_json` / :func:`read_json_body` — raise
  :class:`BodyRejected` (413 above the size limit, 415 for a body not labelled
  ``application/json`` (:func:`check_json_content_type`), 400 otherwise).

No web framework is imported: a request is anything with ``headers`` and an async
``stream()`` (Starlette's ``Request``); a client that disconnects mid-body (Starlette's
``ClientDisconnect``) is recognized by name.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import stat
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, Protocol

from inferctl.contract.errors import loc_to_param

#: Why a body was refused (the renderers key their codes and wording on it).
BodyReason = Literal["bad_length", "too_large", "unsupported_media_type", "disconnected", "empty", "not_utf8",
                     "invalid_json", "too_deep", "invalid_unicode", "not_object", "duplicate_key"]


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
    """A refused request body: 413 for ``reason="too_large"``, 415 for
    ``"unsupported_media_type"`` (``param="Content-Type"``), 400 for every other
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


#: Longest client ``X-Request-Id`` kept as is (longer: a new id is made).
MAX_REQUEST_ID_CHARS = 200


def request_id(given: str | None) -> str:
    """The request id the router and the engine use and echo in ``X-Request-Id``: ``given`` when
    it is 1..:data:`MAX_REQUEST_ID_CHARS` visible ASCII characters (0x21..0x7e, so it is safe in
    a header and a log line), else a new uuid4 hex (32 characters)."""
    if given and len(given) <= MAX_REQUEST_ID_CHARS and all(0x21 <= ord(c) <= 0x7E for c in given):
        return given
    return uuid.uuid4().hex


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


#: Shortest admin token accepted (characters). 16 URL-safe characters carry ~96 random bits;
#: ``inferctl up`` generates 48 hex characters (:func:`generate_admin_token`, 192 bits).
MIN_ADMIN_TOKEN_CHARS = 16
#: random bytes in a generated admin token (192 bits)
ADMIN_TOKEN_BYTES = 24


def generate_admin_token() -> str:
    """A fresh admin token that passes :func:`check_admin_token`: ``secrets.token_hex(24)``,
    48 lowercase hex characters (192 bits). Hex, not ``token_urlsafe``: a URL-safe token starts
    with ``-`` one time in 64 and would be refused as a swallowed flag."""
    return secrets.token_hex(ADMIN_TOKEN_BYTES)


def check_admin_token(token: str, source: str) -> str:
    """Return ``token`` when it may guard an admin API; ``source`` names where it came from
    (``"--admin-token"``, ``"--token-file /path"``) for the error.

    Raises:
        ValueError: shorter than :data:`MIN_ADMIN_TOKEN_CHARS` characters, starting with
            ``-`` (a flag swallowed as the value: ``--admin-token --port 80``), or holding
            whitespace, control or non-ASCII characters (it could not travel in a header:
            httpx refuses non-ASCII header values, other clients send bytes that never match).
    """
    if token.startswith("-"):
        raise ValueError(f"{source}: the admin token starts with '-': a flag was probably taken as its value")
    if len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise ValueError(f"{source}: the admin token is {len(token)} characters; at least "
                         f"{MIN_ADMIN_TOKEN_CHARS} are required (generate one: "
                         "python3 -c 'import secrets; print(secrets.token_hex(24))')")
    return check_token_chars(token, source)


def check_token_chars(token: str, source: str) -> str:
    """Return ``token`` when it can travel in ``Authorization: Bearer <token>``: visible ASCII
    (0x21..0x7e) only. The admin CLI's client check (it leaves the length to the server's 401).

    Raises:
        ValueError: whitespace, control or non-ASCII characters, naming ``source``.
    """
    if not all(0x21 <= ord(c) <= 0x7E for c in token):
        raise ValueError(f"{source}: the admin token holds whitespace, control or non-ASCII characters "
                         "(visible ASCII only: it travels in 'Authorization: Bearer <token>')")
    return token


#: Longest ``--api-key`` accepted (characters): uvicorn's HTTP/1.1 parser (h11) refuses a header
#: block over 16 KiB, so a longer key could never reach the server.
MAX_API_KEY_CHARS = 4096


def check_api_key(key: str, source: str) -> str:
    """Return ``key`` when a client can send it as ``Authorization: Bearer <key>``; ``source``
    names the flag for the error.

    Raises:
        ValueError: empty or blank (``/v1`` would look guarded but be open, or no client could
            match it), longer than :data:`MAX_API_KEY_CHARS`, or holding anything but visible
            ASCII (0x21..0x7e): spaces are stripped from the header and non-ASCII bytes arrive
            as Latin-1, so such a key could never match.
    """
    if not key.strip():
        raise ValueError(f"{source}: the API key is empty; give a key or leave the flag out (no key: /v1 open)")
    if len(key) > MAX_API_KEY_CHARS:
        raise ValueError(f"{source}: the API key is {len(key)} characters; at most {MAX_API_KEY_CHARS} fit in "
                         "an HTTP header")
    if not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise ValueError(f"{source}: the API key holds whitespace, control or non-ASCII characters (visible "
                         "ASCII only): no client could send it in 'Authorization: Bearer <key>'")
    return key


def read_token_file(path: str, source: str) -> str:
    """The token in the file at ``path``: its first non-blank line, surrounding whitespace (the
    final newline) stripped. ``source`` names the flag for the error.

    The file is opened non-blocking, so nothing waits for ever: a regular file is read; a pipe
    (a shell's ``<(cat secret)``, a ``mkfifo``) is read up to its first line, its end, or
    :data:`TOKEN_PIPE_SECONDS` seconds, whichever comes first (a FIFO nobody writes to reads as
    empty); a directory, socket or device is refused at once.

    Raises:
        ValueError: the file cannot be read, is not a regular file, is not UTF-8, or is empty.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:      # ValueError: a NUL in the path
        raise ValueError(f"{source}: cannot read the token file {path!r} ({exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode):
            raw = _read_pipe(fd, path, source)
        elif not stat.S_ISREG(mode):
            raise ValueError(f"{source}: {path!r} is {_file_kind(mode)}, not a regular file: give a file"
                             " holding the token")
        else:
            with os.fdopen(fd, "rb") as fh:
                fd = -1                          # closed by the file object from here on
                raw = fh.read(64 * 1024)
        text = next((ln.strip() for ln in raw.decode("utf-8").splitlines() if ln.strip()), "")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{source}: cannot read the token file {path!r} ({exc})") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if not text:
        raise ValueError(f"{source}: the token file {path!r} is empty")
    return text


#: Largest ``--max-body-bytes`` of the engine and the router (1 GiB): a request body is held in
#: memory whole before it is parsed or forwarded; a prompt is far smaller (a 1M-token context is a
#: few MiB of text).
MAX_BODY_BYTES = 1 << 30

#: Seconds a token file that is a pipe may take to give its first line (``read_token_file``).
TOKEN_PIPE_SECONDS = 5.0


def _read_pipe(fd: int, path: str, source: str) -> bytes:
    """A pipe's bytes up to its first newline, its end or 64 KiB, waiting at most
    :data:`TOKEN_PIPE_SECONDS` (``select``). Raises ValueError naming ``source`` on the timeout."""
    import select
    import time

    deadline = time.monotonic() + TOKEN_PIPE_SECONDS
    raw = b""
    while b"\n" not in raw and len(raw) < 64 * 1024:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise ValueError(f"{source}: the pipe {path!r} gave no complete line within {TOKEN_PIPE_SECONDS:g} s")
        try:
            chunk = os.read(fd, 64 * 1024)
        except BlockingIOError:
            continue
        if not chunk:                # its end (or a FIFO no writer opened: empty)
            break
        raw += chunk
    return raw


def _file_kind(mode: int) -> str:
    """What a non-regular file is, for a message (``a FIFO (named pipe)``, ``a directory``...)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def host_name_problem(host: str) -> str | None:
    """Why ``host`` (a URL's host, no port) cannot be looked up, in words, or None: an IP
    literal is fine; a name must encode as IDNA (RFC 5891: no empty label, labels of at most 63
    characters, an ``xn--`` label must be valid Punycode) — what the resolver would refuse at
    the first request, with a traceback."""
    import ipaddress

    try:
        ipaddress.ip_address(host.strip("[]"))
        return None
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host     # one trailing dot: the root (a fully qualified name)
    if not name:
        return "no name before the dot"
    if "" in name.split("."):
        return "an empty label (two dots in a row, or more than one at the end)"
    try:
        name.encode("idna")
        for label in name.split("."):
            if label.lower().startswith("xn--"):
                import idna

                idna.decode(label)
    except (UnicodeError, ImportError) as exc:
        return str(exc) or type(exc).__name__
    return None


#: A URL's ``user:password@`` (everything between ``//`` and the last ``@`` before the path).
_URL_CREDENTIALS = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def redact_url(url: str) -> str:
    """``url`` with its credentials (``user:password@``) shown as ``<credentials>@``, for error
    messages and output (``http://u:p@host:8900/x`` → ``http://<credentials>@host:8900/x``); a
    URL without credentials is returned as is. Never raises (also for a URL that does not parse)."""
    return _URL_CREDENTIALS.sub(r"\1<credentials>@", url, count=1)


# ---------------------------------------------------------------------------------------------
# Strict JSON body


def _is_disconnect(exc: BaseException) -> bool:
    """Starlette's ``ClientDisconnect`` (matched by name: no framework import here)."""
    return type(exc).__name__ == "ClientDisconnect"


#: The media type a JSON API accepts (RFC 8259 section 11); ``application/<x>+json`` too (RFC 6839).
JSON_MEDIA_TYPE = "application/json"


def check_json_content_type(content_type: str | None) -> None:
    """Refuse a request body not labelled JSON.

    ``content_type`` is the ``Content-Type`` header value (None: absent). Accepted:
    ``application/json`` or ``application/<x>+json``, any parameters (``; charset=utf-8``),
    any case. Why: a browser sends a cross-origin POST without asking the server first (a
    CORS "simple request", Fetch standard section 3.2.3) only with ``text/plain``,
    ``application/x-www-form-urlencoded``, ``multipart/form-data`` or no body type at all, so
    requiring JSON keeps any web page open on the same host from starting work here.

    Raises:
        BodyRejected: 415 ``unsupported_media_type`` with ``param="Content-Type"``.
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    kind, _, sub = media.partition("/")
    if kind == "application" and (sub == "json" or (sub.endswith("+json") and len(sub) > 5)):
        return
    got = f"{content_type!r}" if content_type else "none"
    raise BodyRejected(415, "unsupported_media_type",
                       f"Content-Type: the request body must be sent as {JSON_MEDIA_TYPE} (got {got})",
                       param="Content-Type")


async def read_body(request: BodySource, max_bytes: int, *, require_json_type: bool = False) -> bytes:
    """The raw request body, at most ``max_bytes`` bytes.

    Refused from ``Content-Length`` before reading anything, else while streaming (a chunked
    body is not read to the end). With ``require_json_type`` the ``Content-Type`` header must
    name JSON (:func:`check_json_content_type`), checked after the declared size and before
    any byte is read.

    Raises:
        BodyRejected: 400 ``bad_length`` (a ``Content-Length`` that is not an integer),
            413 ``too_large`` (``size`` = the declared length, or None while streaming),
            415 ``unsupported_media_type``, 400 ``disconnected`` (the client went away mid-body).
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
    if require_json_type:
        check_json_content_type(request.headers.get("content-type"))
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


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook`` refusing an object that names one key twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BodyRejected(400, "duplicate_key", f"{key}: the key appears twice in one JSON object; give it once",
                               param=key)
        out[key] = value
    return out


def parse_json(raw: bytes, *, allow_nan: bool = False, max_depth: int | None = None,
               check_unicode: bool = True, require_object: bool = True, reject_duplicate_keys: bool = False) -> Any:
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
        reject_duplicate_keys: refuse an object naming one key twice (``duplicate_key``,
            ``param`` = the key). RFC 8259 section 4 says names SHOULD be unique and leaves the
            meaning of repeats to the parser; ``json.loads`` keeps the last, so a proxy or a log
            reading the first would see another request than the one acted on. The strict
            admin bodies (engine ``/admin/*``, controller ``/actions/*``) set it; the OpenAI
            routes keep ``json.loads``' last value, as vLLM does.

    Returns the parsed document.

    Raises:
        BodyRejected: 400 with ``reason`` ``empty``, ``too_deep`` (``limit`` = levels),
            ``not_utf8``, ``invalid_json`` (also an integer literal above Python's digit
            limit, or a refused constant), ``invalid_unicode`` (``param`` = the path),
            ``not_object`` or ``duplicate_key``.
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
    kw: dict[str, Any] = {} if allow_nan else {"parse_constant": _reject_constant}
    if reject_duplicate_keys:
        kw["object_pairs_hook"] = _no_duplicate_keys
    try:
        obj = json.loads(text, **kw)
    except BodyRejected:
        raise
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
                         require_object: bool = True, require_json_type: bool = True,
                         reject_duplicate_keys: bool = False) -> Any:
    """:func:`read_body` then :func:`parse_json` (same arguments, same :class:`BodyRejected`);
    the ``Content-Type`` must name JSON unless ``require_json_type`` is False (415)."""
    raw = await read_body(request, max_bytes, require_json_type=require_json_type)
    return parse_json(raw, allow_nan=allow_nan, max_depth=max_depth, check_unicode=check_unicode,
                      require_object=require_object, reject_duplicate_keys=reject_duplicate_keys)


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
