"""The router's FastAPI app: ``create_app(config)``.

Routes:

* ``POST /v1/completions``, ``POST /v1/chat/completions`` — the body is read with the strict
  JSON reader of :mod:`inferctl.contract.http` (``read_body`` and ``parse_json`` with the engine's
  arguments; the unpaired-surrogate check runs when the body holds a ``\\u`` escape, the only way
  strict UTF-8 JSON can spell one) and validated with the engine's own request
  models (:mod:`inferctl.contract.openai`), so bad input gets the engine's 4xx (same status,
  message, ``param`` and ``code``) without reaching a replica; then :class:`~inferctl.router.
  proxy.Forwarder` routes the client's bytes unchanged.
* ``POST /tokenize``, ``POST /detokenize`` — vLLM's tokenizer API, validated with the engine's
  models (:mod:`inferctl.contract.tokenize`, with ``TokenizeRequest.check_one_input``) and
  forwarded like a completion to a routable replica serving ``model`` (least loaded; what
  needs the vocabulary — token ids, an unknown model — is the replica's 4xx, passed through).
* ``GET /v1/models`` — the union of the routable replicas' model cards (by ``id``, first seen).
* ``GET /health`` — liveness: 200 ``{"status": "ok"}`` while the process serves.
* ``GET /ready`` — 200 ``{"ready": true, "replicas_ready": n}``; 503 ``{"ready": false,
  "reason": "no_ready_replica"}`` when no replica is routable.
* ``GET /replicas`` — each replica's state (ready, reason, blocked, outstanding, load, models).
* ``GET /metrics`` — Prometheus text of :data:`inferctl.router.metrics.ROUTER_METRICS`.

Every answer carries ``X-Request-Id`` (the client's, or a new one). The probe loop
(:class:`~inferctl.router.probe.Prober`) runs in the app's lifespan.

The two ``POST`` routes are the hot path: :class:`RouterApp` hands them to their handler as
plain ASGI, before FastAPI's middleware stack, router and endpoint machinery (which stay for
every other route, for refused ``Host`` headers and for the OpenAPI document), with the ASGI
pieces of :mod:`inferctl.router.asgi` (one header dict, the body over ``receive``, the replica's
raw response headers passed on). Measured with
``python -m bench.router``: the router's CPU per request (docs/router.md, "Cost per request").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from functools import lru_cache, partial
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from inferctl.contract.errors import REJECTION_CODES, APIError
from inferctl.contract.hosts import HostGuard, host_allowed
from inferctl.contract.http import RequestRejected, parse_json, read_body
from inferctl.contract.openai import (ChatCompletionRequest, ChatCompletionResponse, CompletionRequest,
                                     CompletionResponse, ModelList, ProtocolLimits, validate_model)
from inferctl.contract.openapi import allow_header, install_openapi, route_doc
from inferctl.contract.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from inferctl.router.auth import ClientKey, protected
from inferctl.router.config import RouterConfig
from inferctl.router.keys import affinity_prefix, request_id
from inferctl.router.metrics import build_router_registry
from inferctl.router.probe import Prober
from inferctl.router.ratelimit import Admission, RateLimiter, bearer_key
from inferctl.router.asgi import AsgiBody, ClientWatch, scope_headers
from inferctl.router.proxy import Forwarder
from inferctl.router.replicas import ReplicaSet
from inferctl.router.upstream import AiohttpUpstream, HttpxUpstream, Upstream



@dataclass
class RouterState:
    """Everything one router app holds: config, replicas, the probe client and the upstream
    client, prober, forwarder, registry, metrics."""

    config: RouterConfig
    replicas: ReplicaSet
    client: httpx.AsyncClient
    upstream: Upstream
    prober: Prober
    forwarder: Forwarder
    registry: CollectorRegistry
    metrics: dict
    limits: ProtocolLimits
    limiter: RateLimiter


def error_response(err: APIError, rid: str | None = None) -> JSONResponse:
    """The OpenAI error object with ``err.status``, ``err.headers`` and ``X-Request-Id``."""
    headers = dict(err.headers)
    if rid:
        headers["x-request-id"] = rid
    return JSONResponse(err.body(), status_code=err.status, headers=headers or None)


def default_client(config: RouterConfig) -> httpx.AsyncClient:
    """The probe client (``/ready``, ``/stats``, ``/v1/models``, the controller's ``/status``: a
    few small requests per probe interval): connect deadline ``connect_timeout_seconds``, each
    probe its own ``probe_timeout_seconds``, a small pool (one connection per replica and kind)."""
    timeout = httpx.Timeout(config.upstream_timeout_seconds, connect=config.connect_timeout_seconds)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


def default_upstream(config: RouterConfig) -> AiohttpUpstream:
    """The forwarding client: aiohttp, ``upstream_connections`` connections at most, connect
    deadline ``connect_timeout_seconds``, ``upstream_timeout_seconds`` between two bytes
    (:mod:`inferctl.router.upstream` says why aiohttp)."""
    return AiohttpUpstream(connections=config.upstream_connections, connect_timeout=config.connect_timeout_seconds,
                           read_timeout=config.upstream_timeout_seconds)


class RouterApp(FastAPI):
    """FastAPI with a hot path: an HTTP ``POST`` to a path of ``fast_routes`` (path → ASGI
    handler) whose ``Host`` passes ``host_ok`` (None: no check) goes to its handler directly;
    everything else (other routes, lifespan, a refused ``Host``, which the slow path's
    :class:`~inferctl.contract.hosts.HostGuard` answers with 421) takes FastAPI's stack. An
    exception the handler raises reaches the server as before (uvicorn logs it and answers 500
    when nothing was sent yet). ``client_key`` (a :class:`~inferctl.router.auth.ClientKey`,
    None: open): a request to ``/v1`` or below whose ``Host`` passes gets the engine's 401
    without the key, on both paths, before its body is read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_routes: dict[str, Any] = {}
        self.host_ok: Any = None
        self.client_key: ClientKey | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (self.host_ok is None or self.host_ok(scope)):
            if self.client_key is not None and protected(scope["path"]):
                err = self.client_key.refusal(scope.get("headers") or ())
                if err is not None:
                    rid = request_id(_header(scope, b"x-request-id"))
                    self.state.router.metrics["inferctl_router_rejected_total"].labels("invalid_api_key").inc()
                    await error_response(err, rid)(scope, receive, send)
                    return
            if scope["method"] == "POST":
                handler = self.fast_routes.get(scope["path"])
                if handler is not None:
                    await handler(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)


