"""Request handling shared by the generation routes: body → validated request → prompt jobs →
sampling parameters → a JSON or streamed answer.

Errors are checked before a stream starts (validation, routing, drain, the engine's
admission), so a streaming request that fails gets the same 4xx/503 JSON as a non-streaming
one. A missing ``model`` means the default model; an unknown one is a 404 before any metric
is touched, so label values only come from the served set. Request ids (``x-request-id``,
echoed back) and ``user`` are never labels.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import typing
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel
from fastapi.responses import Response

from inferctl.contract.errors import APIError
from inferctl.contract.http import RequestRejected, read_json_body, request_id
from inferctl.contract.openai import (ChatCompletionRequest, CompletionRequest, ProtocolLimits, check_prompt_chars,
                                     validate_model)
from inferctl.engine.entrypoints.checks import check_max_tokens, check_prompt_length
from inferctl.engine.entrypoints.errors import engine_error_to_api, error_response, rejection_to_api_error
from inferctl.engine.entrypoints.generation import PromptJob, Started, run_unless_disconnected, start_all
from inferctl.engine.entrypoints.request_log import note_jobs
from inferctl.engine.entrypoints.sse import event_stream
from inferctl.engine.entrypoints.state import ServedModel, ServerState
from inferctl.engine.metrics import ABORT_CLIENT_DISCONNECT
from inferctl.engine.sampling_params import SamplingLimits, SamplingParams, SamplingParamsError

GenerationRequest = CompletionRequest | ChatCompletionRequest
R = TypeVar("R")
log = logging.getLogger(__name__)

#: ``stream_fn(served, req, jobs, started, rid, created, include_usage, retry_after)`` → SSE bytes.
StreamFn = Callable[..., AsyncIterator[bytes]]
#: ``body_fn(served, req, jobs, params, rid, created, retry_after)`` → the JSON response.
BodyFn = Callable[..., Awaitable[Response]]

#: Texts longer than this (characters) are tokenized on a worker thread.
ENCODE_IN_THREAD_CHARS = 4096


def new_id(prefix: str) -> str:
    """A response id: ``<prefix>-<32 hex digits>`` (e.g. ``cmpl-…``, ``chatcmpl-…``)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    """Unix time in whole seconds (the ``created`` field)."""
    return int(time.time())


async def read_json(request: Request, state: ServerState, *, reject_duplicate_keys: bool = False) -> Any:
    """The request body as parsed JSON (:func:`inferctl.contract.http.read_json_body`): 413
    above ``state.max_body_bytes``; 400 for an empty body, malformed JSON or UTF-8, an integer
    literal above Python's digit limit, or a string with an unpaired surrogate. NaN/Infinity
    parse, and the typed models refuse them naming the field; a non-object is refused by
    :func:`~inferctl.contract.openai.validate_model` (so it counts as an invalid request).
    ``reject_duplicate_keys`` (the admin bodies): an object naming a key twice is a 400 naming it."""
    try:
        return await read_json_body(request, state.max_body_bytes, allow_nan=True, require_object=False,
                                    reject_duplicate_keys=reject_duplicate_keys)
    except RequestRejected as exc:
        raise rejection_to_api_error(exc) from None


async def guarded(request: Request, state: ServerState,
                  handler: Callable[[Request, ServerState], Awaitable[Response]]) -> Response:
    """Run a /v1 or tokenizer handler: APIError → OpenAI error object; x-request-id echoed back
    (1..200 visible ASCII characters, else a new id: ``contract.http.request_id``)."""
    try:
        response = await handler(request, state)
    except APIError as err:
        response = error_response(err)
    # the router's rule (contract/http.py): the client's id when it is safe, else a new one
    response.headers["x-request-id"] = request_id(request.headers.get("x-request-id"))
    return response


async def parse_request(request: Request, state: ServerState,
                        cls: type[R]) -> tuple[R, ServedModel, ServedModel]:
    """Body → validated request + (requested, serving) models; 503 while the serving model
    drains. A validation error is counted on the named (or default) model when it is served."""
    obj = await read_json(request, state)
    model_name = obj.get("model") if isinstance(obj, dict) else None
    known = state.models.get(model_name if isinstance(model_name, str) else state.default_model) \
        if (model_name is None or isinstance(model_name, str)) else None
    try:
        req = validate_model(cls, obj, state.limits)
    except APIError:
        if known is not None:
            known.count_error("invalid_request")
        raise
    ignored = ignored_fields(cls, obj)
    if ignored:
        rid = request.headers.get("x-request-id")
        note_ignored_fields(state, ignored, request_id(rid) if rid else None)
    requested, serving = state.resolve(req.model)
    state.check_admitting(serving)
    return req, requested, serving


