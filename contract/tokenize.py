"""Request and response shapes of ``POST /tokenize`` and ``POST /detokenize`` (vLLM's
tokenizer API, served next to the OpenAI routes). Validation follows the same strict policy
as :mod:`inferctl.contract.openai`; token ids are checked against the vocabulary by the
engine, which knows it.
"""

from __future__ import annotations

from pydantic import BaseModel

from inferctl.contract.errors import APIError
from inferctl.contract.jsontypes import JsonInt, StrictModel as _Strict
from inferctl.contract.openai import ChatMessage


class TokenizeRequest(_Strict):
    """``POST /tokenize`` as vLLM's OpenAI server has it.

    Either ``prompt`` (a string; vLLM's completion form) or ``messages`` (vLLM's chat form,
    rendered with the server's chat template as ``/v1/chat/completions`` does) — exactly one.
    ``add_special_tokens`` (default true for both forms, because both generation routes of
    this server prepend BOS: the ids are then exactly what a completions or chat request with
    the same text would feed the engine; vLLM defaults it to false for chat only because its
    chat templates spell BOS themselves). ``return_token_strs`` adds ``token_strs``, each
    token's text. Unknown fields (``add_generation_prompt``, ...) are ignored, as on the
    completions route.
    """

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = True
    return_token_strs: bool | None = False

    def check_one_input(self) -> None:
        """Raise APIError 400 unless exactly one of ``prompt`` and ``messages`` is given
        (``param`` names the field to fix)."""
        if self.prompt is None and self.messages is None:
            raise APIError(400, "prompt: is required (a string), or 'messages' (a chat conversation) "
                                "instead", param="prompt", code="missing")
        if self.prompt is not None and self.messages is not None:
            raise APIError(400, "messages: give either 'prompt' or 'messages', not both",
                           param="messages", code="invalid_request")


class TokenizeResponse(BaseModel):
    """``{"count", "max_model_len", "tokens"}`` (+ ``token_strs`` when asked for)."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Strict):
    """``POST /detokenize``: ``tokens`` (token ids, each in the model's vocabulary; an empty
    list gives ``""``) → ``{"prompt": text}``. Ids outside the vocabulary (negative ones
    included) are a 400 naming ``tokens[i]``, checked by the engine (it knows the vocabulary)."""

    model: str | None = None
    tokens: list[JsonInt]



class DetokenizeResponse(BaseModel):
    prompt: str
