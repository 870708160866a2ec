"""The controller's HTTP API (FastAPI).

* ``GET /metrics`` — Prometheus text of the controller registry (mode gauge, switches,
  resets, breaker state, signals, source health).
* ``GET /status`` — JSON: controller, engines (mode, queue, memory, policy states), GPUs,
  rails.
* ``GET /events?since_id=&limit=&kind=&target=`` — the event log (``limit`` 1..1000, default
  100; without ``since_id`` the latest events; with it the next ones after that id).
* ``GET /health`` — ``{"status": "ok"}``.
* ``POST /actions/degrade|rollback|drain|undrain|restart`` ``{"engine": "name"}`` (restart also
  ``"force": true``: skip the fleet rails),
  ``POST /actions/unpin`` ``{"engine": "name"}``,
  ``POST /actions/reset-gpu`` ``{"gpu": 0, "dry_run": false}`` (``dry_run`` omitted: the
  rails' default), ``POST /actions/release-gpu`` ``{"gpu": 0}`` (after a node reboot or a
  GPU replacement: the hardware policy's isolation and the rails' lost mark are released;
  409 when there is nothing to release or the GPU source shows the GPU lost now),
  ``POST /actions/pause`` ``{"reason": "...", "engine"?: "name" | "gpu"?: N}`` and
  ``POST /actions/resume`` ``{"engine"?: ... | "gpu"?: ...}`` (neither: every automatic
  action; decisions are still logged as "would have acted"; resume of a scope not paused by
  an operator is 409; docs/policies.md "Pause") — bearer token
  (``Authorization: Bearer <token>``): 401 without it or with a wrong one, checked before
  the body. Bodies are strict JSON objects sent as ``Content-Type: application/json`` (415
  otherwise: a browser page cannot send one without asking first) (no NaN/Infinity, no key
  given twice, no unknown keys, no type coercion, at most :data:`MAX_BODY_BYTES`, nested at
  most :data:`MAX_JSON_DEPTH` deep); a bad one is 400 (413 when too large) naming the field;
  a GPU index is 0..:data:`MAX_GPU_INDEX`. An unknown engine is 404, and so is a GPU index the
  controller does not know (``reset-gpu`` and ``release-gpu`` while the last GPU reading is good,
  ``pause``/``resume`` ``gpu``), ``{"error": {"code": "gpu_not_found", "field": "gpu"}}``. An optional
  ``X-Inferctl-Actor: NAME`` header (1–64 of ``A-Z a-z 0-9 _ . @ -``) names the operator:
  the event log then says ``operator:NAME`` — a request never picks a policy's name as the
  source of an event, nor a metric label value.

Action answers: 200 when the action succeeded (or a dry run), 409 when a rail refused it,
502 when the engine or device call failed — always ``{"ok", "action", "target", "message",
"details", "event_id", "event_note"}``. The status is the action's, never the event log's:
when the event log cannot be written (disk full), the action still runs and answers as above
with ``event_id`` null and ``event_note`` saying the event waits in memory (or was dropped).
``GET /events`` adds ``buffered`` (events waiting in memory); 503 when the log cannot be read.
Errors are ``{"error": {"code", "message", "field"}}``. Every
response is strict JSON (RFC 8259).
"""

from __future__ import annotations

import json
import re
import sqlite3
import unicodedata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from inferctl.contract.hosts import HostGuard
from inferctl.contract.http import BodyRejected, RequestRejected, Unauthorized, check_bearer, read_json_body
from inferctl.contract.openapi import ControllerErrorEnvelope, Param, allow_header, install_openapi, route_doc
from inferctl.controller.exposition import FleetExposition
from inferctl.controller.actions import ActionResult
from inferctl.controller.events import EVENT_KINDS, json_safe
from inferctl.controller.operator import ReleaseRefused

MAX_EVENTS = 1000
#: Longest ``target`` filter: engine names are at most 64 characters, GPU targets shorter.
MAX_TARGET_CHARS = 256
MAX_BODY_BYTES = 64 * 1024
#: Event ids are SQLite INTEGER PRIMARY KEYs: signed 64-bit (sqlite.org/datatype3.html).
MAX_EVENT_ID = 2 ** 63 - 1
#: A real action body is one level deep; this leaves room and stays far below the
#: interpreter's recursion limit that a deeply nested body would otherwise hit (a 500).
MAX_JSON_DEPTH = 32
#: Longest echo of a caller's value in an error message (the rest is counted, not repeated).
MAX_ECHO_CHARS = 64
#: Highest GPU index an action body may name (NVML indexes GPUs from 0; no node has 1,000).
MAX_GPU_INDEX = 999
ACTOR_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
ENGINE_ACTIONS = ("degrade", "rollback", "drain", "undrain", "restart")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EngineActionBody(_Strict):
    engine: str