@functools.cache
def declared_fields(cls: type[Any]) -> frozenset[str]:
    """The field names and aliases the request model ``cls`` declares (built once per class)."""
    return frozenset(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}


@functools.cache
def nested_models(cls: type[Any]) -> dict[str, type[BaseModel]]:
    """The fields (by name and alias) of the request model ``cls`` whose value is an object of
    another model (``stream_options``: ``StreamOptions``), built once per class."""
    out: dict[str, type[BaseModel]] = {}
    for name, field in cls.model_fields.items():
        if typing.get_origin(field.annotation) in (list, tuple, dict):
            continue   # a list of objects (``messages``) is not one nested object
        for kind in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                out[name] = kind
                if field.alias:
                    out[field.alias] = kind
    return out


def ignored_fields(cls: type[Any], obj: dict) -> tuple[str, ...]:
    """The fields of the body ``obj`` that the request model ``cls`` does not declare (pydantic
    ignores them, as OpenAI-compatible servers do: vLLM logs them too), sorted: top-level names,
    and ``parent.name`` inside a nested object (``stream_options.include_obfuscation``)."""
    names = declared_fields(cls)
    out = [str(k) for k in obj if k not in names]
    for key, model in nested_models(cls).items():
        inner = obj.get(key)
        if isinstance(inner, dict):
            known = declared_fields(model)
            out += [f"{key}.{k}" for k in inner if k not in known]
    return tuple(sorted(out))


def note_ignored_fields(state: ServerState, ignored: tuple[str, ...], rid: str | None) -> None:
    """Log the fields a request sent that this engine ignores (e.g. vLLM's ``min_p``, which would
    change sampling elsewhere): a WARNING the first time a set of names is seen by this server (the
    first 1,024 sets), DEBUG after (a client that always sends it does not flood the log). At most 20
    names, each cut to 64 characters."""
    shown = ", ".join(n[:64] for n in ignored[:20]) + (f" (+{len(ignored) - 20} more)" if len(ignored) > 20 else "")
    first = ignored not in state.ignored_fields_seen and len(state.ignored_fields_seen) < 1024
    if first:   # bounded: a client inventing names cannot grow it (or the warnings) without limit
        state.ignored_fields_seen.add(ignored)
    log.log(logging.WARNING if first else logging.DEBUG,
            "request %s: fields present but ignored by this engine: %s", rid or "-", shown)


def check_text_size(served: ServedModel, n_chars: int, param: str, *, count: bool = True) -> None:
    """400 naming ``param`` when a text of ``n_chars`` characters can never fit the model's
    context (:func:`~inferctl.contract.openai.check_prompt_chars` with ``served.max_prompt_chars``),
    before any tokenizing; counted as an ``invalid_request`` error of ``served`` when ``count``."""
    try:
        check_prompt_chars(n_chars, served.max_prompt_chars, served.max_model_len, param=param)
    except APIError:
        if count:
            served.count_error("invalid_request")
        raise


def encode(served: ServedModel, text: str, bos: bool = True) -> list[int]:
    """Prompt text → token ids, BOS first when ``bos`` (:func:`check_text_size` and the
    body-size limit bound the work)."""
    return list(served.tokenizer.encode(text, bos=bos))


async def encode_async(served: ServedModel, text: str, bos: bool = True) -> list[int]:
    """:func:`encode`, on a worker thread for long texts (so the event loop keeps serving)."""
    if len(text) > ENCODE_IN_THREAD_CHARS:
        return await asyncio.to_thread(encode, served, text, bos)
    return encode(served, text, bos)


def _default_max_tokens(served: ServedModel, prompt_len: int, default_max: int | None) -> int:
    """As many tokens as fit in the context and the KV pool (the cache holds prompt +
    max_tokens - 1 tokens), at least 1, capped by ``default_max``; the engine rejects a prompt
    that alone does not fit the pool."""
    room = served.max_model_len - prompt_len
    if served.kv_capacity_tokens is not None:
        room = min(room, served.kv_capacity_tokens - prompt_len + 1)
    room = max(1, room)
    return room if default_max is None else min(default_max, room)


