"""Driving the async engine for one HTTP request: start, iterate, collect, cancel.

A request's prompts become :class:`PromptJob`s; :func:`start_all` starts every generation
and waits for each one's first output (so admission errors surface before any response
byte is sent); :func:`gather_collect` drains them into :class:`Collected` results (a JSON
answer) and :func:`merged` interleaves their outputs (a stream). Engine exceptions become
:class:`~inferctl.contract.errors.APIError` (:func:`inferctl.engine.entrypoints.errors.engine_error_to_api`);
closing an iterator aborts its request in the engine, which frees its KV blocks within a step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response

from inferctl.contract.errors import APIError
from inferctl.engine.entrypoints.errors import engine_error_to_api, raise_on_failure
from inferctl.engine.entrypoints.request_log import current_request_id, note_finished, note_first_output
from inferctl.engine.entrypoints.state import ServedModel

if TYPE_CHECKING:
    from inferctl.engine.engine import RequestOutput
    from inferctl.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

#: A started generation: the engine's output iterator and its first output (None: none came).
Started = tuple[AsyncIterator["RequestOutput"], "RequestOutput | None"]


@dataclass
class PromptJob:
    """One choice of a request: its prompt's token ids, echo text, generation budget (tokens),
    and which of the ``n`` samples of that prompt it is (``index`` = prompt × n + sample)."""

    index: int
    request_id: str
    token_ids: list[int]
    echo_text: str
    max_tokens: int
    sample: int = 0


@dataclass
class Collected:
    """A finished generation, accumulated from the engine's RequestOutputs."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict | None] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_logprobs: list | None = None


def output_logprobs(out: RequestOutput) -> tuple[list, list]:
    """(chosen-token logprobs, top-logprob dicts) of one RequestOutput, aligned with new tokens."""
    n = len(getattr(out, "new_token_ids", []) or [])
    lps = getattr(out, "logprobs", None)
    tops = getattr(out, "top_logprobs", None)
    lps = list(lps) if lps is not None else [None] * n
    tops = list(tops) if tops is not None else [None] * n
    return lps, tops


