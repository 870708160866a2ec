"""Host names: the ``Host`` header rule against DNS rebinding and the check of a host to bind.

* :func:`host_allowed` / :class:`HostGuard` — the ``Host`` header rule (DNS rebinding) as a
  pure function and as a framework-free ASGI middleware (421 for a refused ``Host``).
* :func:`check_bind_host` — an engine/router ``--host`` or the controller's ``listen.host``:
  an IP literal or an RFC 1123 host name, else ValueError naming the field.

No web framework is imported (the middleware speaks raw ASGI).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from typing import Any

from inferctl.contract.http import RequestRejected

#: Host names that always mean this machine (RFC 6761 section 6.3: "localhost" is loopback).
LOOPBACK_NAMES = ("localhost",)
#: Status of a refused ``Host``: 421 Misdirected Request (RFC 9110 section 15.5.20).
HOST_REFUSED_STATUS = 421


def host_name(host_header: str) -> str:
    """The name part of a ``Host`` header value: port dropped, brackets of an IPv6 literal
    dropped, lower case, one trailing dot dropped (``"LocalHost.:8000"`` → ``"localhost"``,
    ``"[::1]:80"`` → ``"::1"``)."""
    value = host_header.strip().lower()
    if value.startswith("["):
        name = value[1:].partition("]")[0]
    else:
        name = value.rpartition(":")[0] if value.count(":") == 1 else value
    return name[:-1] if name.endswith(".") else name


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def is_loopback(name: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1) — a bind address or
    a :func:`host_name`."""
    if name in LOOPBACK_NAMES:
        return True
    ip = _ip(name)
    return ip is not None and ip.is_loopback


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")   # one DNS label (RFC 1123 section 2.1)


def check_bind_host(host: str, source: str = "--host") -> str:
    """``host`` (engine/router ``--host``, controller ``listen.host``) unchanged when it is an IP literal (IPv6
    without brackets) or a DNS host name (RFC 1123 section 2.1: labels of letters, digits and ``-``, 1-63
    characters, 253 in all); else ValueError ``"<source>: 'x' is not a host name or address"`` (no prefix for "")."""
    name = host[:-1] if host.endswith(".") else host
    if _ip(host) is None and not (0 < len(name) <= 253 and all(map(_HOST_LABEL.fullmatch, name.split(".")))):
        raise ValueError(f"{source}: " * bool(source) + f"{host!r} is not a host name or address")
    return host


def _matches(name: str, pattern: str) -> bool:
    pattern = pattern.strip().lower().rstrip(".")
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return name.endswith(pattern[1:]) and len(name) > len(pattern) - 1
    return name == pattern


def host_allowed(host_header: str | None, bind_host: str, allowed_hosts: tuple[str, ...] | list[str] = ()) -> bool:
    """Whether a request with this ``Host`` header may be served (the DNS-rebinding rule).

    A DNS-rebinding page makes a browser send requests to this server under the attacker's
    own host name, so the name in ``Host`` is what tells them apart. Rules, first match wins:

    1. no ``Host`` header (HTTP/1.0 tools; a browser always sends one) → allowed;
    2. a loopback name (``localhost``, 127.0.0.0/8, ``[::1]``; any port) → allowed;
    3. a name in ``allowed_hosts`` (exact, ``*.example.com`` for its subdomains, ``*`` for
       any) → allowed;
    4. the server is bound to a loopback address (``bind_host`` 127.x, ::1, localhost) →
       refused;
    5. bound elsewhere with no ``allowed_hosts`` → allowed; with some, an IP literal is
       allowed (a rebinding page cannot make a browser send one: probes and scrapes by pod
       IP keep working) and any other name is refused.

    Pure; names compared after :func:`host_name`.
    """
    if host_header is None or not host_header.strip():
        return True
    name = host_name(host_header)
    if is_loopback(name):
        return True
    if any(_matches(name, p) for p in allowed_hosts):
        return True
    if is_loopback(host_name(bind_host)):
        return False
    return not allowed_hosts or _ip(name) is not None


class HostRefused(RequestRejected):
    """421 for a ``Host`` that :func:`host_allowed` refuses (``param="Host"``)."""

    def __init__(self, host_header: str, bind_host: str, allowed_hosts: tuple[str, ...]) -> None:
        extra = f", {', '.join(allowed_hosts)}" if allowed_hosts else ""
        where = ("bound to the loopback address " if is_loopback(host_name(bind_host)) else "bound to ") + bind_host
        super().__init__(HOST_REFUSED_STATUS, "host_not_allowed",
                         f"Host: {host_header[:100]!r} is not allowed: this server is {where} and accepts the host "
                         f"names localhost, 127.0.0.1, [::1]{extra} (a guard against DNS rebinding); "
                         "add --allowed-host NAME to accept another", param="Host")


def _default_render(exc: RequestRejected) -> bytes:
    return json.dumps({"error": {"message": exc.message, "type": "invalid_request_error",
                                 "param": exc.param, "code": exc.reason}}).encode("utf-8")


class HostGuard:
    """ASGI middleware applying :func:`host_allowed` to every HTTP request (no framework import).

    Args:
        app: the ASGI app to guard.
        bind_host: the address the server listens on (``--host``).
        allowed_hosts: extra accepted names (``--allowed-host``, repeatable).
        render: a refusal → the JSON body bytes, in the API's own error envelope (default: the
            OpenAI error object with ``code="host_not_allowed"``).

    A refused request gets 421 with that JSON body before the app sees it; websocket
    connections are closed (code 1008, policy violation). Lifespan events pass through.
    """

    def __init__(self, app: Any, bind_host: str, allowed_hosts: tuple[str, ...] | list[str] = (),
                 render: Callable[[RequestRejected], bytes] | None = None) -> None:
        self.app = app
        self.bind_host = bind_host
        self.allowed_hosts = tuple(allowed_hosts)
        self.render = render or _default_render

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope.get("headers") or () if k == b"host"), None)
        host = raw.decode("latin-1") if raw is not None else None
        if host_allowed(host, self.bind_host, self.allowed_hosts):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        exc = HostRefused(host or "", self.bind_host, self.allowed_hosts)
        body = self.render(exc)
        await send({"type": "http.response.start", "status": exc.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
