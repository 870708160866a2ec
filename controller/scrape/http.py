"""A bounded HTTP request: at most so many bytes of body, within one deadline for the whole call.

httpx's own timeouts bound each read, not the whole answer, and read any body size; a telemetry
endpoint (an engine's ``/metrics`` or ``/stats``, a GPU exporter) that trickles or sends an
endless body must not stall or swell the controller.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

#: Largest response body read from an engine or a GPU exporter, in bytes. A real vLLM
#: ``/metrics`` with every histogram is well under 1 MiB (a recorded scrape: 29 KiB), a bundled
#: ``/stats`` a few KiB; anything past this is not telemetry.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


class ResponseTooLarge(httpx.HTTPError):
    """A response body larger than the bound the caller set (read no further)."""


class ResponseDeadlineExceeded(httpx.TimeoutException):
    """A response body still arriving when the whole call's deadline passed (httpx's own
    timeouts bound each read, so a body that trickles or never ends would not stop)."""


def bounded_request(client: httpx.Client, method: str, url: str, *, deadline_s: float,
                    max_bytes: int = MAX_RESPONSE_BYTES, **kwargs: Any) -> httpx.Response:
    """``client.request(method, url, **kwargs)`` that reads at most ``max_bytes`` of (decoded)
    body within ``deadline_s`` seconds in all, and returns the response with its body read.

    Raises:
        ResponseTooLarge: the body (or its ``Content-Length``) is over ``max_bytes``.
        ResponseDeadlineExceeded: the body was still arriving after ``deadline_s``.
        httpx.HTTPError: whatever the request itself raises.
    """
    start = time.monotonic()
    with client.stream(method, url, **kwargs) as resp:
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise ResponseTooLarge(f"{method} {url}: body of {int(declared)} bytes > {max_bytes}")
        chunks: list[bytes] = []
        size = 0
        for chunk in resp.iter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise ResponseTooLarge(f"{method} {url}: body larger than {max_bytes} bytes")
            if time.monotonic() - start > deadline_s:
                raise ResponseDeadlineExceeded(f"{method} {url}: body still arriving after {deadline_s:g} s")
            chunks.append(chunk)
        # the body is decoded already: drop the headers that describe the wire encoding
        headers = [(k, v) for k, v in resp.headers.multi_items()
                   if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(resp.status_code, headers=headers, content=b"".join(chunks),
                              request=resp.request)
