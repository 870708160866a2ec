"""What the routes share: the typed engine handle, the served models and the server state.

:class:`AsyncEngineHandle` is the part of :class:`~inferctl.engine.async_engine.AsyncLLMEngine`
the HTTP layer uses (a Protocol, so tests and future engines can stand in for it);
:class:`ServedModel` is one served model with what the routes read from it, fixed at start;
:class:`ServerState` holds every served model and the server's mutable routing/drain state,
on ``app.state.server`` (no module globals). Routes get it with :func:`server_state`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from fastapi import Request
from prometheus_client import CollectorRegistry, Counter

from inferctl.contract.errors import APIError
from inferctl.contract.openai import ProtocolLimits, max_prompt_chars
from inferctl.engine.chat_template import ChatTemplate

if TYPE_CHECKING:
    from inferctl.engine.engine import LLMEngine, RequestOutput
    from inferctl.engine.sampling_params import SamplingParams

#: Default request-body limit: 4 MiB holds a 100k-token prompt as text or as token ids.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: Default Retry-After (seconds) on 503 (drain, retryable OOM).
DEFAULT_RETRY_AFTER_SECONDS = 5


class Tokenizer(Protocol):
    """The tokenizer calls the routes make (:class:`inferctl.engine.tokenizer.Tokenizer`)."""

    vocab_size: int

    def encode(self, text: str, bos: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_bytes(self, i: int) -> bytes: ...


class AsyncEngineHandle(Protocol):
    """The async engine as the HTTP layer drives it (implemented by ``AsyncLLMEngine``).

    ``generate`` streams ``RequestOutput``s (the last has ``finished=True``) and raises the
    engine's ``AdmissionError`` before the first one when it refuses the request;
    ``redirect(request_id, sink)`` hands a started request's further outputs to ``sink`` on the
    loop instead (the streaming fast path, :mod:`inferctl.engine.entrypoints.push_stream`);
    ``request_precision``, ``inject_fault`` and ``set_draining`` may be called from any
    thread (applied by the stepping thread; ``set_draining_async`` is the event loop's, which
    waits without blocking); ``abort_all(message)`` fails every open request (returns how many);
    ``get_stats`` is the ``/stats`` document, ``get_latency_histograms`` its
    ``requests.latency_histograms``.
    ``engine`` is the wrapped ``LLMEngine``, read once at start for the model's bundle,
    config and metric registry.
    """

    engine: LLMEngine

    @property
    def is_running(self) -> bool: ...

    @property
    def precision(self) -> str: ...

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 x_request_id: str | None = None) -> AsyncIterator[RequestOutput]: ...

    def redirect(self, request_id: str, sink: Callable[[RequestOutput | BaseException], None]) -> None: ...

    def request_precision(self, mode: str) -> None: ...

    def inject_fault(self, kind: str, count: int) -> None: ...

    def set_draining(self, draining: bool) -> None: ...

    async def set_draining_async(self, draining: bool) -> None: ...

    async def get_latency_histograms(self) -> dict: ...

    def abort_all(self, message: str) -> int: ...

    async def get_stats(self) -> dict: ...


@dataclass
class ServedModel:
    """One served model: its name, async engine, and what the server reads from it.

    ``max_model_len`` and ``vocab_size`` in tokens; ``kv_capacity_tokens`` = KV blocks ×
    block size (None when the engine has no fixed pool); ``registry`` the engine's
    Prometheus registry; ``error_counter`` its ``inferctl_engine_request_errors_total``.
    """

    name: str
    async_engine: AsyncEngineHandle
    tokenizer: Tokenizer
    max_model_len: int
    vocab_size: int
    kv_capacity_tokens: int | None
    registry: CollectorRegistry | None
    error_counter: Counter | None = None
    #: Text prompts above this many characters can never fit (``contract.openai.max_prompt_chars``).
    max_prompt_chars: int | None = None
    abort_counter: Counter | None = None

    @classmethod
    def from_async_engine(cls, name: str, async_engine: AsyncEngineHandle) -> ServedModel:
        """Read the model's numbers from ``async_engine.engine`` (its bundle and config), or from
        ``async_engine.model_info`` for an engine core in its own process
        (:class:`inferctl.engine.core_client.CoreClient`, which sent :func:`model_numbers`)."""
        info = getattr(async_engine, "model_info", None)
        if info is None:
            llm = async_engine.engine
            info = model_numbers(llm)
            registry, metrics = getattr(llm, "registry", None), getattr(llm, "metrics", None) or {}
        else:
            registry, metrics = async_engine.registry, async_engine.metrics
        return cls(name=name, async_engine=async_engine, tokenizer=info["tokenizer"],
                   max_model_len=info["max_model_len"], vocab_size=info["vocab_size"],
                   kv_capacity_tokens=info["kv_capacity_tokens"], registry=registry,
                   error_counter=metrics.get("inferctl_engine_request_errors_total"),
                   max_prompt_chars=prompt_char_bound(info["tokenizer"], info["max_model_len"]),
                   abort_counter=metrics.get("inferctl_engine_request_aborts_total"))

    def precision(self) -> str | None:
        """The engine's current precision mode (``full``/``int8``), None if unknown."""
        value = getattr(self.async_engine, "precision", None)
        return value if isinstance(value, str) else None

    def request_precision(self, mode: str) -> None:
        """Ask for a precision switch (applied by the stepping thread before its next step)."""
        self.async_engine.request_precision(mode)

    def inject_fault(self, kind: str, count: int) -> None:
        """Make the next ``count`` steps run out of memory (ValueError for a bad kind)."""
        self.async_engine.inject_fault(kind, count)

    async def set_draining(self, draining: bool) -> None:
        """Stop or resume admitting requests; in-flight ones continue. Returns once the engine
        applied it; raises ``TimeoutError`` or ``EngineDeadError`` (an engine core process that
        does not answer, or is gone)."""
        await self.async_engine.set_draining_async(draining)

    async def latency_histograms(self) -> dict:
        """The engine's ``requests.latency_histograms`` (same errors as :meth:`set_draining`)."""
        return await self.async_engine.get_latency_histograms()

    async def stats(self) -> dict:
        """The engine's ``/stats`` document, taken between steps without blocking the loop."""
        return await self.async_engine.get_stats()

    def count_abort(self, reason: str) -> None:
        """``inferctl_engine_request_aborts_total{model, reason}`` += 1 (a request its client gave up on)."""
        if self.abort_counter is not None:
            self.abort_counter.labels(model=self.name, reason=reason).inc()

    def count_error(self, reason: str) -> None:
        """``inferctl_engine_request_errors_total{model, reason}`` += 1 (served names only)."""
        if self.error_counter is not None:
            self.error_counter.labels(model=self.name, reason=reason).inc()