def create_app(config: RouterConfig, *, client: httpx.AsyncClient | None = None, upstream: Upstream | None = None,
               limits: ProtocolLimits | None = None, bind_host: str | None = None,
               allowed_hosts: tuple[str, ...] = (),
               after_round: Callable[[RouterState], Awaitable[None]] | None = None) -> RouterApp:
    """The router app over ``config`` (validated here: raises ConfigError).

    ``client``: the httpx.AsyncClient of the probes (default :func:`default_client`, closed at
    shutdown). ``upstream``: the client requests are forwarded with (default: over ``client``
    when one is given — the tests pass one over ASGI transports —, else :func:`default_upstream`,
    aiohttp, made at startup and closed at shutdown). ``limits``: the request-shape limits, as the
    engines' (default :class:`ProtocolLimits`). The probe loop starts with the app's lifespan;
    without a lifespan (ASGI tests) call ``await app.state.router.prober.round()``.
    ``bind_host`` (the address it listens on): given, every request's ``Host`` must pass the
    DNS-rebinding rule of :func:`inferctl.contract.hosts.host_allowed` (421 otherwise), as on
    the engine and the controller; ``allowed_hosts`` are the ``--allowed-host`` names.
    ``after_round``: awaited with the router's state after each probe round (the HAProxy data
    plane's sync, :mod:`inferctl.router.dataplane`).
    """
    config.validate()
    owns_client = client is None
    owns_upstream = upstream is None
    if upstream is None:
        upstream = default_upstream(config) if owns_client else HttpxUpstream(client)
    client = client or default_client(config)
    registry, metrics = build_router_registry()
    replicas = ReplicaSet.from_specs(config.engines)
    prober = Prober(replicas, client, timeout=config.probe_timeout_seconds, controller=config.controller,
                    metrics=metrics, api_key=config.upstream_api_key)
    state = RouterState(config, replicas, client, upstream, prober, Forwarder(config, replicas, upstream, metrics),
                        registry, metrics, limits or ProtocolLimits(),
                        RateLimiter(config.rate_keys, config.rate_default))
    prober.update_gauges()
    state.forwarder.update_affinity_gauge()
    if not config.controller:       # the catalog's word: absent without --controller (no data, not 0)
        registry.unregister(metrics["inferctl_router_controller_up"])

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        if isinstance(upstream, AiohttpUpstream):
            upstream.start()
        after = partial(after_round, state) if after_round is not None else None
        task = asyncio.create_task(prober.run(config.probe_interval_seconds, after))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if owns_upstream:
                await upstream.aclose()
            if owns_client:
                await client.aclose()

    app = RouterApp(title="inferctl router", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.router = state
    if config.api_key is not None:
        app.client_key = ClientKey(config.api_key)
    _install_errors(app)
    if bind_host is not None:   # outermost: a refused Host never reaches the router
        app.add_middleware(HostGuard, bind_host=bind_host, allowed_hosts=tuple(allowed_hosts))
        app.host_ok = partial(_host_ok, allowed=lru_cache(maxsize=256)(
            partial(_host_allowed, bind_host=bind_host, allowed_hosts=tuple(allowed_hosts))))

    async def serve(headers: Mapping[str, str], source: Any, cls: type, path: str, receive: Receive) -> Any:
        """One completion-like request: ``headers`` (lower-case name → value), ``source`` (a body
        source of :mod:`inferctl.contract.http`: ``headers`` and ``stream()``), ``receive`` (the
        request's ASGI receive, watched for the client's disconnect while the replica answers:
        :class:`~inferctl.router.asgi.ClientWatch`); a Starlette Response."""
        t0 = time.monotonic()
        rid = request_id(headers.get("x-request-id"))
        try:
            raw = await read_body(source, config.max_body_bytes, require_json_type=True)
            # a surrogate can only come from a \u escape (strict UTF-8 decoding refuses encoded ones),
            # so the check (a whole re-encode of the document) runs only when the body has one
            obj = parse_json(raw, allow_nan=True, require_object=False, check_unicode=b"\\u" in raw)
            req = validate_model(cls, obj, state.limits)
            if isinstance(req, TokenizeRequest):
                req.check_one_input()      # the engine's next check: exactly one of prompt / messages
        except RequestRejected as exc:
            err = APIError(exc.status, exc.message, param=exc.param, code=REJECTION_CODES.get(exc.reason, exc.reason),
                           headers=exc.headers or None)
            return _rejected(state, err, rid, path, t0)
        except APIError as err:
            return _rejected(state, err, rid, path, t0)
        admission = state.limiter.admit(bearer_key(headers.get("authorization")))
        if not admission.ok:
            return _rate_limited(state, admission, rid, path, t0)
        session = headers.get("x-session-id") or None
        prefix = affinity_prefix(req, config.affinity_chars, config.affinity_min_chars)
        charge = None
        if admission.name is not None:
            charge = lambda tokens, name=admission.name: state.limiter.charge(name, tokens)  # noqa: E731
        watch = ClientWatch(receive)
        try:
            return await state.forwarder.forward(headers, path, raw, model=req.model, session=session, prefix=prefix,
                                                 rid=rid, t0=t0, charge=charge, watch=watch)
        finally:
            watch.stop()

    def fast(cls: type, path: str):
        async def handler(scope: Scope, receive: Receive, send: Send) -> None:
            headers = scope_headers(scope)
            response = await serve(headers, AsgiBody(headers, receive), cls, path, receive)
            await response(scope, receive, send)
        return handler

    app.fast_routes = {"/v1/completions": fast(CompletionRequest, "/v1/completions"),
                       "/v1/chat/completions": fast(ChatCompletionRequest, "/v1/chat/completions"),
                       "/tokenize": fast(TokenizeRequest, "/tokenize"),
                       "/detokenize": fast(DetokenizeRequest, "/detokenize")}

    # The same two routes for FastAPI (the OpenAPI document; RouterApp serves them first).
    @app.post("/v1/completions", **route_doc(request=CompletionRequest, response=CompletionResponse,
                                             errors=(404, 429, 503), stream=True))
    async def completions(request: Request) -> Response:
        return await serve(request.headers, request, CompletionRequest, "/v1/completions", request.receive)

    @app.post("/v1/chat/completions", **route_doc(request=ChatCompletionRequest, response=ChatCompletionResponse,
                                                  errors=(404, 429, 503), stream=True))
    async def chat_completions(request: Request) -> Response:
        return await serve(request.headers, request, ChatCompletionRequest, "/v1/chat/completions", request.receive)

    # vLLM's tokenizer API, as the engine serves it (open like the engine's: not under /v1)
    @app.post("/tokenize", **route_doc(request=TokenizeRequest, response=TokenizeResponse,
                                       errors=(404, 413, 429, 503)))
    async def tokenize(request: Request) -> Response:
        return await serve(request.headers, request, TokenizeRequest, "/tokenize", request.receive)

    @app.post("/detokenize", **route_doc(request=DetokenizeRequest, response=DetokenizeResponse,
                                         errors=(404, 413, 429, 503)))
    async def detokenize(request: Request) -> Response:
        return await serve(request.headers, request, DetokenizeRequest, "/detokenize", request.receive)

    @app.get("/v1/models", **route_doc(response=ModelList))
    async def models(request: Request) -> Response:
        auth = state.forwarder.upstream_authorization or request.headers.get("authorization")
        docs = await asyncio.gather(*[_models_of(client, r.url, config.probe_timeout_seconds, auth)
                                      for r in replicas.routable()])
        cards: dict[str, Any] = {}
        for doc in docs:
            for card in doc:
                cards.setdefault(str(card.get("id")), card)
        return JSONResponse({"object": "list", "data": [cards[k] for k in sorted(cards)]})

    @app.get("/health", **route_doc(response_schema={"type": "object", "required": ["status"]}))
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/ready", **route_doc(response_schema=_READY, errors=(503,),
                                  extra={503: {"content": {"application/json": {"schema": _READY}}}}))
    async def ready() -> Response:
        n = len(replicas.routable())
        if n:
            return JSONResponse({"ready": True, "replicas_ready": n})
        return JSONResponse({"ready": False, "reason": "no_ready_replica", "replicas_ready": 0}, status_code=503)

    @app.get("/replicas", **route_doc(response_schema={"type": "object", "additionalProperties": {"type": "object"}}))
    async def replica_states() -> Response:
        return JSONResponse({r.name: {"url": r.url, "routable": r.routable, "ready": r.ready, "reason": r.reason,
                                      "blocked": r.blocked, "outstanding": r.outstanding, "waiting": r.waiting,
                                      "kv_usage_ratio": r.kv_usage_ratio,
                                      "models": None if r.models is None else sorted(r.models),
                                      "last_probe": r.last_probe} for r in replicas})

    @app.get("/metrics", **route_doc(metrics=True))
    async def metrics_route() -> Response:
        state.forwarder.update_affinity_gauge()
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    install_openapi(app, description="The inferctl router: the OpenAI API in front of engine replicas.",
                    api_key_prefix="/v1" if config.api_key else None)
    return app


