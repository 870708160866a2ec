"""OpenAI-compatible request and response models of the engine's HTTP API (pydantic v2).

The engine validates with these models and so will a router in front of it: one schema.
Requests follow the OpenAI API reference (https://platform.openai.com/docs/api-reference)
for ``/v1/completions`` (the legacy completions API) and ``/v1/chat/completions``.
Validation policy, chosen where OpenAI and vLLM are loose (docs/field-cases.md):

* **Strict types, no coercion** (:mod:`inferctl.contract.jsontypes`). ``"max_tokens": "20"``
  is a 400 (strings are never coerced to numbers, numbers never to booleans). An integer
  field also accepts a JSON number with an integral value (``1e12``, ``20.0``), because JSON
  does not tell the two apart; ``20.5``, NaN and infinities are a 400.
* **max_tokens >= 1.** ``0`` and negative values are a 400 naming ``max_tokens`` — also with
  ``echo`` and ``logprobs`` (the "echo the prompt with its logprobs" reading of
  ``max_tokens: 0`` is refused rather than faked; ask for ``prompt_logprobs`` with
  ``max_tokens: 1`` instead, as vLLM clients do).
* **prompt_logprobs** (vLLM's extension, ``/v1/completions`` only): an integer 0..
  ``max_logprobs`` (the legacy ``logprobs`` limit, 5) or null; ``choices[i].prompt_logprobs``
  is then ``null`` for the first prompt token and, for each later one, ``{"<token id>":
  {"logprob", "rank", "decoded_token"}}`` holding the actual token and that many top
  alternatives. Not with ``stream: true`` (400; vLLM refuses it too), and a 400 on chat
  completions (silently dropping it would change the answer).
  The upper bound ``max_model_len - prompt tokens`` needs the tokenized prompt and is checked
  by the engine, with both numbers in the message.
* **Empty prompts are a 400**: ``""``, ``[""]``, ``[]``, ``[[]]`` and chat
  ``"messages": []`` (or messages whose text is all empty). The engine never sees them.
* **n** 1..``max_n`` choices per prompt (``best_of`` 1 or null); a batch of up to
  ``max_batch_prompts`` prompts; choice ``index`` = prompt position × n + sample.
* **Unknown fields are ignored**, except those whose silent loss would change the answer:
  ``suffix``, non-empty ``logit_bias``, ``best_of`` other than 1,
  ``tools``/``functions``/``tool_choice`` (other than "none"), ``response_format`` other
  than text, and non-text content parts are a 400 saying they are not supported. Ignored on
  purpose: ``user``, ``metadata``, ``store``, ``service_tier``, ``parallel_tool_calls``,
  ``stream_options`` fields other than ``include_usage``. Admin bodies
  (:mod:`inferctl.contract.admin`) are the exception: they refuse unknown fields.
* **Valid Unicode only** (:func:`inferctl.contract.http.check_valid_unicode`, applied when the
  body is read): a string holding an unpaired surrogate is a 400 naming its path.
* **Size limits** (:class:`ProtocolLimits`, all configuration): at most
  ``max_stop_sequences`` stop strings of at most ``max_stop_chars`` characters each.
  Body size (413) and prompt length against ``max_model_len`` are checked by the engine.

Every client error becomes :class:`~inferctl.contract.errors.APIError` (the OpenAI error
object). The tokenizer routes' shapes are in :mod:`inferctl.contract.tokenize`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from inferctl.contract.errors import APIError, validation_error_to_api_error
from inferctl.contract import openapi as _doc
from inferctl.contract.jsontypes import JsonFloat, JsonInt, StrictModel as _Strict

# Limits and validation -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProtocolLimits:
    """Request-shape limits (configuration, not constants of the protocol).

    ``max_stop_sequences`` stop strings of at most ``max_stop_chars`` characters (vLLM has
    no limit; OpenAI allows 4 — 16 keeps the per-step stop scan cheap), at most
    ``max_batch_prompts`` prompts in one completions request, ``max_n`` choices each, ``max_logprobs`` top
    alternatives for the legacy ``logprobs`` field (OpenAI: 5) and ``max_top_logprobs`` for
    chat ``top_logprobs`` (OpenAI: 20).
    """

    max_stop_sequences: int = 16
    max_stop_chars: int = 256
    max_batch_prompts: int = 16
    max_logprobs: int = 5
    max_top_logprobs: int = 20
    max_n: int = 16


def max_prompt_chars(max_model_len: int, token_byte_lengths: Any) -> int:
    """The most characters a text prompt may have and still fit ``max_model_len`` tokens.

    ``token_byte_lengths``: the UTF-8 byte length of every vocabulary token (an iterable of
    ints). Every character is at least one UTF-8 byte and a token stands for its own bytes,
    so a token covers at most ``K = max(byte lengths)`` characters of the text and a text of
    ``n`` characters needs at least ``n / K`` tokens: above ``max_model_len × K`` characters
    it can never fit, and is refused before it is tokenized (bounded work: a 5 MB prompt is a
    400 in microseconds, not a 16 s tokenization). Exact for tokenizers that keep every input
    character (llama2.c, the byte tokenizer, SentencePiece and byte-level BPE
    ``tokenizer.json``); a normalizer that deletes characters (whitespace collapsing) could see
    a prompt refused that would fit. Returns at least ``max_model_len``.
    """
    longest = max((int(n) for n in token_byte_lengths), default=1)
    return int(max_model_len) * max(1, longest)


def check_prompt_chars(n_chars: int, limit: int | None, max_model_len: int, *, param: str = "prompt") -> None:
    """Raise APIError 400 (``context_length_exceeded``, ``param`` named) when a text of
    ``n_chars`` characters is above ``limit`` (:func:`max_prompt_chars`; None: no bound)."""
    if limit is not None and n_chars > limit:
        raise APIError(400, f"{param}: the prompt is {n_chars} characters; at most {limit} characters can fit "
                            f"max_model_len {max_model_len} tokens (the tokenizer's longest token is "
                            f"{max(1, limit // max(1, max_model_len))} characters), so it is refused before "
                            "tokenizing", param=param, code="context_length_exceeded")


def _limits(info: Any) -> ProtocolLimits:
    ctx = getattr(info, "context", None) or {}
    return ctx.get("limits") or ProtocolLimits()


def validate_model(cls: type[BaseModel], obj: Any, limits: ProtocolLimits | None = None) -> Any:
    """``cls.model_validate(obj)`` with the limits as validation context; errors → APIError 400."""
    if not isinstance(obj, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(obj).__name__}",
                       code="invalid_type")
    try:
        return cls.model_validate(obj, context={"limits": limits or ProtocolLimits()})
    except ValidationError as exc:
        raise validation_error_to_api_error(exc.errors(include_url=False)) from None


# Shared validation helpers -------------------------------------------------------------------


def _check_stop(value: Any, info: Any) -> list[str] | None:
    if value is None:
        return None
    limits = _limits(info)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise PydanticCustomError("stop_type", "must be a string or a list of strings")
    if len(items) > limits.max_stop_sequences:
        raise PydanticCustomError(
            "too_many_stop_sequences", "at most {limit} stop sequences are allowed, got {n}",
            {"limit": limits.max_stop_sequences, "n": len(items)})
    for s in items:
        if s == "":
            raise PydanticCustomError("empty_stop_sequence", "must not contain an empty string")
        if len(s) > limits.max_stop_chars:
            raise PydanticCustomError(
                "stop_too_long", "each stop sequence is at most {limit} characters, got {n}",
                {"limit": limits.max_stop_chars, "n": len(s)})
    return list(items)


#: The seed range torch.Generator.manual_seed accepts (a signed or unsigned 64-bit integer).
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1


class _SamplingFields(_Strict):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    max_tokens: JsonInt | None = Field(default=None, ge=1)
    temperature: JsonFloat | None = Field(default=None, ge=0.0, le=2.0)
    top_p: JsonFloat | None = Field(default=None, gt=0.0, le=1.0)
    top_k: JsonInt | None = Field(default=None, ge=-1)
    n: JsonInt | None = Field(default=1, json_schema_extra=_doc.N_CHOICES)
    best_of: JsonInt | None = Field(default=None, json_schema_extra=_doc.ONLY_ONE)   # chat too (vLLM)
    stream: bool | None = False
    stop: Any = Field(default=None, json_schema_extra=_doc.STOP_SCHEMA)
    seed: JsonInt | None = None
    repetition_penalty: JsonFloat | None = Field(default=None, gt=0.0)
    presence_penalty: JsonFloat | None = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: JsonFloat | None = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, Any] | None = Field(default=None, json_schema_extra=_doc.EMPTY_OBJECT)
    user: str | None = None
    ignore_eos: bool | None = False
    repetition_stop: bool | None = None
    stop_token_ids: list[JsonInt] | None = None
    stream_options: "StreamOptions | None" = None

    @field_validator("stop", mode="before")
    @classmethod
    def _v_stop(cls, value: Any, info: Any) -> Any:
        return _check_stop(value, info)

    @field_validator("seed")
    @classmethod
    def _v_seed(cls, value: int | None) -> int | None:
        # the bound is checked here rather than with Field(ge, le): pydantic renders those
        # limits as floats ("less than or equal to 18446744073709552000"), a wrong number
        if value is not None and not SEED_MIN <= value <= SEED_MAX:
            raise PydanticCustomError("out_of_range", "must be greater than or equal to {lo} and less than "
                                      "or equal to {hi} (a 64-bit seed), got {n}",
                                      {"lo": SEED_MIN, "hi": SEED_MAX, "n": value})
        return value

    @field_validator("best_of")
    @classmethod
    def _v_best_of(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise PydanticCustomError("unsupported_parameter", "only best_of=1 is supported, got {n}", {"n": value})
        return value

    @field_validator("n")
    @classmethod
    def _v_n(cls, value: int | None, info: Any) -> int | None:
        limit = _limits(info).max_n
        if value is not None and not 1 <= value <= limit:
            raise PydanticCustomError("out_of_range", "must be between 1 and {limit} (choices per prompt), got {n}",
                                      {"limit": limit, "n": value})
        return value

    @field_validator("logit_bias")
    @classmethod
    def _v_logit_bias(cls, value: dict | None) -> dict | None:
        if value:
            raise PydanticCustomError("unsupported_parameter", "logit_bias is not supported by this engine")
        return value

    @field_validator("stream_options")
    @classmethod
    def _v_stream_options(cls, value: Any, info: Any) -> Any:
        if value is not None and not info.data.get("stream"):
            raise PydanticCustomError("invalid_stream_options", "is only allowed with stream=true")
        return value

    def stop_list(self) -> list[str]:
        """The stop strings as a list (empty when none)."""
        return list(self.stop or [])


class StreamOptions(_Strict):
    """``stream_options``: only ``include_usage`` is read (a final chunk with ``usage``)."""

    include_usage: bool | None = False


# ---------------------------------------------------------------------------------------------
# /v1/completions


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``.

    ``prompt`` is normalized by validation to ``list[str]`` (texts) or ``list[list[int]]``
    (token ids); see :meth:`prompts`. ``logprobs`` is the legacy integer (0..5): the number
    of top alternatives per generated token (0 = only the chosen token's logprob).
    """

    prompt: Any = Field(default=None, validate_default=True, json_schema_extra=_doc.PROMPT_SCHEMA)
    echo: bool | None = False
    logprobs: JsonInt | None = Field(default=None, ge=0)
    prompt_logprobs: JsonInt | None = Field(default=None, ge=0)
    suffix: str | None = Field(default=None, json_schema_extra=_doc.EMPTY_STRING)

    @field_validator("prompt", mode="before")
    @classmethod
    def _v_prompt(cls, value: Any, info: Any) -> Any:
        return normalize_prompt(value, _limits(info))

    @field_validator("logprobs")
    @classmethod
    def _v_logprobs(cls, value: int | None, info: Any) -> int | None:
        limit = _limits(info).max_logprobs
        if value is not None and value > limit:
            raise PydanticCustomError("out_of_range", "must be between 0 and {limit}, got {n}",
                                      {"limit": limit, "n": value})
        return value

    @field_validator("prompt_logprobs")
    @classmethod
    def _v_prompt_logprobs(cls, value: int | None, info: Any) -> int | None:
        if value is None:
            return value
        limit = _limits(info).max_logprobs
        if value > limit:
            raise PydanticCustomError("out_of_range", "must be between 0 and {limit}, got {n}",
                                      {"limit": limit, "n": value})
        if info.data.get("stream"):
            raise PydanticCustomError("unsupported_parameter", "is not supported with stream; send the request "
                                      "without stream (the answer holds them all)")
        return value

    @field_validator("suffix")
    @classmethod
    def _v_suffix(cls, value: str | None) -> str | None:
        if value:
            raise PydanticCustomError("unsupported_parameter", "suffix (insertion) is not supported by this engine")
        return value

    def prompts(self) -> list[str] | list[list[int]]:
        """The normalized prompts: a list of texts or a list of token-id lists (never empty)."""
        return self.prompt


