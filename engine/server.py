"""The engine's HTTP server: an OpenAI-compatible API plus the admin and observability routes.

Routes (FastAPI):

* ``POST /v1/completions``, ``POST /v1/chat/completions`` — OpenAI shapes; ``stream: true``
  answers ``text/event-stream`` chunks (``data: {...}``) ending ``data: [DONE]``; with
  ``stream_options.include_usage`` a last chunk carries ``usage`` and no choices.
  Completions take vLLM's ``prompt_logprobs`` (computed by the engine during prefill, see
  :mod:`engine.runner`): ``choices[i].prompt_logprobs`` = ``[null, {"<id>": {"logprob",
  "rank", "decoded_token"}}, ...]``, one entry per prompt token; refused with ``stream``.
* ``GET /v1/models`` — the served models (never the route table); each card has
  ``max_model_len``.
* ``POST /tokenize``, ``POST /detokenize`` — vLLM's tokenizer API: ``{"model"?, "prompt":
  str | "messages": [...], "add_special_tokens": true, "return_token_strs": false}`` →
  ``{"tokens", "count", "max_model_len"}`` (the ids a completions/chat request with the same
  text would feed the engine: BOS first when ``add_special_tokens``); ``{"model"?, "tokens":
  [int]}`` → ``{"prompt": text}``. The model that would serve the name (routes followed)
  tokenizes; no engine work, so allowed while draining.
* ``GET /health`` — always 200 while the process serves: ``{"status": "ok"|"degraded"|
  "draining", "precision": <main model's mode>, "models": {...}, "routes": {...}}``.
  ``degraded`` while any served model runs int8, a route sends one model's traffic to
  another, or an engine's stepping thread is not running; ``draining`` wins over both.
* ``GET /stats[?model=NAME]`` — the engine's ``stats()`` (docs/architecture.md), made strictly
  valid JSON with :func:`engine.quality.json_safe`; ``engine.models`` lists the served set and
  ``routes`` the active routes (an additive key).
* ``GET /metrics`` — Prometheus text of the engine registries. Series with a ``model`` label
  are merged from every served engine; unlabelled process-level series (KV blocks, memory,
  queue gauges) are the main (default) model's — the light model's are in
  ``/stats?model=<light>``.
* ``POST /admin/precision|fault|drain|route`` (``GET /admin/route``) — ``Authorization:
  Bearer <token>``; 401 with a missing or wrong token; 403 when no token is configured.

Policies (field cases F06, F12-F17; see also :mod:`engine.protocol`):

* Unknown ``model`` → 404 ``model_not_found`` before any metric is touched, so label values
  only come from the served set (F06). A missing ``model`` means the default model.
  Request ids (``x-request-id``, echoed back) and ``user`` are never labels.
* ``max_tokens`` above ``max_model_len - prompt tokens`` → 400 naming the field and bound
  (no clamping, F14/F16); a prompt of ``max_model_len`` tokens or more → 400 naming
  ``prompt``. The default ``max_tokens`` is 16 for completions (OpenAI) and "the rest of the
  context" for chat (vLLM), both capped at the room left.
* Errors are checked before a stream starts (validation, routing, drain, the engine's
  admission), so a streaming request that fails gets the same 4xx/503 JSON as a
  non-streaming one. A failure after the first chunk is sent as an SSE ``error`` event,
  then ``[DONE]``.
* Drain → 503 ``engine_draining`` with ``Retry-After``; in-flight requests finish.
  A request failed by an out-of-memory fault after the engine's retries → 503 with
  ``Retry-After`` (retry later, e.g. after the int8 switch); an "impossible" allocation
  (larger than the device) → 400. Never a 500 for either; ``/health`` stays 200.
* Request bodies above ``max_body_bytes`` → 413; malformed JSON → 400; every 4xx is the
  OpenAI error object (FastAPI's 422 shape is never used).
* Client disconnect (streaming or not) cancels the engine iterator, which aborts the
  request and frees its KV blocks within a step.

Two models (``--light-model``): each served model is its own LLMEngine/AsyncLLMEngine with its
own memory budget and registry; ``/admin/route {"model": "main", "to": "light"}`` sends
requests for ``main`` to ``light`` (one hop; the response's ``model`` is the one that served).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import Metric

from inferctl.engine.protocol import (
    AdminDrainRequest,
    AdminFaultRequest,
    AdminPrecisionRequest,
    AdminRouteRequest,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    ProtocolLimits,
    TokenizeRequest,
    check_max_tokens,
    check_prompt_length,
    check_token_ids,
    check_valid_unicode,
    new_id,
    now_s,
    render_chat_prompt,
    validate_model,
    validation_error_to_api_error,
)
from inferctl.engine.quality import json_safe

log = logging.getLogger("inferctl.engine.server")

#: Default request-body limit: 4 MiB holds a 100k-token prompt as text or as token ids.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: Default Retry-After (seconds) on 503 (drain, retryable OOM).
DEFAULT_RETRY_AFTER_SECONDS = 5


# ---------------------------------------------------------------------------------------------
# Served models and server state


@dataclass
class ServedModel:
    """One served model: its name, async engine, and what the server reads from it."""

    name: str
    async_engine: Any
    engine: Any
    tokenizer: Any
    max_model_len: int
    vocab_size: int
    kv_capacity_tokens: int | None
    registry: CollectorRegistry | None
    metrics: dict

    @classmethod
    def from_async_engine(cls, name: str, async_engine: Any) -> "ServedModel":
        llm = getattr(async_engine, "engine", async_engine)
        bundle = llm.bundle
        tokenizer = bundle.tokenizer
        config = llm.config
        max_model_len = int(config.max_model_len)
        vocab = int(getattr(tokenizer, "vocab_size", 0) or bundle.args.vocab_size)
        blocks = getattr(llm, "num_kv_blocks", None)
        kv_tokens = int(blocks) * int(config.block_size) if blocks else None
        return cls(name=name, async_engine=async_engine, engine=llm, tokenizer=tokenizer,
                   max_model_len=max_model_len, vocab_size=min(vocab, int(bundle.args.vocab_size)),
                   kv_capacity_tokens=kv_tokens,
                   registry=getattr(llm, "registry", None), metrics=getattr(llm, "metrics", {}) or {})

    def precision(self) -> str | None:
        """The engine's current precision mode (``full``/``int8``), None if unknown."""
        for owner in (self.async_engine, self.engine):
            value = getattr(owner, "precision", None)
            if isinstance(value, str):
                return value
        return None

    def request_precision(self, mode: str) -> None:
        """Ask for a precision switch (applied by the stepping thread before its next step)."""
        self.async_engine.request_precision(mode)

    def inject_fault(self, kind: str, count: int) -> None:
        """Make the next ``count`` steps run out of memory (ValueError for a bad kind)."""
        self.async_engine.inject_fault(kind, count)

    def set_draining(self, draining: bool) -> None:
        """Stop or resume admitting requests; in-flight ones continue."""
        self.async_engine.set_draining(draining)

    async def stats(self) -> dict:
        """The engine's ``/stats`` document, taken between steps without blocking the loop."""
        get_stats = getattr(self.async_engine, "get_stats", None)
        if get_stats is not None:
            return await get_stats()
        return self.engine.stats()

    def count_error(self, reason: str) -> None:
        """``inferctl_engine_request_errors_total{model, reason}`` += 1 (served names only)."""
        metric = self.metrics.get("inferctl_engine_request_errors_total")
        if metric is not None:
            metric.labels(model=self.name, reason=reason).inc()


