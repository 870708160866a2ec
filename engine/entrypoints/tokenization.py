"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's tokenizer API).

``{"model"?, "prompt": str | "messages": [...], "add_special_tokens": true,
"return_token_strs": false}`` → ``{"tokens", "count", "max_model_len"}`` (+ ``token_strs``):
the ids a completions/chat request with the same text would feed the engine (BOS first when
``add_special_tokens``). ``{"model"?, "tokens": [int]}`` → ``{"prompt": text}``. The model
that would serve the name (routes followed) tokenizes; no engine work, so both are allowed
while draining. Unlike a generation request, a text longer than the context is not refused:
tokenizing whole books is what ``/tokenize`` is for (long-text processing counts and cuts them
into windows, as with vLLM's ``/tokenize``); its work is bounded by the request body limit
(``--max-body-bytes``, 4 MiB by default) and a long text is tokenized on a worker thread, so
it never blocks the event loop.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from inferctl.contract.openai import validate_model
from inferctl.contract.openapi import route_doc
from inferctl.contract.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from inferctl.engine.chat_template import render_chat_prompt
from inferctl.engine.entrypoints.checks import check_token_ids
from inferctl.engine.entrypoints.logprobs import token_text
from inferctl.engine.entrypoints.serving import encode_async, guarded, read_json
from inferctl.engine.entrypoints.sse import json_response
from inferctl.engine.entrypoints.state import ServerState, server_state

router = APIRouter()


@router.post("/tokenize", **route_doc(request=TokenizeRequest, response=TokenizeResponse,
                                      errors=(400, 404, 413)))
async def tokenize(request: Request, state: Annotated[ServerState, Depends(server_state)]) -> Response:
    """Text or a conversation → token ids (errors as the OpenAI object)."""
    return await guarded(request, state, _tokenize)


@router.post("/detokenize", **route_doc(request=DetokenizeRequest, response=DetokenizeResponse,
                                        errors=(400, 404, 413)))
async def detokenize(request: Request, state: Annotated[ServerState, Depends(server_state)]) -> Response:
    """Token ids → text (errors as the OpenAI object)."""
    return await guarded(request, state, _detokenize)


async def _tokenize(request: Request, state: ServerState) -> Response:
    """400 naming the field for a bad body, 404 for an unknown model."""
    req = validate_model(TokenizeRequest, await read_json(request, state), state.limits)
    req.check_one_input()
    _requested, served = state.resolve(req.model)
    text = req.prompt if req.prompt is not None else render_chat_prompt(req.messages, state.chat_template)
    ids = await encode_async(served, text, bos=bool(req.add_special_tokens))
    doc: dict[str, Any] = {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids}
    if req.return_token_strs:
        doc["token_strs"] = [token_text(served.tokenizer, t) for t in ids]
    return json_response(doc)


async def _detokenize(request: Request, state: ServerState) -> Response:
    """400 naming ``tokens[i]`` for an id outside the vocabulary."""
    req = validate_model(DetokenizeRequest, await read_json(request, state), state.limits)
    _requested, served = state.resolve(req.model)
    check_token_ids(req.tokens, served.vocab_size)
    return json_response({"prompt": served.tokenizer.decode(req.tokens)})
