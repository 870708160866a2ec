"""``POST /v1/completions`` (OpenAI's legacy completions API, with vLLM's ``prompt_logprobs``).

A batch of prompts is answered as one choice per prompt (``index`` = the prompt's position).
``stream: true`` answers ``text/event-stream`` chunks of ``object: "text_completion"``,
ending ``data: [DONE]``; with ``stream_options.include_usage`` a last chunk carries
``usage`` and no choices. ``choices[i].prompt_logprobs`` (vLLM's shape, computed by the engine
during prefill) is ``[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]``, one entry
per prompt token; refused with ``stream``. The default ``max_tokens`` is 16 (OpenAI's),
capped at the room left in the context.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from inferctl.contract.openai import CompletionRequest, CompletionResponse
from inferctl.contract.openapi import route_doc
from inferctl.engine.entrypoints.errors import raise_on_failure
from inferctl.engine.entrypoints.generation import (PromptJob, Started, gather_collect, merged,
                                                    output_logprobs, start_all, token_counts)
from inferctl.engine.entrypoints.push_stream import PushedStream
from inferctl.engine.entrypoints.logprobs import completion_logprobs, prompt_logprobs_json
from inferctl.engine.entrypoints.serving import guarded, new_id, parse_request, prepare_jobs, respond
from inferctl.engine.entrypoints.sse import HOLE, ChunkTemplate, json_response, sse, stream_guard, usage, usage_chunk
from inferctl.engine.entrypoints.state import ServedModel, ServerState, server_state
from inferctl.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inferctl.engine.engine import RequestOutput

#: OpenAI's default ``max_tokens`` for completions.
DEFAULT_MAX_TOKENS = 16

router = APIRouter()


@router.post("/v1/completions", **route_doc(request=CompletionRequest, response=CompletionResponse,
                                            errors=(400, 404, 413, 503), stream=True))
async def completions(request: Request, state: Annotated[ServerState, Depends(server_state)]) -> Response:
    """Validate, prepare and answer one completions request (errors as the OpenAI object)."""
    return await guarded(request, state, _completions)


async def _completions(request: Request, state: ServerState) -> Response:
    req, _requested, served = await parse_request(request, state, CompletionRequest)
    rid = new_id("cmpl")
    jobs = await prepare_jobs(served, req.prompts(), rid, req.max_tokens, DEFAULT_MAX_TOKENS, "max_tokens",
                              req.n or 1)
    return await respond(request, state, served, req, jobs, rid, req.logprobs, completion_stream, completion_body)


async def completion_body(served: ServedModel, req: CompletionRequest, jobs: list[PromptJob],
                          params: list[SamplingParams], rid: str, created: int, retry_after: int) -> Response:
    """Run every prompt to the end and answer one ``text_completion`` document."""
    started = await start_all(served, jobs, params, retry_after)
    results = await gather_collect(served, started, retry_after)
    choices = []
    prompt_tokens = completion_tokens = 0
    for job, acc in zip(jobs, results):
        prefix = job.echo_text if req.echo else ""
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(served.tokenizer, acc.token_ids, acc.logprobs,
                                     acc.top_logprobs if req.logprobs else [None] * len(acc.token_ids), len(prefix))
        choice = {"index": job.index, "text": prefix + acc.text, "logprobs": lp,
                  "finish_reason": acc.finish_reason}
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs_json(served.tokenizer, acc.prompt_logprobs)
        choices.append(choice)
        if job.sample == 0:    # the n choices of a prompt share its tokens: counted once
            prompt_tokens += acc.prompt_tokens or len(job.token_ids)
        completion_tokens += acc.completion_tokens
    return json_response({"id": rid, "object": "text_completion", "created": created, "model": served.name,
                          "choices": choices, "usage": usage(prompt_tokens, completion_tokens)})


def completion_stream(served: ServedModel, req: CompletionRequest, jobs: list[PromptJob],
                      started: list[Started], rid: str, created: int,
                      include_usage: bool, retry_after: int) -> AsyncIterator[bytes] | PushedStream:
    """The SSE chunks of a streamed completion (every prompt's outputs as they come); one
    choice without logprobs or echo is served by the fast path (:class:`PushedStream`), with the
    same bytes."""
    text_chunk = ChunkTemplate({"id": rid, "object": "text_completion", "created": created, "model": served.name,
                                "choices": [{"index": HOLE, "text": HOLE, "logprobs": None, "finish_reason": HOLE}],
                                **({"usage": None} if include_usage else {})})   # the chunks without logprobs
    if pushable(req, jobs):
        return _pushed(served, jobs[0], started[0], rid, created, include_usage, retry_after, text_chunk)

    async def body() -> AsyncIterator[bytes]:
        echoed = set()
        offsets = {job.index: 0 for job in jobs}
        prompt_tokens = {job.index: len(job.token_ids) for job in jobs if job.sample == 0}
        completion_tokens = {job.index: 0 for job in jobs}
        async for i, out in merged(served, started, retry_after):
            raise_on_failure(out, retry_after)
            job = jobs[i]
            text = getattr(out, "new_text", "") or ""
            if req.echo and i not in echoed:
                echoed.add(i)
                text = job.echo_text + text
                offsets[i] = len(job.echo_text)
            ids = list(getattr(out, "new_token_ids", []) or [])
            lp = None
            if req.logprobs is not None:
                lps, tops = output_logprobs(out)
                lp = completion_logprobs(served.tokenizer, ids, lps, tops if req.logprobs else [None] * len(ids),
                                         offsets[i])
                offsets[i] += sum(len(t) for t in lp["tokens"])
            finished = bool(getattr(out, "finished", False))
            p, completion_tokens[i] = token_counts(out, len(job.token_ids), completion_tokens[i] + len(ids))
            if i in prompt_tokens:
                prompt_tokens[i] = p
            if not text and not finished and lp is None:
                continue  # text held back (a possible stop string or a partial character)
            if lp is None:
                yield text_chunk.fill(job.index, text, getattr(out, "finish_reason", None) if finished else None)
                continue
            chunk = {"id": rid, "object": "text_completion", "created": created, "model": served.name,
                     "choices": [{"index": job.index, "text": text, "logprobs": lp,
                                  "finish_reason": getattr(out, "finish_reason", None) if finished else None}]}
            if include_usage:
                chunk["usage"] = None
            yield sse(chunk)
        if include_usage:
            yield usage_chunk(rid, "text_completion", created, served, sum(prompt_tokens.values()),
                              sum(completion_tokens.values()))

    return stream_guard(served, started, body())


def pushable(req: CompletionRequest, jobs: list[PromptJob]) -> bool:
    """Whether a streamed completion takes the fast path: one choice, no logprobs, no echo."""
    return len(jobs) == 1 and req.logprobs is None and not req.echo


def _pushed(served: ServedModel, job: PromptJob, started: Started, rid: str, created: int, include_usage: bool,
            retry_after: int, text_chunk: ChunkTemplate) -> PushedStream:
    """One choice, no logprobs, no echo: :func:`completion_stream`'s chunks from engine callbacks."""
    def render(out: RequestOutput) -> bytes | None:
        text = out.new_text
        if not text and not out.finished:
            return None   # text held back (a possible stop string or a partial character)
        return text_chunk.fill(job.index, text, out.finish_reason if out.finished else None)

    usage = functools.partial(usage_chunk, rid, "text_completion", created, served) if include_usage else None
    return PushedStream(served, started, job.request_id, render, retry_after, len(job.token_ids), usage)