@dataclass
class ServerState:
    """Everything the routes share (held on ``app.state.server``; no module globals).

    ``routes`` maps a served name to the served name that answers for it (one hop);
    ``draining`` the models that admit no new requests (admin drain); ``stopping`` is set once
    the process was told to stop (SIGTERM/SIGINT): no model admits requests from then on;
    ``in_flight`` counts the HTTP requests being answered, probes excluded
    (:class:`~inferctl.engine.entrypoints.lifecycle.InFlightMiddleware`).
    """

    models: dict[str, ServedModel]
    default_model: str
    admin_token: str | None
    limits: ProtocolLimits
    chat_template: ChatTemplate
    max_body_bytes: int
    retry_after_seconds: int
    routes: dict[str, str] = field(default_factory=dict)
    draining: dict[str, bool] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    #: this process's identity (a uuid4 hex made at start, in ``/health`` and ``/stats``): a
    #: restart is proven by a new one (controller/policies/restart_proof.py), never by a failed poll
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    stopping: bool = False
    in_flight: int = 0
    #: the sets of undeclared request fields already logged as a warning (later ones: DEBUG)
    ignored_fields_seen: set[tuple[str, ...]] = field(default_factory=set)

    def lookup(self, name: str | None, param: str = "model") -> ServedModel:
        """The served model called ``name`` (None → default), without routing; 404 naming
        ``param`` (the request field that held the name) if unknown."""
        key = self.default_model if name is None else name
        served = self.models.get(key)
        if served is None:
            shown = repr(name) if len(str(name)) <= 64 else f"{str(name)[:64]!r}... ({len(str(name))} characters)"
            raise APIError(404, f"{param}: model {shown} does not exist; served models: "
                                f"{', '.join(sorted(self.models))}", param=param, code="model_not_found")
        return served

    def resolve(self, name: str | None) -> tuple[ServedModel, ServedModel]:
        """``(requested, serving)``: the requested model and the one that serves it (one route hop)."""
        requested = self.lookup(name)
        target = self.routes.get(requested.name)
        serving = self.models.get(target, requested) if target else requested
        return requested, serving

    def check_admitting(self, served: ServedModel) -> None:
        """503 ``engine_draining`` with Retry-After while ``served`` drains or the server stops."""
        if self.stopping:
            served.count_error("overloaded")
            raise APIError(503, "the engine is shutting down and admits no new requests; retry on another replica",
                           code="engine_draining", err_type="service_unavailable_error",
                           headers={"Retry-After": str(self.retry_after_seconds)})
        if self.draining.get(served.name):
            served.count_error("overloaded")
            raise APIError(503, f"model {served.name!r} is draining and admits no new requests; retry later",
                           code="engine_draining", err_type="service_unavailable_error",
                           headers={"Retry-After": str(self.retry_after_seconds)})

    def readiness(self) -> tuple[bool, str | None]:
        """``(ready, reason)``: whether a request for the default model would be admitted now.

        Reasons, first match wins: ``"stopping"`` (SIGTERM/SIGINT received), ``"draining"`` (the
        model that serves the default name, after a route, is drained), ``"starting"`` (its
        engine's stepping thread is not running), ``"unresponsive"`` (its engine core process
        has left a ping unanswered for seconds: ``CoreClient.responsive``). A drained light model that serves nothing
        for the default name leaves the server ready (its state is in ``/ready``'s ``models``).
        """
        _, serving = self.resolve(None)
        reason = self.not_ready_reason(serving)
        return reason is None, reason

    def not_ready_reason(self, served: ServedModel) -> str | None:
        """Why ``served`` admits no request now (:meth:`readiness`'s reasons, first match wins),
        None when it would admit one."""
        if self.stopping:
            return "stopping"
        if self.draining.get(served.name):
            return "draining"
        if not served.async_engine.is_running:
            return "starting"
        if getattr(served.async_engine, "responsive", True) is False:
            return "unresponsive"
        return None

    def admin_targets(self, name: str | None) -> list[ServedModel]:
        """The named model, or every served model (the default first) when ``name`` is None."""
        if name is not None:
            return [self.lookup(name)]
        first = self.models[self.default_model]
        return [first] + [m for n, m in self.models.items() if n != self.default_model]