@dataclass
class ServerState:
    """Everything the routes share (held on ``app.state.server``; no module globals)."""

    models: dict[str, ServedModel]
    default_model: str
    admin_token: str | None
    limits: ProtocolLimits
    chat_template: str
    max_body_bytes: int
    retry_after_seconds: int
    routes: dict[str, str] = field(default_factory=dict)
    draining: dict[str, bool] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def lookup(self, name: str | None, param: str = "model") -> ServedModel:
        """The served model called ``name`` (None → default), without routing; 404 naming
        ``param`` (the request field that held the name) if unknown."""
        key = self.default_model if name is None else name
        served = self.models.get(key)
        if served is None:
            raise APIError(404, f"{param}: model {name!r} does not exist; served models: "
                                f"{', '.join(sorted(self.models))}", param=param, code="model_not_found")
        return served

    def resolve(self, name: str | None) -> tuple[ServedModel, ServedModel]:
        """``(requested, serving)``: the requested model and the one that serves it (one route hop)."""
        requested = self.lookup(name)
        target = self.routes.get(requested.name)
        serving = self.models.get(target, requested) if target else requested
        return requested, serving

    def check_admitting(self, served: ServedModel) -> None:
        """503 with Retry-After while ``served`` drains."""
        if self.draining.get(served.name):
            served.count_error("overloaded")
            raise APIError(503, f"model {served.name!r} is draining and admits no new requests; retry later",
                           code="engine_draining", err_type="service_unavailable_error",
                           headers={"Retry-After": str(self.retry_after_seconds)})


# ---------------------------------------------------------------------------------------------
# App factory