def normalize_prompt(value: Any, limits: ProtocolLimits) -> list[str] | list[list[int]]:
    """Normalize the completions ``prompt`` field (empty prompts are refused).

    Accepts a string, a list of strings (batch), a list of token ids, or a list of token-id
    lists (batch). Returns ``list[str]`` or ``list[list[int]]`` with 1..max_batch_prompts
    entries. Raises PydanticCustomError (→ 400 naming ``prompt``) for a missing, empty or
    mixed-type prompt or too many prompts. Token ids are range-checked by the server against
    the model's vocabulary.
    """
    if value is None:
        raise PydanticCustomError("missing", "is required")
    if isinstance(value, str):
        if value == "":
            raise PydanticCustomError("empty_prompt", "must not be empty")
        return [value]
    if not isinstance(value, list):
        raise PydanticCustomError("prompt_type", "must be a string, a list of strings, a list of token ids "
                                                 "or a list of token-id lists")
    if len(value) == 0:
        raise PydanticCustomError("empty_prompt", "must not be an empty list")
    if all(isinstance(x, str) for x in value):
        batch: list = list(value)
        for i, text in enumerate(batch):
            if text == "":
                raise PydanticCustomError("empty_prompt", "element {i} must not be an empty string", {"i": i})
    elif all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        batch = [list(value)]
    elif all(isinstance(x, list) for x in value):
        batch = []
        for i, ids in enumerate(value):
            if not ids:
                raise PydanticCustomError("empty_prompt", "element {i} must not be an empty token list", {"i": i})
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise PydanticCustomError("prompt_type", "element {i} must be a list of integer token ids", {"i": i})
            batch.append(list(ids))
    else:
        raise PydanticCustomError("prompt_type", "must be a string, a list of strings, a list of token ids "
                                                 "or a list of token-id lists (no mixing)")
    if len(batch) > limits.max_batch_prompts:
        raise PydanticCustomError("too_many_prompts", "at most {limit} prompts per request, got {n}",
                                  {"limit": limits.max_batch_prompts, "n": len(batch)})
    for ids in batch:
        if isinstance(ids, list):
            for t in ids:
                if t < 0:
                    raise PydanticCustomError("invalid_token_id", "token ids must be >= 0, got {t}", {"t": t})
    return batch