async def prepare_jobs(served: ServedModel, prompts: list, req_id: str, requested_max: int | None,
                       default_max: int | None, max_param: str, n: int = 1) -> list[PromptJob]:
    """Tokenize prompts and check lengths; ``n`` jobs (choices) per prompt, each its own
    sequence with the same prompt (prefix caching shares its full blocks). 400 for an
    out-of-vocabulary id, a too-long prompt,
    or ``max_tokens`` above the room left (``max_model_len - prompt tokens``); each such 400 is
    counted as an ``invalid_request`` error of ``served``. Every text prompt's size is checked
    (:func:`check_text_size`) before any of them is tokenized."""
    try:
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                check_text_size(served, len(prompt), "prompt" if len(prompts) == 1 else f"prompt[{i}]", count=False)
        jobs = []
        for i, prompt in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                ids = await encode_async(served, prompt)
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
            if requested_max is not None:
                check_max_tokens(requested_max, len(ids), served.max_model_len, param=max_param)
                max_tokens = requested_max
            else:
                max_tokens = _default_max_tokens(served, len(ids), default_max)
            for j in range(n):
                rid = req_id if len(prompts) == 1 else f"{req_id}-{i}"
                rid = rid if n == 1 else f"{rid}-{j}"
                jobs.append(PromptJob(index=i * n + j, request_id=rid, token_ids=ids, echo_text=echo,
                                      max_tokens=max_tokens, sample=j))
        note_jobs(served.name, req_id, jobs)   # the request's log line (request_log)
        return jobs
    except APIError:
        served.count_error("invalid_request")
        raise


def sampling_params(req: GenerationRequest, max_tokens: int, logprobs: int | None,
                    limits: ProtocolLimits, sample: int = 0) -> SamplingParams:
    """The engine's SamplingParams for one prompt of ``req`` (SamplingParamsError naming the field).
    Sample ``j`` of ``n`` with a ``seed`` gets seed + j (wrapped into 64 bits), as vLLM's
    parallel sampling does, so the ``n`` choices differ yet are reproducible.

    The protocol layer already enforced the request bounds; SamplingParams re-checks against
    the same numbers so an operator who raises a protocol limit is not refused one layer
    further down.
    """
    sampling_limits = SamplingLimits(max_stop_strings=limits.max_stop_sequences,
                                     max_stop_string_chars=limits.max_stop_chars,
                                     max_logprobs=max(limits.max_logprobs, limits.max_top_logprobs))
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "stop": req.stop_list(), "logprobs": logprobs,
                              "limits": sampling_limits,
                              "ignore_eos": bool(req.ignore_eos), "repetition_stop": req.repetition_stop}
    for name in ("temperature", "top_k", "top_p", "seed", "repetition_penalty", "presence_penalty",
                 "frequency_penalty"):
        value = getattr(req, name)
        if value is not None:
            kwargs[name] = value
    if sample and req.seed is not None:
        seed = req.seed + sample
        kwargs["seed"] = seed - 2**64 if seed > 2**64 - 1 else seed
    if req.stop_token_ids:
        kwargs["stop_token_ids"] = list(req.stop_token_ids)
    prompt_logprobs = getattr(req, "prompt_logprobs", None)
    if prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = prompt_logprobs
    return SamplingParams(**kwargs)


def params_for(req: GenerationRequest, jobs: list[PromptJob], served: ServedModel, logprobs: int | None,
               limits: ProtocolLimits) -> list[SamplingParams]:
    """:func:`sampling_params` for every job; a SamplingParamsError is a 400 naming its field."""
    try:
        return [sampling_params(req, job.max_tokens, logprobs, limits, job.sample) for job in jobs]
    except SamplingParamsError as exc:
        raise engine_error_to_api(exc, served, 0) from None


async def respond(request: Request, state: ServerState, served: ServedModel, req: GenerationRequest,
                  jobs: list[PromptJob], rid: str, logprobs: int | None, stream_fn: StreamFn,
                  body_fn: BodyFn) -> Response:
    """Answer a generation request whose prompts are prepared (shared by completions and chat).

    Builds each prompt's SamplingParams (400 naming the field), then either starts every
    generation (so admission errors are still JSON answers) and streams ``stream_fn(served, req,
    jobs, started, rid, created, include_usage, retry_after)``, or runs ``body_fn(served, req,
    jobs, params, rid, created, retry_after)`` to one JSON response, cancelled (499) when the
    client disconnects first. A client that leaves early (either way) is counted in
    ``inferctl_engine_request_aborts_total{reason="client_disconnect"}``; its generations
    finish with ``abort`` and stay out of the latency histograms.
    """
    params = params_for(req, jobs, served, logprobs, state.limits)
    created = now_s()
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        started: list[Started] = await start_all(served, jobs, params, state.retry_after_seconds)
        body = stream_fn(served, req, jobs, started, rid, created, include_usage, state.retry_after_seconds)
        return body if isinstance(body, Response) else event_stream(body)
    return await run_unless_disconnected(
        request, body_fn(served, req, jobs, params, rid, created, state.retry_after_seconds),
        on_disconnect=lambda: served.count_abort(ABORT_CLIENT_DISCONNECT))