#: The ``/ready`` document's schema (200 and 503).
_READY = {"type": "object", "required": ["ready", "replicas_ready"],
          "properties": {"ready": {"type": "boolean"}, "reason": {"type": "string"},
                         "replicas_ready": {"type": "integer", "minimum": 0}}}


def _host_allowed(raw: bytes | None, *, bind_host: str, allowed_hosts: tuple[str, ...]) -> bool:
    return host_allowed(raw.decode("latin-1") if raw is not None else None, bind_host, allowed_hosts)


def _header(scope: Scope, name: bytes) -> str | None:
    """The first ``name`` header of the ASGI ``scope`` (Latin-1), or None."""
    raw = next((v for k, v in scope.get("headers") or () if k == name), None)
    return None if raw is None else raw.decode("latin-1")


def _host_ok(scope: Scope, *, allowed: Any) -> bool:
    """The request's ``Host`` passes :func:`inferctl.contract.hosts.host_allowed` (HostGuard's rule;
    ``allowed``: that rule over the raw header value, cached per value)."""
    return allowed(next((v for k, v in scope.get("headers") or () if k == b"host"), None))


def _rate_limited(state: RouterState, adm: Admission, rid: str, path: str, t0: float) -> Response:
    """429, OpenAI-shaped (``rate_limit_exceeded``), with ``Retry-After`` in whole seconds."""
    state.metrics["inferctl_router_rate_limited_total"].labels(adm.name, adm.limit).inc()
    per = "requests" if adm.limit == "requests" else "tokens"
    err = APIError(429, f"rate limit of key {adm.name!r} reached ({per} per minute); retry after"
                        f" {adm.retry_after} s", code="rate_limit_exceeded", err_type="rate_limit_error",
                   headers={"Retry-After": str(adm.retry_after)})
    state.forwarder.access(rid, path, None, 429, t0, 0, None, rate_limit_key=adm.name, limit=adm.limit)
    return error_response(err, rid)


