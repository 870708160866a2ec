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

from inferctl.contract.client_key import api_key_refusal
from inferctl.contract.http import check_api_key


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
        err = api_key_refusal(scope.get("headers") or (), self.api_key)
        if err is not None:
            await JSONResponse(err.body(), status_code=401, headers=err.headers)(scope, receive, send)
            return
        await self.app(scope, receive, send)