class RestartBody(EngineActionBody):
    force: bool = False     # skip the fleet rails (controller/fleet.py)


class ResetGpuBody(_Strict):
    gpu: int
    dry_run: bool | None = None     # None: the rails' default (rails.dry_run)


class ReleaseGpuBody(_Strict):
    gpu: int


class ResumeBody(_Strict):
    """Pause scope: ``engine`` or ``gpu`` (at most one); neither = every automatic action."""

    engine: str | None = None
    gpu: int | None = None


#: Longest pause reason (characters): a sentence for the event log and /status, not a document.
MAX_REASON_CHARS = 1024


#: Unicode categories a ``reason`` may not hold: control (Cc), format (Cf: bidi overrides such as
#: U+202E, zero-width characters), line and paragraph separators (Zl, Zp), lone surrogates (Cs) —
#: each can forge or hide text where the reason is shown (``/status``, events, a terminal).
REFUSED_TEXT_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
#: format characters that writing needs and that hide nothing: the zero-width non-joiner and
#: joiner (Persian, Indic scripts; emoji sequences such as a family) and the left-to-right and
#: right-to-left marks (Unicode UAX #9 implicit marks, unlike the overrides U+202A–U+202E)
ALLOWED_FORMAT_CHARS = frozenset("\u200c\u200d\u200e\u200f\u061c") | frozenset(map(chr, range(0xE0020, 0xE0080)))
#: characters that show nothing alone: a reason made only of these (and spaces) is empty
INVISIBLE_CHARS = ALLOWED_FORMAT_CHARS | frozenset("\u034f\u115f\u1160\u17b4\u17b5\u180e\u2800\u3164\uffa0")


def blank_text(value: str) -> bool:
    """True when ``value`` shows nothing: only white space and :data:`INVISIBLE_CHARS`."""
    return all(c.isspace() or c in INVISIBLE_CHARS for c in value)


def refused_char(value: str) -> str | None:
    """The first character of ``value`` in :data:`REFUSED_TEXT_CATEGORIES` (but
    :data:`ALLOWED_FORMAT_CHARS`) as ``U+XXXX`` (its category), or None."""
    for c in value:
        cat = unicodedata.category(c)
        if cat in REFUSED_TEXT_CATEGORIES and c not in ALLOWED_FORMAT_CHARS:
            return f"U+{ord(c):04X} ({cat})"
    return None