def _rejected(state: RouterState, err: APIError, rid: str, path: str, t0: float) -> Response:
    state.metrics["inferctl_router_rejected_total"].labels("invalid_request").inc()
    state.forwarder.access(rid, path, None, err.status, t0, 0, None)
    return error_response(err, rid)


async def _models_of(client: httpx.AsyncClient, url: str, timeout: float, authorization: str | None) -> list[dict]:
    """The model cards of one replica's ``GET /v1/models`` (``authorization``: the header to send,
    the replicas' key or the client's own, as on a forwarded request); [] when it fails."""
    headers = {"authorization": authorization} if authorization else None
    try:
        doc = (await client.get(url + "/v1/models", timeout=timeout, headers=headers)).json()
    except (httpx.HTTPError, ValueError):
        return []
    data = doc.get("data") if isinstance(doc, dict) else None
    return [c for c in data if isinstance(c, dict) and "id" in c] if isinstance(data, list) else []


def _install_errors(app: FastAPI) -> None:
    """Unknown routes (404), wrong methods (405) and other HTTP errors as the OpenAI error object."""

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err = APIError(404, f"no route {request.method} {request.url.path}", code="not_found")
        elif exc.status_code == 405:
            err = APIError(405, f"method {request.method} is not allowed on {request.url.path}",
                           code="method_not_allowed", headers={"Allow": allow_header(request.app, request.url.path)})
        else:
            err = APIError(exc.status_code, str(exc.detail))
        return error_response(err, request_id(request.headers.get("x-request-id")))
