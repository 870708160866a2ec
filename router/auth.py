"""The router's own client API key (``inferctl router --api-key`` / ``$INFERCTL_API_KEY``).

The engine's rule (``engine/entrypoints/auth.py``), answered the same way: with a key set,
every request whose path is ``/v1`` or starts with ``/v1/`` must carry
``Authorization: Bearer <key>`` (compared in constant time by
:func:`inferctl.contract.http.check_bearer`); otherwise it is answered 401 with the OpenAI
error object (``type: invalid_request_error``, ``code: invalid_api_key``, the engine's
``message``) and ``WWW-Authenticate: Bearer`` (RFC 6750 section 3), before the body is read.
``/health``, ``/ready``, ``/metrics``, ``/replicas`` and ``/openapi.json`` stay open (probes,
scrapers).

The router checks the key in :class:`inferctl.router.app.RouterApp` itself, ahead of both its
hot path and FastAPI's stack (a middleware would not see the hot path). A client the router
admitted is forwarded with the replicas' key (``--upstream-api-key-env``) in place of its own
``Authorization`` when the router has one (one key at the front door), else with its own,
which the replicas judge again. A router without its own key never sends the replicas' key on
a client's request (docs/router.md "API keys").
"""

from __future__ import annotations

from inferctl.contract.client_key import api_key_refusal
from inferctl.contract.errors import APIError
from inferctl.contract.http import check_api_key

#: The flag (and variable) a bad key is reported under.
API_KEY_SOURCE = "--api-key (or $INFERCTL_API_KEY)"


def protected(path: str) -> bool:
    """True for the paths the API key guards (``/v1`` and below), as on the engine."""
    return path == "/v1" or path.startswith("/v1/")


class ClientKey:
    """The router's client key check. ``api_key``: the key clients must send.

    Raises:
        ValueError: a key no client could send (:func:`inferctl.contract.http.check_api_key`:
            empty, blank, longer than 4,096 characters, not visible ASCII); the message names
            :data:`API_KEY_SOURCE`, never the key.
    """

    def __init__(self, api_key: str) -> None:
        self.api_key = check_api_key(api_key, API_KEY_SOURCE)

    def __repr__(self) -> str:      # never the key (logs, tracebacks)
        return "ClientKey(<redacted>)"

    def refusal(self, headers: list | tuple) -> APIError | None:
        """None when the raw ASGI ``headers`` (``[(name, value), ...]``, lowercase byte names)
        carry ``Authorization: Bearer <api_key>``; else the engine's 401 :class:`APIError`
        (``invalid_api_key``; message ``missing API key: ...`` or ``incorrect API key``)."""
        return api_key_refusal(headers, self.api_key)