class PauseBody(ResumeBody):
    reason: str

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        if len(value) > MAX_REASON_CHARS:
            raise ValueError(f"at most {MAX_REASON_CHARS} characters, got {len(value)}")
        if blank_text(value):
            raise ValueError("required (why automation is paused); white space and invisible characters alone "
                             "say nothing")
        bad = refused_char(value)
        if bad is not None:
            raise ValueError(f"control, format or separator characters (newline, NUL, U+202E, U+2028, …) are not "
                             f"allowed; found {bad}")
        return value


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field, self.headers = status, code, message, field, headers


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(json_safe(doc), allow_nan=False, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _error(err: ApiError) -> Response:
    return _json({"error": {"code": err.code, "message": err.message, "field": err.field}},
                 err.status, err.headers)


def _echo(text: str) -> str:
    """``text`` quoted for an error message, cut to :data:`MAX_ECHO_CHARS`."""
    if len(text) <= MAX_ECHO_CHARS:
        return repr(text)
    return f"{text[:MAX_ECHO_CHARS]!r}... ({len(text)} characters)"


def _body_error(e: BodyRejected) -> ApiError:
    """The controller's answer to a body that ``contract.http`` refused (always ``field="body"``)."""
    if e.reason == "too_large":
        return ApiError(413, "body_too_large", f"body: {e.size} bytes > {e.limit}" if e.size is not None
                        else f"body: more than {e.limit} bytes", "body")
    if e.reason == "unsupported_media_type":
        return ApiError(415, "unsupported_media_type", e.message, "Content-Type")
    if e.reason == "disconnected":
        return ApiError(400, "client_disconnected", "body: the client disconnected before sending it", "body")
    if e.reason == "too_deep":
        return ApiError(400, "invalid_json", f"body: nested more than {e.limit} levels deep", "body")
    if e.reason in ("not_utf8", "invalid_json"):
        return ApiError(400, "invalid_json", f"body: not valid JSON ({(e.detail or '')[:200]})", "body")
    if e.reason == "duplicate_key":   # {"engine": "a", "engine": "b"}: refused, never the last one acted on
        return ApiError(400, "invalid_field", e.message, e.param)
    if e.reason == "bad_length":
        return ApiError(400, "invalid_header", f"body: {e.message}", "body")
    return ApiError(400, "invalid_body", "body: must be a JSON object", "body")   # empty, not_object


async def _body(request: Request, model: type[BaseModel]) -> Any:
    """The body as ``model``: strict JSON (``contract.http.read_json_body``: at most
    :data:`MAX_BODY_BYTES`, :data:`MAX_JSON_DEPTH` deep, no NaN/Infinity, no key twice, an object), then
    validated (unknown keys and type coercion refused). Raises :class:`ApiError` naming the
    field."""
    try:
        data = await read_json_body(request, MAX_BODY_BYTES, allow_nan=False, max_depth=MAX_JSON_DEPTH,
                                    check_unicode=False, require_object=True, reject_duplicate_keys=True)
    except BodyRejected as exc:
        raise _body_error(exc) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        field = ".".join(str(p) for p in e["loc"]) or "body"
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        raise ApiError(400, "invalid_field", f"{field}: {msg}", field) from None


def _once(request: Request, name: str) -> None:
    """400 naming ``name`` when the query gives it more than once (``?kind=a&kind=b``: which one
    was meant is not ours to guess; Starlette's ``get`` would keep the last)."""
    if len(request.query_params.getlist(name)) > 1:
        raise ApiError(400, "invalid_parameter", f"{name}: given twice in the query; give it once", name)


def _int_param(request: Request, name: str, default: int | None, lo: int, hi: int | None) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    # ASCII digits only: int() also reads full-width and other Unicode digits ("１０") and "1_000"
    if re.fullmatch(r"[+-]?[0-9]+", text) is None:
        raise ApiError(400, "invalid_parameter", f"{name}: {_echo(text)} is not an integer", name)
    value = int(text)
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise ApiError(400, "invalid_parameter", f"{name}: must be {bound}, got {value}", name)
    return value


def _check_gpu(gpu: int) -> None:
    """400 naming ``gpu`` and the limit unless ``0 <= gpu <= MAX_GPU_INDEX``."""
    if not 0 <= gpu <= MAX_GPU_INDEX:
        raise ApiError(400, "invalid_field", f"gpu: must be 0..{MAX_GPU_INDEX}, got {gpu}", "gpu")


def _result(res: ActionResult) -> Response:
    """The action's outcome decides the status; an event that could not be written yet (disk
    full) never turns a done action into an error: ``event_id`` is null and ``event_note`` says
    where the event is."""
    status = 200 if res.ok else (409 if res.refused else 502)
    return _json({"ok": res.ok, "action": res.action, "target": res.target, "message": res.message,
                  "refused": res.refused, "details": res.details, "event_id": res.event_id,
                  "event_note": res.event_note}, status)


def _render_refusal(exc: RequestRejected) -> bytes:
    """A request refused before routing (a ``Host`` the guard refuses) in the controller's envelope."""
    return json.dumps({"error": {"code": exc.reason, "message": exc.message, "field": exc.param}}).encode()


def create_app(controller: Any, admin_token: str, *, bind_host: str | None = None,
               allowed_hosts: tuple[str, ...] = ()) -> FastAPI:
    """The controller API over ``controller`` (a :class:`~controller.loop.Controller`).

    ``bind_host`` (the listen address): given, every request's ``Host`` must pass
    :func:`inferctl.contract.hosts.host_allowed` with ``allowed_hosts`` (421
    ``host_not_allowed`` otherwise: DNS rebinding); None checks no ``Host``.

    Raises:
        ValueError: ``admin_token`` empty (the actions would be open to anyone).
    """
    if not admin_token:
        raise ValueError("admin_token: required (generate one; the actions must not be open)")
    app = FastAPI(title="inferctl controller", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    if bind_host is not None:
        app.add_middleware(HostGuard, bind_host=bind_host, allowed_hosts=tuple(allowed_hosts), render=_render_refusal)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        return _error(exc)

    @app.exception_handler(404)
    async def _not_found(request: Request, _exc: Exception) -> Response:
        return _error(ApiError(404, "not_found", f"no route {request.method} {request.url.path}"))

    @app.exception_handler(405)
    async def _method(request: Request, _exc: Exception) -> Response:
        return _error(ApiError(405, "method_not_allowed", f"{request.method} not allowed on {request.url.path}",
                               headers={"Allow": allow_header(request.app, request.url.path)}))

    def auth(request: Request) -> str:
        try:
            check_bearer(request.headers.get("authorization"), admin_token)
        except Unauthorized as exc:
            raise ApiError(401, "unauthorized", exc.message, headers=exc.headers) from None
        name = request.headers.get("x-inferctl-actor")
        if name is None or name == "":
            return "operator"
        if not ACTOR_NAME.match(name):
            raise ApiError(400, "invalid_header", f"x-inferctl-actor: {_echo(name)} must be 1-64 characters"
                           " of letters, digits, '_', '.', '@', '-'", "x-inferctl-actor")
        return f"operator:{name}"

    @app.get("/health", **_doc(response_schema={"type": "object", "required": ["status"]}))
    def health() -> Response:
        return _json({"status": "ok"})

    # generate_latest's bytes at a tenth of its CPU for the fleet's per-engine/per-GPU series
    exposition = FleetExposition(controller.registry)

    @app.get("/metrics", **_doc(metrics=True))
    def metrics() -> Response:
        return Response(exposition.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/status", **_doc(response_schema={"type": "object"}))
    def status() -> Response:
        return _json(controller.status())

    @app.get("/events", **_doc(response_schema=_EVENTS, errors=(400, 503), params=_EVENT_PARAMS))
    def events(request: Request) -> Response:
        for name in ("since_id", "limit", "kind", "target"):
            _once(request, name)
        since_id = _int_param(request, "since_id", None, 0, MAX_EVENT_ID)
        limit = _int_param(request, "limit", 100, 1, MAX_EVENTS)
        kind = request.query_params.get("kind") or None
        if kind is not None and kind not in EVENT_KINDS:
            raise ApiError(400, "invalid_parameter", f"kind: {_echo(kind)} is not one of"
                           f" {', '.join(EVENT_KINDS)}", "kind")
        target = request.query_params.get("target") or None
        if target is not None and (len(target) > MAX_TARGET_CHARS or not target.isprintable()):
            raise ApiError(400, "invalid_parameter", f"target: must be at most {MAX_TARGET_CHARS} printable"
                           f" characters (an engine or GPU name), got {_echo(target)}", "target")
        log = controller.event_log
        try:
            rows = log.query(since_id=since_id, limit=limit, kind=kind, target=target)
            last_id = log.last_id()
        except sqlite3.Error as exc:
            raise ApiError(503, "event_log_unreadable", f"the event log cannot be read now ({exc})") from None
        return _json({"events": rows, "last_id": last_id, "buffered": getattr(log, "buffered", 0)})

    def _engine(body: EngineActionBody) -> str:
        if body.engine not in controller.engines:
            raise ApiError(404, "engine_not_found", f"engine: {_echo(body.engine)} is not a configured engine"
                           f" (known: {', '.join(sorted(controller.engines)) or 'none'})", "engine")
        return body.engine

    for action in ENGINE_ACTIONS:
        async def run_action(request: Request, action: str = action) -> Response:
            actor = auth(request)
            body = await _body(request, RestartBody if action == "restart" else EngineActionBody)
            name = _engine(body)
            force = {"force": True} if getattr(body, "force", False) else {}
            res = await run_in_threadpool(lambda: controller.manual(action, name, actor, **force))
            return _result(res)

        app.add_api_route(f"/actions/{action}", run_action, methods=["POST"], name=f"action_{action}",
                          **_action_doc(RestartBody if action == "restart" else EngineActionBody, 404))

    @app.post("/actions/unpin", **_action_doc(EngineActionBody, 404, 409))
    async def unpin(request: Request) -> Response:
        actor = auth(request)
        body = await _body(request, EngineActionBody)
        name = _engine(body)
        if not any(callable(getattr(p, "unpin", None)) for p in controller.policies.get(name, {}).values()):
            raise ApiError(409, "no_precision_policy", f"engine {name} has no precision policy", "engine")
        try:
            decisions = await run_in_threadpool(controller.unpin, name, actor)   # takes the controller lock
        except ValueError as exc:   # PolicyError: not pinned
            raise ApiError(409, "not_pinned", str(exc), "engine") from None
        return _json({"ok": True, "action": "unpin", "target": name,
                      "message": decisions[0].reason if decisions else "unpinned",
                      "decisions": [json_safe(d) for d in decisions]})

    def _known_gpu(gpu: int, *, telemetry_says: bool = False) -> None:
        """404 ``gpu_not_found`` naming ``gpu`` for a GPU index the controller does not know (the
        last GPU reading's, plus the GPUs engines are configured on). ``telemetry_says``: only
        when the last reading is good (telemetry down or not read yet: the caller's own checks
        answer, e.g. the reset rails' 409 "telemetry is down")."""
        reading = controller.state.reading
        if telemetry_says and (reading is None or not reading.ok):
            return
        known = controller.state.known_gpu_indices()
        if gpu not in known:
            raise ApiError(404, "gpu_not_found", f"gpu: {gpu} is not a GPU this controller knows "
                           f"(known: {', '.join(map(str, sorted(known))) or 'none'})", "gpu")

    @app.post("/actions/reset-gpu", **_action_doc(ResetGpuBody, 404))
    async def reset_gpu(request: Request) -> Response:
        actor = auth(request)
        body = await _body(request, ResetGpuBody)
        _check_gpu(body.gpu)
        _known_gpu(body.gpu, telemetry_says=True)
        res = await run_in_threadpool(controller.reset_gpu, body.gpu, body.dry_run, actor)
        return _result(res)

    def _scope(body: ResumeBody) -> str:
        if body.engine is not None and body.gpu is not None:
            raise ApiError(400, "invalid_field", "engine, gpu: give at most one (neither pauses everything)", "engine")
        if body.engine is not None:
            return f"engine:{_engine(EngineActionBody(engine=body.engine))}"
        if body.gpu is not None:
            _check_gpu(body.gpu)
            _known_gpu(body.gpu)
            return f"gpu:{body.gpu}"
        return "all"

    for verb in ("pause", "resume"):
        async def pause_or_resume(request: Request, verb: str = verb) -> Response:
            from inferctl.controller.pause import PauseError
            actor = auth(request)
            body = await _body(request, PauseBody if verb == "pause" else ResumeBody)
            scope = _scope(body)
            try:
                doc = (controller.pause(scope, body.reason, actor) if verb == "pause"
                       else controller.resume(scope, actor))
            except PauseError as exc:
                code = "not_paused" if verb == "resume" else "invalid_field"
                raise ApiError(409 if verb == "resume" else 400, code, str(exc),
                               "reason" if "reason" in str(exc)[:8] else "scope") from None
            return _json(doc)

        app.add_api_route(f"/actions/{verb}", pause_or_resume, methods=["POST"], name=f"action_{verb}",
                          **_action_doc(PauseBody if verb == "pause" else ResumeBody, 404, 409))

    @app.post("/actions/release-gpu", **_action_doc(ReleaseGpuBody, 404, 409))
    async def release_gpu(request: Request) -> Response:
        actor = auth(request)
        body = await _body(request, ReleaseGpuBody)
        _check_gpu(body.gpu)
        _known_gpu(body.gpu, telemetry_says=True)
        try:   # polls the GPU source and takes the controller lock: off the event loop
            doc = await run_in_threadpool(controller.release_gpu, body.gpu, actor)
        except ReleaseRefused as exc:
            raise ApiError(409, "release_refused", str(exc), "gpu") from None
        return _json({**doc, "refused": False})

    install_openapi(app, description="The inferctl controller: status, events, metrics and the operator's actions.")
    return app


def _doc(**kw: Any) -> dict:
    """:func:`inferctl.contract.openapi.route_doc` with the controller's error envelope."""
    return route_doc(envelope=ControllerErrorEnvelope, **kw)


def _action_doc(body: type[BaseModel], *errors: int) -> dict:
    """An action route's documentation: ``body``, the bearer token, 409 (a rail refused) and 502
    (the engine or device call failed) with the action answer, and ``errors``."""
    either = {"anyOf": [_ACTION, {"$ref": "#/components/schemas/ControllerErrorEnvelope"}]}
    answer = {"content": {"application/json": {"schema": either}}}
    return _doc(request=body, bearer=True, errors=(*errors, 409, 502), response_schema=_ACTION,
                extra={409: answer, 502: answer})


#: The action answer's schema (200, 409 and 502 alike; see the module docstring).
_ACTION = {"type": "object", "required": ["ok", "action", "target", "message"],
           "properties": {"ok": {"type": "boolean"}, "action": {"type": "string"}, "target": {"type": "string"},
                          "message": {"type": "string"}}}
_EVENTS = {"type": "object", "required": ["events", "last_id"],
           "properties": {"events": {"type": "array", "items": {"type": "object"}},
                          "last_id": {"type": ["integer", "null"]}, "buffered": {"type": "integer"}}}
_EVENT_PARAMS = [Param("since_id", {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID}, "events after this id"),
                 Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_EVENTS}, "at most this many (100)"),
                 Param("kind", {"enum": list(EVENT_KINDS)}, "only events of this kind"),
                 Param("target", {"type": "string"}, "only events of this target")]
