"""``POST /v1/chat/completions`` (OpenAI's chat API).

The conversation is rendered to one prompt with the server's chat template
(:func:`inferctl.engine.chat_template.render_chat_prompt`). ``stream: true`` answers
``chat.completion.chunk`` events: a first one with ``delta.role``, then the text, then one
with the ``finish_reason``, ending ``data: [DONE]``. The default ``max_tokens`` is "the rest
of the context" (vLLM's), capped at the room left in the KV pool; ``max_completion_tokens``
wins over ``max_tokens``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from inferctl.contract.openai import ChatCompletionRequest, ChatCompletionResponse
from inferctl.contract.openapi import route_doc
from inferctl.engine.chat_template import render_chat_prompt
from inferctl.engine.entrypoints.errors import raise_on_failure
from inferctl.engine.entrypoints.generation import (PromptJob, Started, gather_collect, merged,
                                                    output_logprobs, start_all, token_counts)
from inferctl.engine.entrypoints.logprobs import chat_logprobs
from inferctl.engine.entrypoints.push_stream import PushedStream
from inferctl.engine.entrypoints.serving import (check_text_size, guarded, new_id, parse_request, prepare_jobs,
                                                 respond)
from inferctl.engine.entrypoints.sse import HOLE, ChunkTemplate, json_response, sse, stream_guard, usage, usage_chunk
from inferctl.engine.entrypoints.state import ServedModel, ServerState, server_state
from inferctl.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inferctl.engine.engine import RequestOutput

router = APIRouter()


@router.post("/v1/chat/completions", **route_doc(request=ChatCompletionRequest, response=ChatCompletionResponse,
                                                 errors=(400, 404, 413, 503), stream=True))
async def chat_completions(request: Request, state: Annotated[ServerState, Depends(server_state)]) -> Response:
    """Validate, render, prepare and answer one chat request (errors as the OpenAI object)."""
    return await guarded(request, state, _chat)


async def _chat(request: Request, state: ServerState) -> Response:
    req, _requested, served = await parse_request(request, state, ChatCompletionRequest)
    rid = new_id("chatcmpl")
    check_text_size(served, sum(len(m.text()) for m in req.messages), "messages")   # before rendering
    prompt = render_chat_prompt(req.messages, state.chat_template)
    jobs = await prepare_jobs(served, [prompt], rid, req.effective_max_tokens(), None, req.max_tokens_param(),
                              req.n or 1)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return await respond(request, state, served, req, jobs, rid, logprobs, chat_stream, chat_body)


async def chat_body(served: ServedModel, req: ChatCompletionRequest, jobs: list[PromptJob],
                    params: list[SamplingParams], rid: str, created: int, retry_after: int) -> Response:
    """Run the conversation's prompt to the end (``n`` choices) and answer one ``chat.completion``."""
    started = await start_all(served, jobs, params, retry_after)
    results = await gather_collect(served, started, retry_after)
    choices = []
    for job, acc in zip(jobs, results):
        lp = None
        if req.logprobs:
            lp = chat_logprobs(served.tokenizer, acc.token_ids, acc.logprobs,
                               acc.top_logprobs if req.top_logprobs else [None] * len(acc.token_ids))
        choices.append({"index": job.index, "message": {"role": "assistant", "content": acc.text},
                        "logprobs": lp, "finish_reason": acc.finish_reason})
    return json_response({"id": rid, "object": "chat.completion", "created": created, "model": served.name,
                          "choices": choices,
                          "usage": usage(results[0].prompt_tokens or len(jobs[0].token_ids),
                                         sum(acc.completion_tokens for acc in results))})


def chat_stream(served: ServedModel, req: ChatCompletionRequest, jobs: list[PromptJob],
                started: list[Started], rid: str, created: int,
                include_usage: bool, retry_after: int) -> AsyncIterator[bytes] | PushedStream:
    """The SSE chunks of a streamed chat completion (each of the ``n`` choices by its ``index``);
    one choice without logprobs is served by the fast path (:class:`PushedStream`), with the same
    SSE bytes."""
    def chunk(delta: dict, finish: str | None = None, lp: Any = None, index: int = 0) -> bytes:
        doc = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": served.name,
               "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
        if include_usage:
            doc["usage"] = None
        return sse(doc)

    content_chunk = ChunkTemplate({"id": rid, "object": "chat.completion.chunk", "created": created,
                                   "model": served.name, "choices": [{"index": HOLE, "delta": {"content": HOLE},
                                                                     "logprobs": None, "finish_reason": None}],
                                   **({"usage": None} if include_usage else {})})   # chunk({"content": text}, index=i)
    if pushable(req, jobs):
        return _pushed(served, jobs[0], started[0], rid, created, include_usage, retry_after, chunk, content_chunk)

    async def body() -> AsyncIterator[bytes]:
        prompt_tokens = len(jobs[0].token_ids)
        completion_tokens = [0] * len(jobs)
        for job in jobs:
            yield chunk({"role": "assistant", "content": ""}, index=job.index)
        async for i, out in merged(served, started, retry_after):
            raise_on_failure(out, retry_after)
            text = getattr(out, "new_text", "") or ""
            ids = list(getattr(out, "new_token_ids", []) or [])
            finished = bool(getattr(out, "finished", False))
            prompt_tokens, completion_tokens[i] = token_counts(out, prompt_tokens, completion_tokens[i] + len(ids))
            lp = None
            if req.logprobs and ids:
                lps, tops = output_logprobs(out)
                lp = chat_logprobs(served.tokenizer, ids, lps, tops if req.top_logprobs else [None] * len(ids))
            if text and lp is None:
                yield content_chunk.fill(jobs[i].index, text)
            elif text or lp is not None:
                yield chunk({"content": text}, None, lp, jobs[i].index)
            if finished:
                yield chunk({}, getattr(out, "finish_reason", None), index=jobs[i].index)
        if include_usage:
            yield usage_chunk(rid, "chat.completion.chunk", created, served, prompt_tokens, sum(completion_tokens))

    return stream_guard(served, started, body())


def pushable(req: ChatCompletionRequest, jobs: list[PromptJob]) -> bool:
    """Whether a streamed chat completion takes the fast path: one choice, no logprobs."""
    return len(jobs) == 1 and not req.logprobs


def _pushed(served: ServedModel, job: PromptJob, started: Started, rid: str, created: int, include_usage: bool,
            retry_after: int, chunk: Callable[..., bytes], content_chunk: ChunkTemplate) -> PushedStream:
    """One choice, no logprobs: :func:`chat_stream`'s chunks from engine callbacks."""
    def render(out: RequestOutput) -> bytes | None:
        text = out.new_text
        if not out.finished:
            return content_chunk.fill(job.index, text) if text else None
        end = chunk({}, out.finish_reason, index=job.index)
        return content_chunk.fill(job.index, text) + end if text else end

    usage = functools.partial(usage_chunk, rid, "chat.completion.chunk", created, served) if include_usage else None
    return PushedStream(served, started, job.request_id, render, retry_after, len(job.token_ids), usage,
                        head=chunk({"role": "assistant", "content": ""}, index=job.index))