# ---------------------------------------------------------------------------------------------
# /v1/chat/completions


class ContentPart(_Strict):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is supported."""

    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _v_part(self) -> Any:
        if self.type != "text":
            raise PydanticCustomError("unsupported_content", "content parts of type {t} are not supported "
                                                             "(text only)", {"t": self.type})
        if self.text is None:
            raise PydanticCustomError("missing", "a text content part needs a 'text' string")
        return self


class ChatMessage(_Strict):
    """A chat message: ``role`` ∈ system, developer (= system), user, assistant; ``content``
    a string or a list of text parts. ``name`` is accepted and ignored."""

    role: Literal["system", "developer", "user", "assistant"]
    content: Any = Field(default=None, json_schema_extra=_doc.CONTENT_SCHEMA)
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _v_content(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise PydanticCustomError("content_type", "must be a string or a list of text parts")
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict):
                raise PydanticCustomError("content_type", "part {i} must be an object like "
                                                          '{"type": "text", "text": "..."}', {"i": i})
            if part.get("type") != "text":
                raise PydanticCustomError("unsupported_content", "part {i}: content parts of type {t} are not "
                                          "supported (text only)", {"i": i, "t": part.get("type")})
            if not isinstance(part.get("text"), str):
                raise PydanticCustomError("content_type", "part {i}: a text part needs a 'text' string", {"i": i})
            parts.append(ContentPart(type="text", text=part["text"]))
        return parts

    def text(self) -> str:
        """The message text (text parts concatenated)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``.

    ``max_completion_tokens`` (the newer name) wins over ``max_tokens`` when both are given.
    ``logprobs`` is a boolean; ``top_logprobs`` (0..20) needs ``logprobs: true``.
    ``prompt_logprobs`` is refused (400): it is served on ``/v1/completions`` only.
    """

    messages: list[ChatMessage] = Field(json_schema_extra=_doc.NON_EMPTY)
    max_completion_tokens: JsonInt | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: JsonInt | None = Field(default=None, ge=0)
    tools: list[Any] | None = Field(default=None, json_schema_extra=_doc.EMPTY_LIST)
    functions: list[Any] | None = Field(default=None, json_schema_extra=_doc.EMPTY_LIST)
    tool_choice: Any = Field(default=None, json_schema_extra=_doc.NONE_CHOICE)
    response_format: dict[str, Any] | None = Field(default=None, json_schema_extra=_doc.TEXT_FORMAT)
    prompt_logprobs: Any = Field(default=None, json_schema_extra=_doc.ONLY_NULL)

    @field_validator("prompt_logprobs")
    @classmethod
    def _v_prompt_logprobs(cls, value: Any) -> Any:
        if value is not None:
            raise PydanticCustomError("unsupported_parameter", "is only supported on /v1/completions "
                                      "(send the rendered prompt there)")
        return value

    @field_validator("messages")
    @classmethod
    def _v_messages(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise PydanticCustomError("empty_messages", "must contain at least one message")
        if all(m.text() == "" for m in value):
            raise PydanticCustomError("empty_prompt", "must contain some text (all messages are empty)")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _v_top_logprobs(cls, value: int | None, info: Any) -> int | None:
        limit = _limits(info).max_top_logprobs
        if value is not None and value > limit:
            raise PydanticCustomError("out_of_range", "must be between 0 and {limit}, got {n}",
                                      {"limit": limit, "n": value})
        if value and not info.data.get("logprobs"):
            raise PydanticCustomError("invalid_top_logprobs", "top_logprobs needs logprobs: true")
        return value

    @field_validator("tools", "functions")
    @classmethod
    def _v_tools(cls, value: list | None) -> list | None:
        if value:
            raise PydanticCustomError("unsupported_parameter", "tools and functions are not supported by this engine")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _v_tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none"):
            raise PydanticCustomError("unsupported_parameter", "tool_choice is not supported by this engine")
        return value

    @field_validator("response_format")
    @classmethod
    def _v_response_format(cls, value: dict | None) -> dict | None:
        if value is not None and value.get("type") not in ("text", None):
            raise PydanticCustomError("unsupported_parameter", "response_format type {t} is not supported (text only)",
                                      {"t": value.get("type")})
        return value

    def effective_max_tokens(self) -> int | None:
        """``max_completion_tokens`` if given, else ``max_tokens`` (None: fill the context)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def max_tokens_param(self) -> str:
        """The name of the field that set the limit (for error messages)."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


# ---------------------------------------------------------------------------------------------
# Responses: the schema of record for what the server sends (the server builds plain dicts on
# the hot path; tests validate its documents against these models).


class UsageInfo(BaseModel):
    """Token counts of a request (``total_tokens = prompt_tokens + completion_tokens``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    """Legacy completions logprobs: parallel lists over tokens; ``top_logprobs`` maps token
    text to logprob (None entries: no data, e.g. a non-finite value)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float | None] | None] | None = None
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """One token of a ``prompt_logprobs`` entry (vLLM's shape): natural-log ``logprob`` (None
    when non-finite), 1-based ``rank`` in the vocabulary, and the token's text."""

    logprob: float | None
    rank: int
    decoded_token: str


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None


class CompletionResponse(BaseModel):
    """``object: "text_completion"`` (also the object of each streamed chunk)."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float | None
    bytes: list[int] | None = None


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float | None
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None


class ChatDelta(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "inferctl"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


# pydantic needs the forward reference resolved
_SamplingFields.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()
