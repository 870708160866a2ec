"""The engine's admin API: ``POST /admin/precision|fault|drain|route`` and ``GET /admin/route``.

Every call needs ``Authorization: Bearer <token>`` (:func:`inferctl.contract.http.check_bearer`):
401 ``invalid_api_key`` with a missing or wrong token, 403 ``admin_disabled`` when the server
has no token configured. The token is checked before the body is read. Bodies are the strict
shapes of :mod:`inferctl.contract.admin` (unknown fields refused, 400 naming the field).
``model`` omitted means every served model (precision, drain); ``/admin/route {"model":
"main", "to": "light"}`` sends requests for ``main`` to ``light`` (one hop), ``"to": null``
clears the route. An engine that cannot take the command (an engine core process that is gone,
or did not answer within its call timeout) is a 503 ``engine_unavailable`` with ``Retry-After``.
A drain sets the server's own gate first: ``/ready`` and admission follow it at once, even when
the engine's confirmation then times out (the engine applies it when it reads it).
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel

from inferctl.contract.admin import AdminDrainRequest, AdminFaultRequest, AdminPrecisionRequest, AdminRouteRequest
from inferctl.contract.errors import APIError
from inferctl.contract.http import Unauthorized, check_bearer
from inferctl.contract.openai import validate_model
from inferctl.contract.openapi import route_doc
from inferctl.contract.precision import START_ONLY_MODES
from inferctl.engine.async_engine import EngineDeadError
from inferctl.engine.entrypoints.errors import unavailable
from inferctl.engine.entrypoints.serving import read_json
from inferctl.engine.entrypoints.sse import json_response
from inferctl.engine.entrypoints.state import ServerState, server_state

B = TypeVar("B", bound=BaseModel)


async def admin_state(request: Request, state: Annotated[ServerState, Depends(server_state)]) -> ServerState:
    """FastAPI dependency: the server state once the bearer token checks out (403 when no token
    is configured, 401 for a missing or wrong one)."""
    if state.admin_token is None:
        raise APIError(403, "the admin API is disabled because no admin token is configured; start the engine "
                            "with --admin-token TOKEN or set INFERCTL_ADMIN_TOKEN", code="admin_disabled")
    try:
        check_bearer(request.headers.get("authorization"), state.admin_token)
    except Unauthorized:
        raise APIError(401, "missing or invalid admin token: send 'Authorization: Bearer <token>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}) from None
    return state


AdminState = Annotated[ServerState, Depends(admin_state)]
router = APIRouter(prefix="/admin")
ROUTES_SCHEMA = {"type": "object", "required": ["routes"],
                 "properties": {"routes": {"type": "object", "additionalProperties": {"type": "string"}}}}
#: The statuses every admin route can give (bearer token: 401; no token configured: 403).
ADMIN_ERRORS = (400, 403, 404, 413, 503)


def engine_unavailable(served_name: str, exc: BaseException, state: ServerState, done: str = "") -> APIError:
    """503 ``engine_unavailable`` for an engine that could not take an admin command
    (``EngineDeadError``, ``TimeoutError``); ``done``: what was applied anyway."""
    return unavailable("engine_unavailable", f"model {served_name!r}: the engine did not take the command: "
                                             f"{exc}{done}", state.retry_after_seconds)


async def _body(request: Request, state: ServerState, cls: type[B]) -> B:
    """The body validated as ``cls`` (413/400 as :func:`~inferctl.engine.entrypoints.serving.read_json`,
    400 naming the field; a key given twice is refused, never the last value acted on)."""
    return validate_model(cls, await read_json(request, state, reject_duplicate_keys=True))


@router.post("/precision", **route_doc(request=AdminPrecisionRequest, bearer=True, errors=(*ADMIN_ERRORS, 409),
                                            response_schema={"type": "object",
                                                             "required": ["requested", "current", "models"]}))
async def admin_precision(request: Request, state: AdminState) -> Response:
    """Ask the named (or every) model for a precision switch, applied before its next step.
    A start-only mode (int4, contract/precision.py) is neither switched to (400) nor away from
    (409) at run time: an int4 engine holds no full-precision weights to go back to."""
    body = await _body(request, state, AdminPrecisionRequest)
    targets = state.admin_targets(body.model)
    for served in targets:     # every target checked before any switch is asked for
        current = served.precision()
        if body.mode in START_ONLY_MODES and current != body.mode:
            raise APIError(400, f"mode: {body.mode} is chosen at the engine's start (--precision {body.mode}), never "
                                "switched to at run time (it drops the full-precision weights for good); a running "
                                "engine switches between full and int8", param="mode", code="start_only_mode")
        if current in START_ONLY_MODES and body.mode != current:
            raise APIError(409, f"mode: {served.name} runs {current}, chosen at its start: it holds no full-precision "
                                f"weights to switch to {body.mode}; restart it without --precision {current}",
                           param="mode", code="start_only_mode")
    for served in targets:
        try:
            served.request_precision(body.mode)
        except ValueError as exc:
            raise APIError(400, f"mode: {exc}", param="mode", code="invalid_value") from None
        except EngineDeadError as exc:
            raise engine_unavailable(served.name, exc, state) from None
    main = targets[0]
    return json_response({"requested": body.mode, "current": main.precision(), "models": [t.name for t in targets]})


@router.post("/fault", **route_doc(request=AdminFaultRequest, bearer=True, errors=ADMIN_ERRORS,
                                        response_schema={"type": "object",
                                                         "required": ["injected", "count", "model"]}))
async def admin_fault(request: Request, state: AdminState) -> Response:
    """Make the next ``count`` steps of one model run out of memory for real."""
    body = await _body(request, state, AdminFaultRequest)
    served = state.lookup(body.model)
    try:
        served.inject_fault(body.kind, body.count)
    except (ValueError, TypeError) as exc:
        raise APIError(400, f"kind: {exc}", param="kind", code="invalid_value") from None
    except EngineDeadError as exc:
        raise engine_unavailable(served.name, exc, state) from None
    return json_response({"injected": body.kind, "count": body.count, "model": served.name})


@router.post("/drain", **route_doc(request=AdminDrainRequest, bearer=True, errors=ADMIN_ERRORS,
                                        response_schema={"type": "object", "required": ["draining", "models"]}))
async def admin_drain(request: Request, state: AdminState) -> Response:
    """Stop (or resume) admitting requests on the named (or every) model: the server's gate is
    set first (``/ready``, admission), then each engine's, waited for without blocking the loop."""
    body = await _body(request, state, AdminDrainRequest)
    targets = state.admin_targets(body.model)
    for served in targets:
        state.draining[served.name] = body.draining
    for served in targets:
        try:
            await served.set_draining(body.draining)
        except (EngineDeadError, TimeoutError) as exc:
            gate = "admits no new requests" if body.draining else "admits requests again"
            then = ("the engine applies it when it reads its input again" if isinstance(exc, TimeoutError) else
                    "the server stops for its supervisor to restart it")
            raise engine_unavailable(served.name, exc, state,
                                     f"; the server's own gate is set (it {gate}); {then}") from None
    return json_response({"draining": body.draining, "models": [t.name for t in targets]})


@router.post("/route", **route_doc(request=AdminRouteRequest, bearer=True, errors=ADMIN_ERRORS,
                                        response_schema=ROUTES_SCHEMA))
async def admin_route(request: Request, state: AdminState) -> Response:
    """Set or clear the route of one served model to another."""
    body = await _body(request, state, AdminRouteRequest)
    source = state.lookup(body.model)
    if body.to is None or body.to == source.name:
        state.routes.pop(source.name, None)
    else:
        target = state.lookup(body.to, param="to")
        state.routes[source.name] = target.name
    return json_response({"routes": dict(state.routes)})


@router.get("/route", **route_doc(bearer=True, errors=(403,), response_schema=ROUTES_SCHEMA))
async def admin_routes(state: AdminState) -> Response:
    """The active routes."""
    return json_response({"routes": dict(state.routes)})
