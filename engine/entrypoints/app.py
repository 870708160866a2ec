"""The engine's HTTP server: :func:`create_app` wires the route families into one FastAPI app.

Routes, one module per family (vLLM's ``entrypoints`` layout):

* :mod:`.completions` ``POST /v1/completions``, :mod:`.chat` ``POST /v1/chat/completions`` —
  OpenAI shapes (:mod:`inferctl.contract.openai`), streamed as SSE (:mod:`.sse`).
* :mod:`.tokenization` ``POST /tokenize``, ``POST /detokenize`` — vLLM's tokenizer API.
* :mod:`.health` ``GET /health`` (liveness), ``/ready`` (readiness), ``/stats``, ``/metrics``,
  ``/v1/models``.
* :mod:`.lifecycle` — in-flight request count and the SIGTERM drain (the CLI's server).
* :mod:`.admin` ``POST /admin/precision|fault|drain|route``, ``GET /admin/route`` — bearer token.
* :mod:`.errors` — every failure as the OpenAI error object (FastAPI's 422 shape is never
  used); an out-of-memory request is never a 500 and ``/health`` stays 200.

Policies (docs/field-cases.md): ``max_tokens`` above ``max_model_len - prompt tokens`` is a
400 naming the field and bound (no clamping); drain → 503 ``engine_draining`` with
``Retry-After`` while in-flight requests finish; a request that fails with out-of-memory
after the engine's retries → 503 with ``Retry-After``, an allocation larger than the device
→ 400; request bodies above ``max_body_bytes`` → 413, malformed JSON → 400; a client that
disconnects (streaming or not) cancels the engine iterator, which aborts the request and
frees its KV blocks within a step.

Two models (``--light-model``): each served model is its own AsyncLLMEngine with its own
memory budget and registry; ``/admin/route`` sends one model's requests to another.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI

from inferctl.contract.hosts import HostGuard
from inferctl.contract.http import check_api_key
from inferctl.contract.openai import ProtocolLimits
from inferctl.contract.openapi import install_openapi
from inferctl.engine import __version__
from inferctl.engine.chat_template import ChatTemplate, check_chat_template
from inferctl.engine.entrypoints import admin, chat, completions, health, tokenization
from inferctl.engine.entrypoints.auth import ApiKeyMiddleware
from inferctl.engine.entrypoints.errors import install_error_handlers
from inferctl.engine.entrypoints.lifecycle import InFlightMiddleware
from inferctl.engine.entrypoints.request_log import RequestLogMiddleware
from inferctl.engine.entrypoints.state import (DEFAULT_MAX_BODY_BYTES, DEFAULT_RETRY_AFTER_SECONDS,
                                               AsyncEngineHandle, ServedModel, ServerState)

log = logging.getLogger(__name__)


def create_app(engines: dict[str, AsyncEngineHandle], *, admin_token: str | None, default_model: str,
               limits: ProtocolLimits | None = None, chat_template: ChatTemplate = "plain",
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               retry_after_seconds: int = DEFAULT_RETRY_AFTER_SECONDS,
               manage_engines: bool = False, bind_host: str | None = None,
               allowed_hosts: tuple[str, ...] = (), api_key: str | None = None) -> FastAPI:
    """Build the FastAPI app serving ``engines`` (served name → AsyncLLMEngine).

    Args:
        engines: at least one; names are the ``model`` values clients send and the ``model``
            label values (keep them equal to each engine's ``served_model_name``).
        admin_token: bearer token for ``/admin/*``; None disables admin (403).
        default_model: the name used when a request has no ``model``; must be in ``engines``.
        limits: request-shape limits (:class:`~inferctl.contract.openai.ProtocolLimits`).
        chat_template: ``"plain"``, ``"roles"`` or a compiled Jinja template
            (:func:`inferctl.engine.chat_template.resolve_chat_template`).
        max_body_bytes: request bodies above this (bytes) are a 413.
        retry_after_seconds: ``Retry-After`` (seconds) on 503 answers.
        manage_engines: start the engines on app startup and shut them down on exit (the CLI);
            tests that drive the app in-process manage the engines themselves.
        bind_host: the address the server listens on; given, every request's ``Host`` must
            pass :func:`inferctl.contract.hosts.host_allowed` (421 otherwise: DNS rebinding);
            None (in-process tests) checks no ``Host``.
        allowed_hosts: extra accepted ``Host`` names (``--allowed-host``).
        api_key: given, ``/v1/*`` needs ``Authorization: Bearer <api_key>`` (401 otherwise;
            :mod:`.auth`); None leaves the API open.

    Raises:
        ValueError: no engines, an unknown ``default_model`` or chat template, a bad limit, or an
            ``api_key`` no client could send (:func:`inferctl.contract.http.check_api_key`).
    """
    if not engines:
        raise ValueError("engines: at least one served model is needed")
    if default_model not in engines:
        raise ValueError(f"default_model: {default_model!r} is not among the served models {sorted(engines)}")
    check_chat_template(chat_template)  # raises ValueError for an unknown or broken template
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes: must be >= 1, got {max_body_bytes}")
    state = ServerState(
        models={name: ServedModel.from_async_engine(name, eng) for name, eng in engines.items()},
        default_model=default_model, admin_token=admin_token or None,
        limits=limits or ProtocolLimits(), chat_template=chat_template,
        max_body_bytes=int(max_body_bytes), retry_after_seconds=int(retry_after_seconds))
    app = FastAPI(title="inferctl engine", version=__version__,
                  lifespan=_engine_lifespan(state) if manage_engines else None, docs_url=None, redoc_url=None)
    app.state.server = state
    install_error_handlers(app)
    for family in (completions, chat, tokenization, health, admin):
        app.include_router(family.router)
    install_openapi(app, description="The bundled inference engine: OpenAI API, tokenizer, health, metrics, admin.",
                    api_key_prefix="/v1" if api_key else None)
    app.add_middleware(InFlightMiddleware, state=state)  # state.in_flight, read by the SIGTERM drain
    if api_key is not None:   # checked here: Starlette builds a middleware at the first request
        app.add_middleware(ApiKeyMiddleware, api_key=check_api_key(api_key, "api_key"))
    app.add_middleware(RequestLogMiddleware)   # X-Request-Id and one log line per /v1 request (401s too)
    if bind_host is not None:   # outermost: a refused Host never reaches the app
        app.add_middleware(HostGuard, bind_host=bind_host, allowed_hosts=tuple(allowed_hosts))
    return app


def _engine_lifespan(state: ServerState) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """A lifespan that starts every served engine and shuts them down on exit."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        for served in state.models.values():
            served.async_engine.start()
        log.info("engines started: %s", ", ".join(state.models))
        try:
            yield
        finally:
            for served in state.models.values():
                served.async_engine.shutdown()
            log.info("engines stopped: %s", ", ".join(state.models))

    return lifespan
