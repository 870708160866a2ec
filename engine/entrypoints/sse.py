"""Response bodies: strict JSON documents and Server-Sent Events streams.

Every document is strictly valid JSON (RFC 8259): non-finite floats (logprobs may be NaN or
-inf) become ``null`` (:func:`inferctl.engine.quality.json_safe`). A stream is
``text/event-stream`` of ``data: {...}\\n\\n`` chunks ending ``data: [DONE]``; a failure
after the first chunk is sent as an ``error`` event (the OpenAI error object), then
``[DONE]`` (:func:`stream_guard`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import Response, StreamingResponse

from inferctl.contract.errors import APIError
from inferctl.engine.entrypoints.generation import Started, aclose
from inferctl.engine.entrypoints.state import ServedModel
from inferctl.engine.metrics import ABORT_CLIENT_DISCONNECT
from inferctl.engine.quality import json_safe

log = logging.getLogger(__name__)

#: The last event of every stream.
DONE = b"data: [DONE]\n\n"


def dumps(obj: Any) -> str:
    """Strict JSON (NaN/inf → null via json_safe; ``allow_nan=False`` as a guard)."""
    return json.dumps(json_safe(obj), allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def json_response(obj: Any, status: int = 200, headers: dict | None = None) -> Response:
    """``obj`` as an ``application/json`` response (:func:`dumps`)."""
    return Response(dumps(obj), status_code=status, media_type="application/json", headers=headers)


def sse(obj: Any) -> bytes:
    """One SSE event: ``data: <strict JSON>\\n\\n``."""
    return b"data: " + dumps(obj).encode("utf-8") + b"\n\n"


def event_stream(body: AsyncIterator[bytes]) -> StreamingResponse:
    """``body`` as a ``text/event-stream`` response (no caching, no proxy buffering)."""
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """The OpenAI ``usage`` object (``total_tokens = prompt_tokens + completion_tokens``)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def usage_chunk(rid: str, obj: str, created: int, served: ServedModel, prompt_tokens: int,
                completion_tokens: int) -> bytes:
    """The last SSE chunk of a stream with ``stream_options.include_usage``: no choices."""
    return sse({"id": rid, "object": obj, "created": created, "model": served.name, "choices": [],
                "usage": usage(prompt_tokens, completion_tokens)})


async def stream_guard(served: ServedModel, started: list[Started],
                       body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Send ``body``; on an engine failure send an SSE error event; always end with [DONE]
    and close every generation (aborting unfinished ones — also on client disconnect, which is
    counted as an abort with reason ``client_disconnect``)."""
    try:
        async for chunk in body:
            yield chunk
    except (asyncio.CancelledError, GeneratorExit):
        served.count_abort(ABORT_CLIENT_DISCONNECT)   # the client left mid-stream (or timed out)
        raise
    except APIError as err:
        yield sse(err.body())
    except Exception as exc:  # noqa: BLE001 - a stream must end cleanly
        log.exception("streaming failed: %s", exc)
        served.count_error("internal")
        yield sse(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").body())
    finally:
        for agen, _ in started:
            await aclose(agen)
    yield DONE
