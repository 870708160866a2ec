"""The optional API key of ``/v1/*`` (vLLM's ``--api-key``; ``$INFERCTL_API_KEY``).

With a key set, every request whose path is ``/v1`` or starts with ``/v1/`` must carry
``Authorization: Bearer <key>`` (checked in constant time by
:func:`inferctl.contract.http.check_bearer`); otherwise it is answered 401 with the OpenAI
error object (``type: invalid_request_error``, ``code: invalid_api_key``) and
``WWW-Authenticate: Bearer`` (RFC 6750 section 3) before the body is read. Everything else
stays open: ``/health``, ``/ready``, ``/metrics``, ``/stats`` (probes and scrapers), the
tokenizer routes, and ``/admin/*`` (its own token).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from inferctl.contract.errors import APIError
from inferctl.contract.http import Unauthorized, check_api_key, check_bearer


def protected(path: str) -> bool:
    """True for the paths the API key guards (``/v1`` and below)."""
    return path == "/v1" or path.startswith("/v1/")


class ApiKeyMiddleware:
    """Pure ASGI middleware: 401 on ``/v1/*`` without ``Authorization: Bearer <api_key>``.

    Raises ``ValueError`` for a key no client could send (:func:`~inferctl.contract.http.check_api_key`:
    empty, blank, too long, not visible ASCII)."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.api_key = check_api_key(api_key, "api_key")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not protected(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        try:
            check_bearer(header, self.api_key)
        except Unauthorized as exc:
            message = ("missing API key: send 'Authorization: Bearer <key>'" if exc.reason == "missing_token"
                       else "incorrect API key")
            err = APIError(401, message, code="invalid_api_key", headers=dict(exc.headers))
            await JSONResponse(err.body(), status_code=401, headers=err.headers)(scope, receive, send)
            return
        await self.app(scope, receive, send)
