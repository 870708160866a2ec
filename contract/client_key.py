"""The one answer to a request without the right client API key, shared by the engine and the router.

A client sends ``Authorization: Bearer <key>`` (OpenAI's API convention); a missing or wrong key
gets 401 with OpenAI's error object (``code`` ``invalid_api_key``) and ``WWW-Authenticate: Bearer``
(RFC 6750 §3), the same body from the engine and from the router in front of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from inferctl.contract.errors import APIError
from inferctl.contract.http import Unauthorized, check_bearer


def api_key_refusal(headers: Iterable[tuple[bytes, bytes]], api_key: str) -> APIError | None:
    """None when the raw ASGI ``headers`` (``(name, value)`` pairs, lowercase byte names) carry
    ``Authorization: Bearer <api_key>`` (the first such header counts); else the 401
    :class:`APIError` (message ``missing API key: ...`` or ``incorrect API key``). Raises nothing."""
    header = None
    for name, value in headers:
        if name == b"authorization":
            header = value.decode("latin-1")
            break
    try:
        check_bearer(header, api_key)
    except Unauthorized as exc:
        message = ("missing API key: send 'Authorization: Bearer <key>'" if exc.reason == "missing_token"
                   else "incorrect API key")
        return APIError(401, message, code="invalid_api_key", headers=dict(exc.headers))
    return None
