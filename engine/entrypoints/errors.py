"""Error rendering for the engine's HTTP API: every failure is the OpenAI error object.

* :func:`install_error_handlers` — :class:`~inferctl.contract.errors.APIError`, FastAPI's
  validation errors (never its 422 shape), unknown routes (404), wrong methods (405) and any
  unhandled exception (500, logged) all answer ``{"error": {"message", "type", "param",
  "code"}}``.
* :func:`rejection_to_api_error` — a body or token refused by :mod:`inferctl.contract.http`
  as an APIError with the engine's codes.
* :func:`engine_error_to_api` / :func:`output_failure` — the engine's exceptions and failed
  outputs as HTTP answers: never a 500 for an out-of-memory request (503 with
  ``Retry-After`` when a retry may succeed, 400 when the request can never fit).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from inferctl.contract.errors import REJECTION_CODES, APIError, validation_error_to_api_error
from inferctl.contract.http import RequestRejected
from inferctl.contract.openapi import allow_header
from inferctl.engine.entrypoints.state import ServedModel

if TYPE_CHECKING:
    from inferctl.engine.engine import RequestOutput

log = logging.getLogger(__name__)



def error_response(err: APIError) -> JSONResponse:
    """The OpenAI error object with ``err.status`` and ``err.headers``."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers or None)


def unavailable(code: str, message: str, retry_after: int, param: str | None = None) -> APIError:
    """A 503 of the engine's API (``type`` ``service_unavailable_error``) with ``Retry-After``
    (seconds): draining, out of memory, an engine not running, not answering or overloaded."""
    return APIError(503, message, param=param, code=code, err_type="service_unavailable_error",
                    headers={"Retry-After": str(retry_after)})


def rejection_to_api_error(exc: RequestRejected) -> APIError:
    """A refused body as an APIError: same status, message and ``param``; ``code`` from
    :data:`REJECTION_CODES` (413 ``request_too_large``, 400 ``invalid_json`` ...)."""
    return APIError(exc.status, exc.message, param=exc.param, code=REJECTION_CODES.get(exc.reason, exc.reason),
                    headers=exc.headers or None)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that render every error as the OpenAI error object."""

    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error_to_api_error(list(exc.errors())))

    @app.exception_handler(404)
    async def _not_found(request: Request, _exc: Exception) -> JSONResponse:
        return error_response(APIError(404, f"no route {request.method} {request.url.path}", code="not_found"))

    @app.exception_handler(405)
    async def _method(request: Request, _exc: Exception) -> JSONResponse:
        return error_response(APIError(405, f"method {request.method} is not allowed on {request.url.path}",
                                       code="method_not_allowed",
                                       headers={"Allow": allow_header(request.app, request.url.path)}))

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error: %s", exc)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error"))


def engine_error_to_api(exc: Exception, served: ServedModel, retry_after: int) -> APIError | None:
    """Map an engine-side exception to an APIError (None: not an engine request error).

    ``AdmissionError`` (counted by the engine itself) keeps its status, field and message;
    a 503 (draining) gets ``Retry-After`` (seconds). ``SamplingParamsError`` is a 400 naming
    its field (counted here, the engine never saw the request). ``EngineDeadError`` or an
    engine that is not started is a 503 ``engine_unavailable``; ``EngineOverloadedError`` (an
    engine core process that reads nothing) a 503 ``engine_overloaded``, both with ``Retry-After``.
    """
    name = type(exc).__name__
    if name == "EngineOverloadedError":
        served.count_error("overloaded")
        return unavailable("engine_overloaded", str(exc), retry_after)
    if name == "AdmissionError":
        status = int(getattr(exc, "status", 400) or 400)
        param = getattr(exc, "field", None)
        message = str(getattr(exc, "message", None) or exc)
        if status == 503:
            return unavailable("engine_draining", message, retry_after, param)
        code = "context_length_exceeded" if param in ("max_tokens", "prompt") else "invalid_request"
        if param and not message.startswith(f"{param}"):
            message = f"{param}: {message}"
        return APIError(status, message, param=param, code=code)
    if name == "SamplingParamsError":
        served.count_error("invalid_request")
        return APIError(400, str(exc), param=getattr(exc, "field", None), code="invalid_value")
    if name == "EngineDeadError" or (isinstance(exc, RuntimeError) and "not started" in str(exc)):
        served.count_error("overloaded")
        return unavailable("engine_unavailable", f"the engine is not running: {exc}", retry_after)
    return None


def output_failure(out: RequestOutput, retry_after: int) -> APIError | None:
    """An APIError for a RequestOutput that finished with ``finish_reason == "error"``.

    The engine sets ``error_status``: 400 when the request can never fit (an "impossible"
    OOM), 503 when it failed after its OOM retries (``Retry-After``: retry later, e.g. after
    the int8 switch), 500 for an internal step error. The engine counts the error.
    """
    if getattr(out, "finish_reason", None) != "error":
        return None
    message = str(getattr(out, "error", None) or "the request failed in the engine")
    status = int(getattr(out, "error_status", None) or 500)
    if status == 400:
        return APIError(400, message, code="request_too_large_for_device")
    if status == 503:
        return unavailable("out_of_memory", message, retry_after)
    return APIError(status, message, code="engine_error", err_type="server_error")


def raise_on_failure(out: RequestOutput, retry_after: int) -> None:
    """Raise :func:`output_failure`'s APIError when ``out`` is a failed RequestOutput."""
    failure = output_failure(out, retry_after)
    if failure is not None:
        raise failure