def model_numbers(llm) -> dict:  # noqa: ANN001 - an LLMEngine
    """What the server reads from an engine's bundle and config: ``tokenizer``, ``max_model_len``
    and ``vocab_size`` (tokens), ``kv_capacity_tokens`` (KV blocks × block size, None without a
    fixed pool)."""
    bundle = llm.bundle
    tokenizer = bundle.tokenizer
    config = llm.config
    vocab = int(getattr(tokenizer, "vocab_size", 0) or bundle.args.vocab_size)
    blocks = getattr(llm, "num_kv_blocks", None)
    return {"tokenizer": tokenizer, "max_model_len": int(config.max_model_len),
            "vocab_size": min(vocab, int(bundle.args.vocab_size)),
            "kv_capacity_tokens": int(blocks) * int(config.block_size) if blocks else None}


async def server_state(request: Request) -> ServerState:
    """FastAPI dependency: the app's :class:`ServerState` (async: no thread-pool hop)."""
    return request.app.state.server


def prompt_char_bound(tokenizer: Tokenizer, max_model_len: int) -> int | None:
    """:func:`~inferctl.contract.openai.max_prompt_chars` for ``tokenizer`` (its longest token in
    UTF-8 bytes, read once at start); None when the tokenizer cannot list its tokens' bytes."""
    try:
        lengths = [len(tokenizer.token_bytes(i)) for i in range(int(tokenizer.vocab_size))]
    except (AttributeError, TypeError, ValueError):
        return None
    return max_prompt_chars(max_model_len, lengths)
