"""The OpenAPI documents of the engine, the router and the controller, built one way.

The routes read their bodies with the strict reader of :mod:`inferctl.contract.http` and
validate them with pydantic models themselves (strings never coerced, errors naming the field,
400 rather than FastAPI's 422), so FastAPI sees no body parameter and would document none.
:func:`route_doc` declares a route's request body from **the same model the route validates
with** (``model.model_json_schema()``, its nested models as components), every response with
its model and its real content type (``text/event-stream`` for streams, the Prometheus text
format for ``/metrics``), every error status with the server's error envelope, query
parameters and the bearer security of the admin routes. :func:`install_openapi` makes the
app's ``/openapi.json`` use them: each documented operation's ``responses`` is exactly what
:func:`route_doc` said (FastAPI's default 422 is never documented: the APIs answer 400),
the models become ``components/schemas`` and the bearer scheme ``components/securitySchemes``.

Usage (one call per route declaration)::

    @router.post("/v1/completions", **route_doc(request=CompletionRequest, response=CompletionResponse,
                                                 errors=(400, 404, 413, 503), stream=True))

Envelopes: :class:`OpenAIErrorEnvelope` is :meth:`inferctl.contract.errors.APIError.body`
(the engine and the router); :class:`ControllerErrorEnvelope` is the controller's
``{"error": {"code", "message", "field"}}``. Specification: OpenAPI 3.1
(https://spec.openapis.org/oas/v3.1.0); ``Allow`` on 405: RFC 9110 section 15.5.6.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict

#: The vendor key :func:`route_doc` puts in ``openapi_extra``; :func:`install_openapi` consumes it.
DOC_KEY = "x-inferctl-doc"
#: The security scheme's name in ``components/securitySchemes``.
BEARER_SCHEME = "bearerAuth"
#: The Prometheus text exposition media type (prometheus-client's ``CONTENT_TYPE_LATEST``).
PROMETHEUS_TEXT = CONTENT_TYPE_LATEST
REF = "#/components/schemas/{model}"

#: What each error status means, in every document (a route lists the ones it can give).
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Bad request: the body or a parameter is invalid; the error names the field (`param` / `field`). "
         "These APIs answer 400, never FastAPI's 422.",
    401: "Missing or wrong bearer token (`WWW-Authenticate: Bearer`).",
    403: "The admin API is disabled: the server has no admin token configured.",
    404: "Unknown model, engine, GPU or route (the error names it).",
    409: "Refused by a rail or by the current state (the answer says which).",
    413: "The request body is larger than the server's limit.",
    415: "The body is not sent as `Content-Type: application/json`.",
    429: "Rate limited (the router's per-key limits); retry after `Retry-After` seconds.",
    421: "The `Host` header is not one this server answers to (DNS-rebinding guard).",
    502: "The engine or device call behind the action failed.",
    503: "Not serving now (draining, starting, out of memory, no ready replica); retry after `Retry-After` seconds.",
}
#: Statuses every route with a JSON body can give (bad body, too large, not labelled JSON).
BODY_ERRORS = frozenset({400, 413, 415})
#: Statuses every operation can give on a server started by the CLI (it binds an address).
COMMON_ERRORS = (421,)
#: Headers of some error answers (documented, not required: a pass-through may lack them).
ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "`Bearer` (RFC 6750 section 3).", "schema": {"type": "string"}}},
    429: {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "string"}}},
    503: {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "string"}}},
}

#: One Server-Sent Event of a stream (OpenAPI 3.1 reads a ``text/event-stream`` schema per event;
#: OpenAPI 3.2's ``itemSchema``): ``data`` is a chunk's JSON, the last one ``[DONE]``.
SSE_EVENT_SCHEMA = {"type": "object", "required": ["data"],
                    "description": "`data: <chunk JSON>` events (the route's chunk object), then `data: [DONE]`.",
                    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}}

NO_422_NOTE = ("Invalid requests are answered **400** with the error envelope naming the field, never FastAPI's "
               "default 422: the bodies are read as strict JSON and validated by the same pydantic models this "
               "document shows. Any path answers **405** with an `Allow` header (RFC 9110 section 15.5.6) for a "
               "method it does not serve.")


# ---------------------------------------------------------------------------------------------
# JSON schemas of request fields the models validate by hand (``Any`` fields, "must be empty"
# fields): given to pydantic as ``Field(json_schema_extra=...)`` so ``model_json_schema()`` shows
# what the validator accepts (the defaults of :class:`~inferctl.contract.openai.ProtocolLimits`).

_TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
#: ``prompt``: a text, a batch of texts, token ids, or a batch of token-id lists (never empty).
PROMPT_SCHEMA = {"anyOf": [{"type": "string", "minLength": 1},
                           {"type": "array", "minItems": 1, "maxItems": 16,
                            "items": {"type": "string", "minLength": 1}},
                           _TOKEN_IDS,
                           {"type": "array", "minItems": 1, "maxItems": 16, "items": _TOKEN_IDS}]}
#: ``stop``: a string or at most 16 strings of 1..256 characters.
STOP_SCHEMA = {"anyOf": [{"type": "string", "minLength": 1, "maxLength": 256},
                         {"type": "array", "maxItems": 16,
                          "items": {"type": "string", "minLength": 1, "maxLength": 256}},
                         {"type": "null"}]}
#: A chat message's ``content``: a string, text parts, or null.
CONTENT_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "null"},
                            {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                                                        "properties": {"type": {"const": "text"},
                                                                       "text": {"type": "string"}}}}]}
#: Accepted only when empty or null (``logit_bias``, ``suffix``, ``tools``, ``functions``).
EMPTY_OBJECT = {"maxProperties": 0}
EMPTY_STRING = {"maxLength": 0}
EMPTY_LIST = {"maxItems": 0}
#: ``n``: 1..16 choices per prompt (``ProtocolLimits.max_n``).
N_CHOICES = {"minimum": 1, "maximum": 16}
#: Fields that accept one value (``best_of``: 1; ``tool_choice``: "none").
ONLY_ONE = {"enum": [1, None]}
NONE_CHOICE = {"enum": ["none", None]}
#: Accepted only as null (chat ``prompt_logprobs``).
ONLY_NULL = {"type": "null"}
#: A non-empty list (chat ``messages``).
NON_EMPTY = {"minItems": 1}
#: ``response_format``: ``{"type": "text"}`` (or null).
TEXT_FORMAT = {"anyOf": [{"type": "object", "properties": {"type": {"const": "text"}}}, {"type": "null"}]}


class OpenAIError(BaseModel):
    """The inner object of the OpenAI error envelope (:meth:`~inferctl.contract.errors.APIError.body`)."""

    model_config = ConfigDict(extra="forbid")
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorEnvelope(BaseModel):
    """``{"error": {"message", "type", "param", "code"}}`` — every error of the engine and the router."""

    model_config = ConfigDict(extra="forbid")
    error: OpenAIError


class ControllerError(BaseModel):
    """The inner object of the controller's error envelope: ``code``, ``message``, ``field``."""

    model_config = ConfigDict(extra="forbid")
    code: str
    message: str
    field: str | None