def create_app(engines: dict[str, Any], *, admin_token: str | None, default_model: str,
               limits: ProtocolLimits | None = None, chat_template: str = "plain",
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               retry_after_seconds: int = DEFAULT_RETRY_AFTER_SECONDS,
               manage_engines: bool = False) -> FastAPI:
    """Build the FastAPI app serving ``engines`` (served name → AsyncLLMEngine).

    Args:
        engines: at least one; names are the ``model`` values clients send and the ``model``
            label values (keep them equal to each engine's ``served_model_name``).
        admin_token: bearer token for ``/admin/*``; None disables admin (403).
        default_model: the name used when a request has no ``model``; must be in ``engines``.
        limits: request-shape limits (:class:`ProtocolLimits`).
        chat_template: ``"plain"`` or ``"roles"`` (:func:`engine.protocol.render_chat_prompt`).
        max_body_bytes: request bodies above this are a 413.
        retry_after_seconds: ``Retry-After`` on 503 answers.
        manage_engines: start the engines on app startup and shut them down on exit (the CLI);
            tests that drive the app in-process manage the engines themselves.

    Raises:
        ValueError: no engines, an unknown ``default_model`` or chat template, or a bad limit.
    """
    if not engines:
        raise ValueError("engines: at least one served model is needed")
    if default_model not in engines:
        raise ValueError(f"default_model: {default_model!r} is not among the served models {sorted(engines)}")
    render_chat_prompt([], chat_template)  # raises ValueError for an unknown template
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes: must be >= 1, got {max_body_bytes}")
    state = ServerState(
        models={name: ServedModel.from_async_engine(name, eng) for name, eng in engines.items()},
        default_model=default_model, admin_token=admin_token or None,
        limits=limits or ProtocolLimits(), chat_template=chat_template,
        max_body_bytes=int(max_body_bytes), retry_after_seconds=int(retry_after_seconds))

    lifespan = None
    if manage_engines:
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def lifespan(_app: FastAPI):
            for served in state.models.values():
                served.async_engine.start()
            log.info("engines started: %s", ", ".join(state.models))
            try:
                yield
            finally:
                for served in state.models.values():
                    served.async_engine.shutdown()
                log.info("engines stopped: %s", ", ".join(state.models))

    app = FastAPI(title="inferctl engine", version=_version(), lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.server = state
    _install_error_handlers(app)
    _install_routes(app)
    return app


def _version() -> str:
    from inferctl.engine import __version__

    return __version__


# ---------------------------------------------------------------------------------------------
# Errors


def error_response(err: APIError) -> JSONResponse:
    """The OpenAI error object with ``err.status`` and ``err.headers``."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers or None)


def _install_error_handlers(app: FastAPI) -> None:
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
                                       code="method_not_allowed"))

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error: %s", exc)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error"))


def _engine_error_to_api(exc: Exception, served: ServedModel, retry_after: int) -> APIError | None:
    """Map an engine-side exception to an APIError (None: not an engine request error).

    ``AdmissionError`` (counted by the engine itself) keeps its status, field and message;
    a 503 (draining) gets ``Retry-After``. ``SamplingParamsError`` is a 400 naming its field
    (counted here, the engine never saw the request).
    """
    name = type(exc).__name__
    if name == "AdmissionError":
        status = int(getattr(exc, "status", 400) or 400)
        param = getattr(exc, "field", None)
        message = str(getattr(exc, "message", None) or exc)
        if status == 503:
            return APIError(503, message, param=param, code="engine_draining",
                            err_type="service_unavailable_error", headers={"Retry-After": str(retry_after)})
        code = "context_length_exceeded" if param in ("max_tokens", "prompt") else "invalid_request"
        if param and not message.startswith(f"{param}"):
            message = f"{param}: {message}"
        return APIError(status, message, param=param, code=code)
    if name == "SamplingParamsError":
        served.count_error("invalid_request")
        return APIError(400, str(exc), param=getattr(exc, "field", None), code="invalid_value")
    if name == "EngineDeadError" or (isinstance(exc, RuntimeError) and "not started" in str(exc)):
        served.count_error("overloaded")
        return APIError(503, f"the engine is not running: {exc}", code="engine_unavailable",
                        err_type="service_unavailable_error", headers={"Retry-After": str(retry_after)})
    return None


async def _next_output(agen: AsyncIterator, served: ServedModel, retry_after: int) -> Any:
    """``agen.__anext__()`` with engine exceptions mapped to APIError (500 for the unknown)."""
    try:
        return await agen.__anext__()
    except (StopAsyncIteration, APIError, asyncio.CancelledError):
        raise
    except Exception as exc:  # noqa: BLE001 - engine failures become clean HTTP errors
        api = _engine_error_to_api(exc, served, retry_after)
        if api is None:
            log.error("engine stream failed: %s: %s", type(exc).__name__, exc)
            api = APIError(500, f"engine error: {type(exc).__name__}: {exc}", code="engine_error")
        raise api from None


# ---------------------------------------------------------------------------------------------
# Body


async def read_json_body(request: Request, max_bytes: int) -> Any:
    """Read and parse the JSON body; 413 above ``max_bytes``, 400 for malformed JSON/UTF-8, an
    integer literal above Python's digit limit, or a string with an unpaired surrogate
    (:func:`engine.protocol.check_valid_unicode`)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise APIError(400, f"invalid Content-Length header {declared!r}", code="invalid_header") from None
        if size > max_bytes:
            raise APIError(413, f"request body is {size} bytes; the limit is {max_bytes} bytes",
                           code="request_too_large")
    chunks = bytearray()
    async for chunk in request.stream():
        chunks += chunk
        if len(chunks) > max_bytes:
            raise APIError(413, f"request body is larger than the limit of {max_bytes} bytes",
                           code="request_too_large")
    if not chunks:
        raise APIError(400, "the request body is empty; a JSON object is required", code="invalid_json")
    try:
        obj = json.loads(bytes(chunks).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise APIError(400, f"the request body is not UTF-8: {exc}", code="invalid_json") from None
    except (ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, and also an integer literal above Python's digit limit
        # ("Exceeds the limit (4300 digits) for integer string conversion")
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    check_valid_unicode(obj)
    return obj


def _sse(obj: Any) -> bytes:
    return b"data: " + _dumps(obj).encode("utf-8") + b"\n\n"


def _dumps(obj: Any) -> str:
    """Strict JSON (NaN/inf → null via json_safe; ``allow_nan=False`` as a guard)."""
    return json.dumps(json_safe(obj), allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _json(obj: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(_dumps(obj), status_code=status, media_type="application/json", headers=headers)


# ---------------------------------------------------------------------------------------------
# Generation plumbing


@dataclass
class _PromptJob:
    """One prompt of a request: its token ids, echo text, and generation budget."""

    index: int
    request_id: str
    token_ids: list[int]
    echo_text: str
    max_tokens: int


@dataclass
class _Collected:
    """A finished generation, accumulated from the engine's RequestOutputs."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict | None] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_logprobs: list | None = None


def _output_logprobs(out: Any) -> tuple[list, list]:
    """(chosen-token logprobs, top-logprob dicts) of one RequestOutput, aligned with new tokens."""
    n = len(getattr(out, "new_token_ids", []) or [])
    lps = getattr(out, "logprobs", None)
    tops = getattr(out, "top_logprobs", None)
    lps = list(lps) if lps is not None else [None] * n
    tops = list(tops) if tops is not None else [None] * n
    return lps, tops


def _output_failure(out: Any, retry_after: int) -> APIError | None:
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
        return APIError(503, message, code="out_of_memory", err_type="service_unavailable_error",
                        headers={"Retry-After": str(retry_after)})
    return APIError(status, message, code="engine_error", err_type="server_error")


def _raise_on_failure(out: Any, retry_after: int) -> None:
    """Raise :func:`_output_failure`'s APIError when ``out`` is a failed RequestOutput."""
    failure = _output_failure(out, retry_after)
    if failure is not None:
        raise failure


async def _outputs(agen: AsyncIterator, first: Any, served: ServedModel, retry_after: int) -> AsyncIterator[Any]:
    """Yield one generation's RequestOutputs: ``first`` (None: nothing), then the engine's next
    ones until one is finished or the iterator ends; engine errors become APIError
    (:func:`_next_output`). Failed outputs are yielded, not raised (callers decide)."""
    out = first
    while out is not None:
        yield out
        if getattr(out, "finished", False):
            return
        try:
            out = await _next_output(agen, served, retry_after)
        except StopAsyncIteration:
            return


async def _start(served: ServedModel, job: _PromptJob, params: Any, retry_after: int) -> tuple[AsyncIterator, Any]:
    """Start one generation and wait for its first output (so admission errors surface
    before any response is sent). Returns ``(iterator, first output or None)``."""
    agen = served.async_engine.generate(job.request_id, job.token_ids, params)
    try:
        first = await _next_output(agen, served, retry_after)
        _raise_on_failure(first, retry_after)
    except StopAsyncIteration:
        return agen, None
    except BaseException:
        await _aclose(agen)
        raise
    return agen, first


async def _aclose(agen: Any) -> None:
    close = getattr(agen, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # noqa: BLE001 - closing an aborted stream must never raise
            log.debug("error while closing a generation", exc_info=True)


async def _start_all(served: ServedModel, jobs: list[_PromptJob], params: list[Any],
                     retry_after: int) -> list[tuple[AsyncIterator, Any]]:
    """Start every job; if one fails, abort the ones already started and re-raise."""
    started: list[tuple[AsyncIterator, Any]] = []
    try:
        for job, job_params in zip(jobs, params):
            started.append(await _start(served, job, job_params, retry_after))
    except BaseException:
        for agen, _ in started:
            await _aclose(agen)
        raise
    return started


async def _collect(served: ServedModel, agen: AsyncIterator, first: Any, retry_after: int) -> _Collected:
    """Drain one generation into a :class:`_Collected`; 503/400 on an engine failure."""
    acc = _Collected()
    try:
        async for out in _outputs(agen, first, served, retry_after):
            _raise_on_failure(out, retry_after)
            _accumulate(acc, out)
    finally:
        await _aclose(agen)
    return acc


def _accumulate(acc: _Collected, out: Any) -> None:
    acc.text += getattr(out, "new_text", "") or ""
    ids = list(getattr(out, "new_token_ids", []) or [])
    acc.token_ids += ids
    lps, tops = _output_logprobs(out)
    acc.logprobs += lps
    acc.top_logprobs += tops
    if getattr(out, "finished", False):
        acc.finish_reason = getattr(out, "finish_reason", None)
    acc.prompt_tokens, acc.completion_tokens = _token_counts(out, acc.prompt_tokens, len(acc.token_ids))
    prompt_lps = getattr(out, "prompt_logprobs", None)
    if prompt_lps is not None:
        acc.prompt_logprobs = prompt_lps


def _token_counts(out: Any, prompt_tokens: int, completion_tokens: int) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` as ``out`` reports them; a count it leaves out
    (missing or 0) keeps the caller's value."""
    return (int(getattr(out, "prompt_tokens", 0) or prompt_tokens),
            int(getattr(out, "completion_tokens", 0) or completion_tokens))


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """The OpenAI ``usage`` object (``total_tokens = prompt_tokens + completion_tokens``)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _usage_chunk(rid: str, obj: str, created: int, served: ServedModel, prompt_tokens: int,
                 completion_tokens: int) -> bytes:
    """The last SSE chunk of a stream with ``stream_options.include_usage``: no choices."""
    return _sse({"id": rid, "object": obj, "created": created, "model": served.name, "choices": [],
                 "usage": _usage(prompt_tokens, completion_tokens)})


async def _until_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body has already been read)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


async def _run_unless_disconnected(request: Request, coro: Any) -> Any:
    """Run ``coro``; cancel it (aborting its generations) if the client goes away first."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        try:
            await task
        except BaseException:  # noqa: BLE001 - the client is gone; nothing to answer
            pass
        return Response(status_code=499)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


# ---------------------------------------------------------------------------------------------
# Token text helpers (logprobs)


def _token_text(tokenizer: Any, token_id: int) -> str:
    try:
        return tokenizer.token_bytes(int(token_id)).decode("utf-8", errors="replace")
    except Exception:  # noqa: BLE001 - a piece we cannot render is shown by its id
        return f"<{token_id}>"


def _token_bytes(tokenizer: Any, token_id: int) -> list[int] | None:
    try:
        return list(tokenizer.token_bytes(int(token_id)))
    except Exception:  # noqa: BLE001
        return None


def _completion_logprobs(tokenizer: Any, token_ids: list[int], lps: list, tops: list, offset: int) -> dict:
    tokens = [_token_text(tokenizer, t) for t in token_ids]
    offsets = []
    pos = offset
    for text in tokens:
        offsets.append(pos)
        pos += len(text)
    top_out = []
    for top in tops:
        if top is None:
            top_out.append(None)
        else:
            top_out.append({_token_text(tokenizer, int(k)): v for k, v in dict(top).items()})
    return {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": top_out, "text_offset": offsets}


def _prompt_logprobs_json(tokenizer: Any, entries: list | None) -> list | None:
    """The engine's prompt logprobs (``[None, {id: Logprob(logprob, rank)}, ...]``) in vLLM's
    JSON shape: ``[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]`` (non-finite
    logprobs become null when the document is dumped)."""
    if entries is None:
        return None
    texts: dict[int, str] = {}
    out: list = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        doc = {}
        for tid, (logprob, rank) in entry.items():
            text = texts.get(tid)
            if text is None:
                text = texts[tid] = _token_text(tokenizer, tid)
            doc[str(tid)] = {"logprob": logprob, "rank": rank, "decoded_token": text}
        out.append(doc)
    return out


def _chat_logprobs(tokenizer: Any, token_ids: list[int], lps: list, tops: list) -> dict:
    content = []
    for i, tid in enumerate(token_ids):
        top = tops[i] if i < len(tops) else None
        content.append({
            "token": _token_text(tokenizer, tid),
            "logprob": lps[i] if i < len(lps) else None,
            "bytes": _token_bytes(tokenizer, tid),
            "top_logprobs": [{"token": _token_text(tokenizer, int(k)), "logprob": v,
                              "bytes": _token_bytes(tokenizer, int(k))} for k, v in dict(top or {}).items()],
        })
    return {"content": content}


# ---------------------------------------------------------------------------------------------
# Request preparation


def _sampling_params(req: Any, max_tokens: int, logprobs: int | None, limits: ProtocolLimits) -> Any:
    from inferctl.engine.sampling_params import SamplingLimits, SamplingParams

    # The protocol layer already enforced these bounds; SamplingParams re-checks against the same
    # numbers so an operator who raises a protocol limit is not refused one layer further down.
    sampling_limits = SamplingLimits(max_stop_strings=limits.max_stop_sequences,
                                     max_stop_string_chars=limits.max_stop_chars,
                                     max_logprobs=max(limits.max_logprobs, limits.max_top_logprobs))
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "stop": req.stop_list(), "logprobs": logprobs,
                              "limits": sampling_limits,
                              "ignore_eos": bool(req.ignore_eos), "repetition_stop": bool(req.repetition_stop)}
    for name in ("temperature", "top_k", "top_p", "seed", "repetition_penalty", "presence_penalty",
                 "frequency_penalty"):
        value = getattr(req, name)
        if value is not None:
            kwargs[name] = value
    if req.stop_token_ids:
        kwargs["stop_token_ids"] = list(req.stop_token_ids)
    prompt_logprobs = getattr(req, "prompt_logprobs", None)
    if prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = prompt_logprobs
    return SamplingParams(**kwargs)


def _encode(served: ServedModel, text: str, bos: bool = True) -> list[int]:
    """Prompt text → token ids, BOS first when ``bos`` (the body-size limit bounds the work)."""
    return list(served.tokenizer.encode(text, bos=bos))


async def _encode_async(served: ServedModel, text: str, bos: bool = True) -> list[int]:
    """:func:`_encode`, on a worker thread for long texts (so the event loop keeps serving)."""
    if len(text) > 4096:
        return await asyncio.to_thread(_encode, served, text, bos)
    return _encode(served, text, bos)


async def _prepare_jobs(served: ServedModel, prompts: list, req_id: str, requested_max: int | None,
                        default_max: int | None, max_param: str) -> list[_PromptJob]:
    """Tokenize prompts and check lengths: 400 for an out-of-vocabulary id, a too-long prompt,
    or ``max_tokens`` above the room left (``max_model_len - prompt tokens``); each such 400 is
    counted as an ``invalid_request`` error of ``served``."""
    try:
        jobs = []
        for i, prompt in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                ids = await _encode_async(served, prompt)
                echo = prompt
            else:
                bad = [t for t in prompt if t >= served.vocab_size]
                if bad:
                    raise APIError(400, f"{param}: token id {bad[0]} is out of range; the vocabulary has "
                                        f"{served.vocab_size} tokens (ids 0..{served.vocab_size - 1})",
                                   param="prompt", code="invalid_token_id")
                ids = list(prompt)
                echo = served.tokenizer.decode(ids)
            check_prompt_length(len(ids), served.max_model_len, param="prompt")
            room = served.max_model_len - len(ids)
            if requested_max is not None:
                check_max_tokens(requested_max, len(ids), served.max_model_len, param=max_param)
                max_tokens = requested_max
            else:
                # default: as many as fit in the context and the KV pool (the cache holds
                # prompt + max_tokens - 1 tokens), capped by default_max; the engine rejects a
                # prompt that alone does not fit the pool
                if served.kv_capacity_tokens is not None:
                    room = min(room, served.kv_capacity_tokens - len(ids) + 1)
                room = max(1, room)
                max_tokens = room if default_max is None else min(default_max, room)
            rid = req_id if len(prompts) == 1 else f"{req_id}-{i}"
            jobs.append(_PromptJob(index=i, request_id=rid, token_ids=ids, echo_text=echo, max_tokens=max_tokens))
        return jobs
    except APIError:
        served.count_error("invalid_request")
        raise


def _params_for(req: Any, jobs: list[_PromptJob], served: ServedModel, logprobs: int | None,
                limits: ProtocolLimits) -> list[Any]:
    from inferctl.engine.sampling_params import SamplingParamsError

    try:
        return [_sampling_params(req, job.max_tokens, logprobs, limits) for job in jobs]
    except SamplingParamsError as exc:
        raise _engine_error_to_api(exc, served, 0) from None


# ---------------------------------------------------------------------------------------------
# Routes


def _install_routes(app: FastAPI) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _guarded(request, _completions)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _guarded(request, _chat)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        return await _guarded(request, _tokenize)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        return await _guarded(request, _detokenize)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        state: ServerState = request.app.state.server
        created = int(state.started)
        cards = [ModelCard(id=name, created=created, max_model_len=m.max_model_len).model_dump()
                 for name, m in state.models.items()]
        return _json(ModelList(data=cards).model_dump())

    @app.get("/health")
    async def health(request: Request) -> Response:
        state: ServerState = request.app.state.server
        per_model = {}
        for name, served in state.models.items():
            running = getattr(served.async_engine, "is_running", True)
            per_model[name] = {"precision": served.precision(), "draining": bool(state.draining.get(name)),
                               "engine_running": bool(running)}
        main = per_model[state.default_model]
        if any(m["draining"] for m in per_model.values()):
            status = "draining"
        elif (any(m["precision"] == "int8" or not m["engine_running"] for m in per_model.values())
              or state.routes):
            status = "degraded"
        else:
            status = "ok"
        return _json({"status": status, "precision": main["precision"], "models": per_model,
                      "routes": dict(state.routes)})

    @app.get("/stats")
    async def stats(request: Request) -> Response:
        state: ServerState = request.app.state.server
        served = state.lookup(request.query_params.get("model"))
        doc = await served.stats()
        doc = dict(doc) if isinstance(doc, dict) else {"engine": {}}
        engine_part = dict(doc.get("engine") or {})
        engine_part["model"] = served.name
        engine_part["models"] = sorted(state.models)
        engine_part["draining"] = bool(state.draining.get(served.name, engine_part.get("draining", False)))
        doc["engine"] = engine_part
        doc["routes"] = dict(state.routes)
        return _json(doc)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        state: ServerState = request.app.state.server
        registry = CollectorRegistry(auto_describe=False)
        registry.register(MergedCollector(state))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/precision")
    async def admin_precision(request: Request) -> Response:
        state, body = await _admin_body(request, AdminPrecisionRequest)
        targets = _admin_targets(state, body.model)
        for served in targets:
            try:
                served.request_precision(body.mode)
            except ValueError as exc:
                raise APIError(400, f"mode: {exc}", param="mode", code="invalid_value") from None
        main = targets[0]
        return _json({"requested": body.mode, "current": main.precision(), "models": [t.name for t in targets]})

    @app.post("/admin/fault")
    async def admin_fault(request: Request) -> Response:
        state, body = await _admin_body(request, AdminFaultRequest)
        served = state.lookup(body.model)
        try:
            served.inject_fault(body.kind, body.count)
        except (ValueError, TypeError) as exc:
            raise APIError(400, f"kind: {exc}", param="kind", code="invalid_value") from None
        return _json({"injected": body.kind, "count": body.count, "model": served.name})

    @app.post("/admin/drain")
    async def admin_drain(request: Request) -> Response:
        state, body = await _admin_body(request, AdminDrainRequest)
        targets = _admin_targets(state, body.model)
        for served in targets:
            served.set_draining(body.draining)
            state.draining[served.name] = body.draining
        return _json({"draining": body.draining, "models": [t.name for t in targets]})

    @app.post("/admin/route")
    async def admin_route(request: Request) -> Response:
        state, body = await _admin_body(request, AdminRouteRequest)
        source = state.lookup(body.model)
        if body.to is None or body.to == source.name:
            state.routes.pop(source.name, None)
        else:
            target = state.lookup(body.to, param="to")
            state.routes[source.name] = target.name
        return _json({"routes": dict(state.routes)})

    @app.get("/admin/route")
    async def admin_routes(request: Request) -> Response:
        state = await _admin(request)
        return _json({"routes": dict(state.routes)})


def _admin_targets(state: ServerState, name: str | None) -> list[ServedModel]:
    """The named model, or every served model (the default first) when ``name`` is None."""
    if name is not None:
        return [state.lookup(name)]
    first = state.models[state.default_model]
    return [first] + [m for n, m in state.models.items() if n != state.default_model]


async def _admin(request: Request) -> ServerState:
    """Check ``Authorization: Bearer <token>``: 403 when no token is configured, 401 otherwise."""
    state: ServerState = request.app.state.server
    if state.admin_token is None:
        raise APIError(403, "the admin API is disabled because no admin token is configured; start the engine "
                            "with --admin-token TOKEN or set INFERCTL_ADMIN_TOKEN", code="admin_disabled")
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token or not hmac.compare_digest(token.strip().encode(),
                                                                          state.admin_token.encode()):
        raise APIError(401, "missing or invalid admin token: send 'Authorization: Bearer <token>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return state


async def _admin_body(request: Request, cls: type) -> tuple[ServerState, Any]:
    """Check the admin token (:func:`_admin`: 403/401), then read the body and validate it as
    ``cls`` (413/400 as :func:`read_json_body`, 400 naming the field)."""
    state = await _admin(request)
    return state, validate_model(cls, await read_json_body(request, state.max_body_bytes))


async def _guarded(request: Request, handler: Any) -> Response:
    """Run a /v1 handler: APIError → OpenAI error object; x-request-id echoed back."""
    state: ServerState = request.app.state.server
    try:
        response = await handler(request, state)
    except APIError as err:
        response = error_response(err)
    xrid = request.headers.get("x-request-id")
    if xrid and len(xrid) <= 200:
        response.headers["x-request-id"] = xrid
    return response


async def _parse(request: Request, state: ServerState, cls: type) -> tuple[Any, ServedModel, ServedModel]:
    """Body → validated request + (requested, serving) models. Errors counted per served model."""
    obj = await read_json_body(request, state.max_body_bytes)
    model_name = obj.get("model") if isinstance(obj, dict) else None
    known = state.models.get(model_name if isinstance(model_name, str) else state.default_model) \
        if (model_name is None or isinstance(model_name, str)) else None
    try:
        req = validate_model(cls, obj, state.limits)
    except APIError:
        if known is not None:
            known.count_error("invalid_request")
        raise
    requested, serving = state.resolve(req.model)
    state.check_admitting(serving)
    return req, requested, serving


async def _respond(request: Request, state: ServerState, served: ServedModel, req: Any, jobs: list[_PromptJob],
                   rid: str, logprobs: int | None, stream_fn: Any, body_fn: Any) -> Response:
    """Answer a generation request whose prompts are prepared (shared by completions and chat).

    Builds each prompt's SamplingParams (400 naming the field), then either starts every
    generation (so admission errors are still JSON answers) and streams ``stream_fn(served, req,
    jobs, started, rid, created, include_usage, retry_after)``, or runs ``body_fn(served, req,
    jobs, params, rid, created, retry_after)`` to one JSON response, cancelled (499) when the
    client disconnects first.
    """
    params = _params_for(req, jobs, served, logprobs, state.limits)
    created = now_s()
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        started = await _start_all(served, jobs, params, state.retry_after_seconds)
        return _stream(stream_fn(served, req, jobs, started, rid, created, include_usage,
                                 state.retry_after_seconds))
    return await _run_unless_disconnected(
        request, body_fn(served, req, jobs, params, rid, created, state.retry_after_seconds))


async def _tokenize(request: Request, state: ServerState) -> Response:
    """``POST /tokenize``: 400 naming the field for a bad body, 404 for an unknown model."""
    req = validate_model(TokenizeRequest, await read_json_body(request, state.max_body_bytes), state.limits)
    req.check_one_input()
    _requested, served = state.resolve(req.model)
    text = req.prompt if req.prompt is not None else render_chat_prompt(req.messages, state.chat_template)
    ids = await _encode_async(served, text, bos=bool(req.add_special_tokens))
    doc: dict[str, Any] = {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids}
    if req.return_token_strs:
        doc["token_strs"] = [_token_text(served.tokenizer, t) for t in ids]
    return _json(doc)


async def _detokenize(request: Request, state: ServerState) -> Response:
    """``POST /detokenize``: 400 naming ``tokens[i]`` for an id outside the vocabulary."""
    req = validate_model(DetokenizeRequest, await read_json_body(request, state.max_body_bytes), state.limits)
    _requested, served = state.resolve(req.model)
    check_token_ids(req.tokens, served.vocab_size)
    return _json({"prompt": served.tokenizer.decode(req.tokens)})


async def _completions(request: Request, state: ServerState) -> Response:
    req, _requested, served = await _parse(request, state, CompletionRequest)
    rid = new_id("cmpl")
    jobs = await _prepare_jobs(served, req.prompts(), rid, req.max_tokens, 16, "max_tokens")
    return await _respond(request, state, served, req, jobs, rid, req.logprobs, _completion_stream, _completion_body)


async def _completion_body(served: ServedModel, req: CompletionRequest, jobs: list[_PromptJob],
                           params: list[Any], rid: str, created: int, retry_after: int) -> Response:
    started = await _start_all(served, jobs, params, retry_after)
    results = await _gather_collect(served, started, retry_after)
    choices = []
    prompt_tokens = completion_tokens = 0
    for job, acc in zip(jobs, results):
        prefix = job.echo_text if req.echo else ""
        lp = None
        if req.logprobs is not None:
            lp = _completion_logprobs(served.tokenizer, acc.token_ids, acc.logprobs,
                                      acc.top_logprobs if req.logprobs else [None] * len(acc.token_ids), len(prefix))
        choice = {"index": job.index, "text": prefix + acc.text, "logprobs": lp,
                  "finish_reason": acc.finish_reason}
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = _prompt_logprobs_json(served.tokenizer, acc.prompt_logprobs)
        choices.append(choice)
        prompt_tokens += acc.prompt_tokens or len(job.token_ids)
        completion_tokens += acc.completion_tokens
    return _json({"id": rid, "object": "text_completion", "created": created, "model": served.name,
                  "choices": choices, "usage": _usage(prompt_tokens, completion_tokens)})


async def _gather_collect(served: ServedModel, started: list[tuple[AsyncIterator, Any]],
                          retry_after: int) -> list[_Collected]:
    tasks = [asyncio.ensure_future(_collect(served, agen, first, retry_after)) for agen, first in started]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _merged(served: ServedModel, started: list[tuple[AsyncIterator, Any]],
                  retry_after: int) -> AsyncIterator[tuple[int, Any]]:
    """Yield ``(prompt index, RequestOutput)`` from several generations as they come."""
    if len(started) == 1:
        agen, first = started[0]
        async for out in _outputs(agen, first, served, retry_after):
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done_marker = object()

    async def pump(i: int, agen: AsyncIterator, first: Any) -> None:
        try:
            async for out in _outputs(agen, first, served, retry_after):
                await queue.put((i, out))
        except Exception as exc:  # noqa: BLE001 - forwarded to the consumer
            await queue.put((i, exc))
        finally:
            await queue.put((i, done_marker))

    tasks = [asyncio.ensure_future(pump(i, agen, first)) for i, (agen, first) in enumerate(started)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done_marker:
                remaining -= 1
                continue
            if isinstance(item, Exception):
                raise item
            yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _stream(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _stream_guard(served: ServedModel, started: list[tuple[AsyncIterator, Any]],
                        body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Send ``body``; on an engine failure send an SSE error event; always end with [DONE]
    and close every generation (aborting unfinished ones — also on client disconnect)."""
    try:
        async for chunk in body:
            yield chunk
    except APIError as err:
        yield _sse(err.body())
    except Exception as exc:  # noqa: BLE001 - a stream must end cleanly
        log.exception("streaming failed: %s", exc)
        served.count_error("internal")
        yield _sse(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").body())
    finally:
        for agen, _ in started:
            await _aclose(agen)
    yield b"data: [DONE]\n\n"


def _completion_stream(served: ServedModel, req: CompletionRequest, jobs: list[_PromptJob],
                       started: list[tuple[AsyncIterator, Any]], rid: str, created: int,
                       include_usage: bool, retry_after: int) -> AsyncIterator[bytes]:
    async def body() -> AsyncIterator[bytes]:
        echoed = set()
        offsets = {job.index: 0 for job in jobs}
        prompt_tokens = {job.index: len(job.token_ids) for job in jobs}
        completion_tokens = {job.index: 0 for job in jobs}
        async for i, out in _merged(served, started, retry_after):
            _raise_on_failure(out, retry_after)
            job = jobs[i]
            text = getattr(out, "new_text", "") or ""
            if req.echo and i not in echoed:
                echoed.add(i)
                text = job.echo_text + text
                offsets[i] = len(job.echo_text)
            ids = list(getattr(out, "new_token_ids", []) or [])
            lp = None
            if req.logprobs is not None:
                lps, tops = _output_logprobs(out)
                lp = _completion_logprobs(served.tokenizer, ids, lps, tops if req.logprobs else [None] * len(ids),
                                          offsets[i])
                offsets[i] += sum(len(t) for t in lp["tokens"])
            finished = bool(getattr(out, "finished", False))
            prompt_tokens[i], completion_tokens[i] = _token_counts(out, prompt_tokens[i],
                                                                   completion_tokens[i] + len(ids))
            if not text and not finished and lp is None:
                continue  # text held back (a possible stop string or a partial character)
            chunk = {"id": rid, "object": "text_completion", "created": created, "model": served.name,
                     "choices": [{"index": job.index, "text": text, "logprobs": lp,
                                  "finish_reason": getattr(out, "finish_reason", None) if finished else None}]}
            if include_usage:
                chunk["usage"] = None
            yield _sse(chunk)
        if include_usage:
            yield _usage_chunk(rid, "text_completion", created, served, sum(prompt_tokens.values()),
                               sum(completion_tokens.values()))

    return _stream_guard(served, started, body())


async def _chat(request: Request, state: ServerState) -> Response:
    req, _requested, served = await _parse(request, state, ChatCompletionRequest)
    rid = new_id("chatcmpl")
    prompt = render_chat_prompt(req.messages, state.chat_template)
    jobs = await _prepare_jobs(served, [prompt], rid, req.effective_max_tokens(), None, req.max_tokens_param())
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return await _respond(request, state, served, req, jobs, rid, logprobs, _chat_stream, _chat_body)


async def _chat_body(served: ServedModel, req: ChatCompletionRequest, jobs: list[_PromptJob],
                     params: list[Any], rid: str, created: int, retry_after: int) -> Response:
    started = await _start_all(served, jobs, params, retry_after)
    (acc,) = await _gather_collect(served, started, retry_after)
    lp = None
    if req.logprobs:
        lp = _chat_logprobs(served.tokenizer, acc.token_ids, acc.logprobs,
                            acc.top_logprobs if req.top_logprobs else [None] * len(acc.token_ids))
    return _json({"id": rid, "object": "chat.completion", "created": created, "model": served.name,
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": acc.text},
                               "logprobs": lp, "finish_reason": acc.finish_reason}],
                  "usage": _usage(acc.prompt_tokens or len(jobs[0].token_ids), acc.completion_tokens)})


def _chat_stream(served: ServedModel, req: ChatCompletionRequest, jobs: list[_PromptJob],
                 started: list[tuple[AsyncIterator, Any]], rid: str, created: int,
                 include_usage: bool, retry_after: int) -> AsyncIterator[bytes]:
    def chunk(delta: dict, finish: str | None = None, lp: Any = None) -> bytes:
        doc = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": served.name,
               "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
        if include_usage:
            doc["usage"] = None
        return _sse(doc)

    async def body() -> AsyncIterator[bytes]:
        prompt_tokens = len(jobs[0].token_ids)
        completion_tokens = 0
        yield chunk({"role": "assistant", "content": ""})
        async for _i, out in _merged(served, started, retry_after):
            _raise_on_failure(out, retry_after)
            text = getattr(out, "new_text", "") or ""
            ids = list(getattr(out, "new_token_ids", []) or [])
            finished = bool(getattr(out, "finished", False))
            prompt_tokens, completion_tokens = _token_counts(out, prompt_tokens, completion_tokens + len(ids))
            lp = None
            if req.logprobs and ids:
                lps, tops = _output_logprobs(out)
                lp = _chat_logprobs(served.tokenizer, ids, lps, tops if req.top_logprobs else [None] * len(ids))
            if text or lp is not None:
                yield chunk({"content": text}, None, lp)
            if finished:
                yield chunk({}, getattr(out, "finish_reason", None))
        if include_usage:
            yield _usage_chunk(rid, "chat.completion.chunk", created, served, prompt_tokens, completion_tokens)

    return _stream_guard(served, started, body())


# ---------------------------------------------------------------------------------------------
# /metrics


class MergedCollector:
    """Collects every served engine's registry into one exposition.

    Families are merged by name. Samples carrying a ``model`` label come from every engine
    (their label values are the served names, so they never collide); samples without one
    (process-level gauges and counters) come from the default model's engine only, so the
    output never has duplicate series.
    """

    def __init__(self, state: ServerState) -> None:
        self._state = state

    def collect(self):  # noqa: ANN201 - prometheus-client collector protocol
        order = [self._state.default_model] + [n for n in self._state.models if n != self._state.default_model]
        families: dict[str, Metric] = {}
        seen: set = set()
        for rank, name in enumerate(order):
            registry = self._state.models[name].registry
            if registry is None:
                continue
            for fam in registry.collect():
                merged = families.get(fam.name)
                if merged is None:
                    merged = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                    families[fam.name] = merged
                for sample in fam.samples:
                    if rank > 0 and "model" not in sample.labels:
                        continue
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key in seen:
                        continue
                    seen.add(key)
                    merged.samples.append(sample)
        yield from families.values()