def token_counts(out: RequestOutput, prompt_tokens: int, completion_tokens: int) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` as ``out`` reports them; a count it leaves out
    (missing or 0) keeps the caller's value."""
    return (int(getattr(out, "prompt_tokens", 0) or prompt_tokens),
            int(getattr(out, "completion_tokens", 0) or completion_tokens))


async def next_output(agen: AsyncIterator[RequestOutput], served: ServedModel, retry_after: int) -> RequestOutput:
    """``agen.__anext__()`` with engine exceptions mapped to APIError (500 for the unknown)."""
    try:
        return await agen.__anext__()
    except (StopAsyncIteration, APIError, asyncio.CancelledError):
        raise
    except Exception as exc:  # noqa: BLE001 - engine failures become clean HTTP errors
        raise _api_error(exc, served, retry_after) from None


def _api_error(exc: Exception, served: ServedModel, retry_after: int) -> APIError:
    """An engine exception as the APIError the client gets (500 ``engine_error`` for the unknown)."""
    api = engine_error_to_api(exc, served, retry_after)
    if api is None:
        log.error("engine stream failed: %s: %s", type(exc).__name__, exc)
        api = APIError(500, f"engine error: {type(exc).__name__}: {exc}", code="engine_error")
    return api


async def outputs(agen: AsyncIterator[RequestOutput], first: RequestOutput | None, served: ServedModel,
                  retry_after: int) -> AsyncIterator[RequestOutput]:
    """Yield one generation's RequestOutputs: ``first`` (None: nothing), then the engine's next
    ones until one is finished or the iterator ends; engine errors become APIError
    (:func:`next_output`). Failed outputs are yielded, not raised (callers decide)."""
    out = first
    step = agen.__anext__   # next_output inlined: one coroutine less per token
    while out is not None:
        done = getattr(out, "finished", False)
        if done:
            note_finished(out)   # the request's log line (request_log)
        yield out
        if done:
            return
        try:
            out = await step()
        except StopAsyncIteration:
            return
        except (APIError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - engine failures become clean HTTP errors
            raise _api_error(exc, served, retry_after) from None


async def aclose(agen: AsyncIterator[Any]) -> None:
    """Close a generation's iterator (aborting it in the engine when unfinished); never raises."""
    close = getattr(agen, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # noqa: BLE001 - closing an aborted stream must never raise
            log.debug("error while closing a generation", exc_info=True)


async def start(served: ServedModel, job: PromptJob, params: SamplingParams, retry_after: int) -> Started:
    """Start one generation and wait for its first output (so admission errors surface
    before any response is sent). Returns ``(iterator, first output or None)``."""
    agen = served.async_engine.generate(job.request_id, job.token_ids, params, x_request_id=current_request_id())
    try:
        first = await next_output(agen, served, retry_after)
        note_first_output(first)
        raise_on_failure(first, retry_after)
    except StopAsyncIteration:
        return agen, None
    except BaseException:
        await aclose(agen)
        raise
    return agen, first


async def start_all(served: ServedModel, jobs: list[PromptJob], params: list[SamplingParams],
                    retry_after: int) -> list[Started]:
    """Start every job; if one fails, abort the ones already started and re-raise."""
    started: list[Started] = []
    try:
        for job, job_params in zip(jobs, params):
            started.append(await start(served, job, job_params, retry_after))
    except BaseException:
        for agen, _ in started:
            await aclose(agen)
        raise
    return started


def accumulate(acc: Collected, out: RequestOutput) -> None:
    """Add one RequestOutput's increment to ``acc``."""
    acc.text += getattr(out, "new_text", "") or ""
    ids = list(getattr(out, "new_token_ids", []) or [])
    acc.token_ids += ids
    lps, tops = output_logprobs(out)
    acc.logprobs += lps
    acc.top_logprobs += tops
    if getattr(out, "finished", False):
        acc.finish_reason = getattr(out, "finish_reason", None)
    acc.prompt_tokens, acc.completion_tokens = token_counts(out, acc.prompt_tokens, len(acc.token_ids))
    prompt_lps = getattr(out, "prompt_logprobs", None)
    if prompt_lps is not None:
        acc.prompt_logprobs = prompt_lps


async def collect(served: ServedModel, agen: AsyncIterator[RequestOutput], first: RequestOutput | None,
                  retry_after: int) -> Collected:
    """Drain one generation into a :class:`Collected`; 503/400 on an engine failure."""
    acc = Collected()
    try:
        async for out in outputs(agen, first, served, retry_after):
            raise_on_failure(out, retry_after)
            accumulate(acc, out)
    finally:
        await aclose(agen)
    return acc


async def gather_collect(served: ServedModel, started: list[Started], retry_after: int) -> list[Collected]:
    """:func:`collect` every started generation concurrently; one failure cancels the rest."""
    tasks = [asyncio.ensure_future(collect(served, agen, first, retry_after)) for agen, first in started]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def merged(served: ServedModel, started: list[Started],
                 retry_after: int) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yield ``(prompt index, RequestOutput)`` from several generations as they come."""
    if len(started) == 1:
        agen, first = started[0]
        async for out in outputs(agen, first, served, retry_after):
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done_marker = object()

    async def pump(i: int, agen: AsyncIterator[RequestOutput], first: RequestOutput | None) -> None:
        try:
            async for out in outputs(agen, first, served, retry_after):
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


async def _until_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body has already been read)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


async def run_unless_disconnected(request: Request, coro: Awaitable[Response],
                                  on_disconnect: Callable[[], None] | None = None) -> Response:
    """Run ``coro``; cancel it (aborting its generations), call ``on_disconnect`` (the abort
    count) and answer 499 if the client goes away first."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        if on_disconnect is not None:
            on_disconnect()
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