class ControllerErrorEnvelope(BaseModel):
    """``{"error": {"code", "message", "field"}}`` — every error of the controller's API."""

    model_config = ConfigDict(extra="forbid")
    error: ControllerError


@dataclass(frozen=True)
class Param:
    """A query parameter the route reads itself: ``name``, its JSON ``schema``, a description."""

    name: str
    schema: Mapping[str, Any]
    description: str = ""
    required: bool = False

    def doc(self) -> dict[str, Any]:
        """The OpenAPI parameter object."""
        return {"name": self.name, "in": "query", "required": self.required, "description": self.description,
                "schema": dict(self.schema)}


def model_schemas(model: type[BaseModel], mode: str = "validation") -> tuple[dict, dict[str, dict]]:
    """``(a $ref to model, {name: schema})`` for ``model`` and every model nested in it
    (pydantic's ``model_json_schema`` with refs into ``#/components/schemas``)."""
    schema = model.model_json_schema(ref_template=REF, mode=mode)
    defs = dict(schema.pop("$defs", {}))
    defs[model.__name__] = schema
    return {"$ref": REF.format(model=model.__name__)}, defs


def route_doc(*, request: type[BaseModel] | None = None, response: type[BaseModel] | None = None,
              response_schema: Mapping[str, Any] | None = None, errors: Iterable[int] = (),
              envelope: type[BaseModel] = OpenAIErrorEnvelope, stream: bool = False, metrics: bool = False,
              bearer: bool = False, params: Iterable[Param] = (), ok_status: int = 200,
              ok_description: str = "Success.", extra: Mapping[int, Mapping[str, Any]] | None = None
              ) -> dict[str, Any]:
    """Keyword arguments for a FastAPI route declaration (``openapi_extra``) documenting it.

    Args:
        request: the pydantic model the route validates its JSON body with (required body).
        response: the success model (``application/json``); ``response_schema`` instead for
            a free-form JSON document (e.g. ``{"type": "object"}``).
        errors: the error statuses the route gives (descriptions from :data:`ERROR_DESCRIPTIONS`),
            each with ``envelope`` as its schema; :data:`COMMON_ERRORS` are always added, and
            :data:`BODY_ERRORS` with a ``request``.
        stream: the success answer may also be ``text/event-stream`` (``stream: true``).
        metrics: the success answer is the Prometheus text format (no JSON).
        bearer: the route needs ``Authorization: Bearer <token>`` (adds 401).
        params: query parameters the route reads.
        extra: more responses by status (merged over the generated ones).

    Returns: ``{"openapi_extra": {...}}`` for ``@app.get/post(path, **route_doc(...))``.
    """
    components: dict[str, dict] = {}
    content: dict[str, Any] = {}
    if metrics:
        content[PROMETHEUS_TEXT] = {"schema": {"type": "string"}}
    else:
        if response is not None:
            ref, defs = model_schemas(response, mode="serialization")
            components.update(defs)
            content["application/json"] = {"schema": ref}
        else:
            content["application/json"] = {"schema": dict(response_schema or {"type": "object"})}
        if stream:
            content["text/event-stream"] = {"schema": SSE_EVENT_SCHEMA}
    responses: dict[str, Any] = {str(ok_status): {"description": ok_description, "content": content}}
    err_ref, defs = model_schemas(envelope, mode="serialization")
    statuses = set(errors) | set(COMMON_ERRORS) | ({401} if bearer else set()) | (BODY_ERRORS if request else set())
    if statuses:
        components.update(defs)
    for status in sorted(statuses):
        resp: dict[str, Any] = {"description": ERROR_DESCRIPTIONS[status],
                                "content": {"application/json": {"schema": err_ref}}}
        if status in ERROR_HEADERS:
            resp["headers"] = dict(ERROR_HEADERS[status])
        responses[str(status)] = resp
    for status, resp in (extra or {}).items():
        merged = dict(responses.get(str(status), {}))
        merged.update(resp)
        responses[str(status)] = merged
    doc: dict[str, Any] = {"responses": responses, "components": components}
    if request is not None:
        ref, defs = model_schemas(request)
        components.update(defs)
        doc["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    if bearer:
        doc["security"] = [{BEARER_SCHEME: []}]
    plist = [p.doc() for p in params]
    if plist:
        doc["parameters"] = plist
    return {"openapi_extra": {DOC_KEY: doc}}


def _finish_operation(op: dict[str, Any], schemas: dict[str, Any]) -> bool:
    """Apply one operation's :data:`DOC_KEY` (responses replaced, body, security, parameters);
    returns whether it needs the bearer scheme. Without the key, FastAPI's 422 is removed."""
    doc = op.pop(DOC_KEY, None)
    if doc is None:
        op.get("responses", {}).pop("422", None)
        return False
    op["responses"] = doc["responses"]
    for name, schema in doc["components"].items():
        schemas.setdefault(name, schema)
    if "requestBody" in doc:
        op["requestBody"] = doc["requestBody"]
    if "parameters" in doc:
        known = {p["name"] for p in op.get("parameters", [])}
        op["parameters"] = op.get("parameters", []) + [p for p in doc["parameters"] if p["name"] not in known]
    if "security" in doc:
        op["security"] = doc["security"]
        return True
    return False


def build_openapi(app: Any, *, description: str = "") -> dict[str, Any]:
    """The app's OpenAPI document with every :func:`route_doc` applied (see the module docstring).

    ``app`` is a FastAPI app; raises nothing for an app without documented routes (FastAPI's
    document minus its 422s)."""
    from fastapi.openapi.utils import get_openapi

    spec = get_openapi(title=app.title, version=app.version, openapi_version=app.openapi_version,
                       description="\n\n".join(x for x in (description, NO_422_NOTE) if x), routes=app.routes)
    components = spec.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    needs_bearer = False
    for path_item in spec.get("paths", {}).values():
        for op in path_item.values():
            if isinstance(op, dict):
                needs_bearer |= _finish_operation(op, schemas)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    if needs_bearer:
        components.setdefault("securitySchemes", {})[BEARER_SCHEME] = {
            "type": "http", "scheme": "bearer", "description": "The admin token (`Authorization: Bearer <token>`)."}
    if not schemas:
        components.pop("schemas")
    if not components:
        spec.pop("components")
    return spec


#: The security scheme of an engine started with ``--api-key`` (its ``/v1/*`` routes).
API_KEY_SCHEME = "apiKeyAuth"


def require_api_key(spec: dict[str, Any], prefix: str = "/v1") -> dict[str, Any]:
    """Document an API key on every operation of ``spec`` whose path is ``prefix`` or below:
    a 401 answer (the operation's own error envelope, ``WWW-Authenticate: Bearer``) and the
    ``apiKeyAuth`` bearer scheme. For a server started with ``--api-key`` only, so the document
    says exactly what that server does. Returns ``spec`` (changed in place)."""
    touched = False
    for path, item in spec.get("paths", {}).items():
        if path != prefix and not path.startswith(prefix + "/"):
            continue
        for op in item.values():
            if not isinstance(op, dict):
                continue
            errors = [r for code, r in sorted(op.get("responses", {}).items())
                      if code.startswith("4") and "content" in r]
            resp: dict[str, Any] = {"description": "Missing or wrong API key (the server runs with `--api-key`).",
                                    "headers": dict(ERROR_HEADERS[401])}
            if errors:
                resp["content"] = errors[0]["content"]
            op.setdefault("responses", {})["401"] = resp
            op["security"] = [{API_KEY_SCHEME: []}]
            touched = True
    if touched:
        spec.setdefault("components", {}).setdefault("securitySchemes", {})[API_KEY_SCHEME] = {
            "type": "http", "scheme": "bearer", "description": "The API key (`Authorization: Bearer <key>`)."}
    return spec


def install_openapi(app: Any, *, description: str = "", api_key_prefix: str | None = None
                    ) -> Callable[[], dict[str, Any]]:
    """Make ``app.openapi()`` (served at ``app.openapi_url``) return :func:`build_openapi`'s
    document, built once and cached on the app (FastAPI's own convention). With
    ``api_key_prefix`` the routes below it are documented as needing the API key
    (:func:`require_api_key`)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = build_openapi(app, description=description)
            app.openapi_schema = require_api_key(spec, api_key_prefix) if api_key_prefix else spec
        return app.openapi_schema

    app.openapi = openapi
    return openapi


#: The methods :func:`allow_header` probes (RFC 9110 section 9 plus PATCH, RFC 5789).
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allow_header(app: Any, path: str) -> str:
    """The ``Allow`` value for ``path`` (RFC 9110 section 15.5.6): every method of
    :data:`HTTP_METHODS` some route of ``app`` (a Starlette/FastAPI app) fully matches at
    ``path``, in that order, comma-separated; "" when no route serves the path. Probing the
    routing itself (not one route's methods) lists methods served by separate routes of one path."""
    from starlette.routing import Match

    allowed = []
    for method in HTTP_METHODS:
        scope = {"type": "http", "path": path, "method": method, "root_path": ""}
        if any(route.matches(scope)[0] == Match.FULL for route in app.routes):
            allowed.append(method)
    return ", ".join(allowed)
