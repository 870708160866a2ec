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


#: One encoder for every document (``json.dumps`` with these options builds a new one per call).
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def dumps(obj: Any) -> str:
    """Strict JSON (NaN/inf → null via json_safe; ``allow_nan=False`` as a guard).

    Fast path: ``obj`` is encoded as is; only when that fails (a non-finite float, a numpy
    scalar) is it copied through ``json_safe`` first — the same text either way, since
    ``json_safe`` changes nothing else.
    """
    try:
        return _ENCODER.encode(obj)
    except (ValueError, TypeError):
        return _ENCODER.encode(json_safe(obj))


def json_response(obj: Any, status: int = 200, headers: dict | None = None) -> Response:
    """``obj`` as an ``application/json`` response (:func:`dumps`)."""
    return Response(dumps(obj), status_code=status, media_type="application/json", headers=headers)


def sse(obj: Any) -> bytes:
    """One SSE event: ``data: <strict JSON>\\n\\n``."""
    return b"data: " + dumps(obj).encode("utf-8") + b"\n\n"


class Hole:
    """A placeholder in a :class:`ChunkTemplate` document."""

    __slots__ = ()


#: The placeholder value of :class:`ChunkTemplate` documents.
HOLE = Hole()


class ChunkTemplate:
    """An SSE event serialised once, with holes filled per chunk: ``fill(*values)`` gives the
    same bytes as ``sse(doc with the holes replaced by values)`` without walking and encoding
    the whole document for every token.

    Args:
        doc: a JSON document (dicts, lists, strings, numbers, None) in which some values are
            :data:`HOLE`, in document (key insertion) order.

    ``fill`` takes one value per hole, each a ``str``, an ``int`` (not bool) or None; any other
    value (a float that might be NaN, a dict) is encoded through :func:`sse` instead, so the
    output is always what :func:`sse` would give. Raises ValueError (``fill``) for a wrong
    number of values.
    """

    _MARK = "\x00hole\x00"

    def __init__(self, doc: Any) -> None:
        holes: list[int] = []
        text = dumps(_replace_holes(doc, self._MARK, holes))
        parts = text.split(_ENCODER.encode(self._MARK))
        self._doc = doc
        self._n = len(holes)
        self._parts: list[bytes] | None = None   # None: the mark occurs in the document itself
        if len(parts) - 1 == self._n:
            self._parts = [p.encode("utf-8") for p in parts]
            self._parts[0] = b"data: " + self._parts[0]
            self._parts[-1] += b"\n\n"

    def fill(self, *values: Any) -> bytes:
        """The event with the holes set to ``values`` (see the class doc)."""
        if len(values) != self._n:
            raise ValueError(f"ChunkTemplate.fill: {self._n} values expected, got {len(values)}")
        parts = self._parts
        if parts is None:
            return sse(_fill_holes(self._doc, iter(values)))
        out = [parts[0]]
        for value, part in zip(values, parts[1:]):
            if value is None:
                out.append(b"null")
            elif type(value) is str:
                out.append(_ENCODER.encode(value).encode("utf-8"))
            elif type(value) is int:
                out.append(str(value).encode("ascii"))
            else:
                return sse(_fill_holes(self._doc, iter(values)))
            out.append(part)
        return b"".join(out)


def _replace_holes(doc: Any, mark: str, holes: list[int]) -> Any:
    if doc is HOLE:
        holes.append(1)
        return mark
    if isinstance(doc, dict):
        return {k: _replace_holes(v, mark, holes) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_replace_holes(v, mark, holes) for v in doc]
    return doc


def _fill_holes(doc: Any, values: Any) -> Any:
    if doc is HOLE:
        return next(values)
    if isinstance(doc, dict):
        return {k: _fill_holes(v, values) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_fill_holes(v, values) for v in doc]
    return doc


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
