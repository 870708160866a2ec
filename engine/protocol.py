"""OpenAI-compatible request and response models for the engine's HTTP API (pydantic v2).

Requests follow the OpenAI API reference (https://platform.openai.com/docs/api-reference)
for ``/v1/completions`` (the legacy completions API) and ``/v1/chat/completions``.
Validation policy, chosen where OpenAI and vLLM are loose (field cases F15, F16, F17):

* **Strict types, no coercion.** ``"max_tokens": "20"`` is a 400 (strings are never coerced
  to numbers, numbers never to booleans). An integer field also accepts a JSON number with an
  integral value (``1e12``, ``20.0``), because JSON does not tell the two apart; ``20.5``,
  NaN and infinities are a 400.
* **max_tokens >= 1.** ``0`` and negative values are a 400 naming ``max_tokens`` — also with
  ``echo`` and ``logprobs`` (F15: the "echo the prompt with its logprobs" reading of
  ``max_tokens: 0`` is refused rather than faked; ask for ``prompt_logprobs`` with
  ``max_tokens: 1`` instead, as vLLM clients do).
* **prompt_logprobs** (vLLM's extension, ``/v1/completions`` only): an integer 0..
  ``max_logprobs`` (the legacy ``logprobs`` limit, 5) or null; ``choices[i].prompt_logprobs``
  is then ``null`` for the first prompt token and, for each later one, ``{"<token id>":
  {"logprob", "rank", "decoded_token"}}`` holding the actual token and that many top
  alternatives. Not with ``stream: true`` (400; vLLM refuses it too), and a 400 on chat
  completions (silently dropping it would change the answer).
  The upper bound ``max_model_len - prompt tokens`` needs the tokenized prompt and is checked
  by the server (:func:`check_max_tokens`), with both numbers in the message.
* **Empty prompts are a 400** (F17): ``""``, ``[""]``, ``[]``, ``[[]]`` and chat
  ``"messages": []`` (or messages whose text is all empty). The engine never sees them.
* **n must be 1** (and ``best_of`` 1 or null): one choice per prompt. A batch of prompts
  (``prompt`` as a list of strings or a list of token-id lists) is supported, up to
  ``ProtocolLimits.max_batch_prompts``; choice ``index`` is the prompt's position.
* **Unknown fields are ignored**, except those whose silent loss would change the answer:
  ``suffix``, non-empty ``logit_bias``, ``best_of`` other than 1,
  ``tools``/``functions``/``tool_choice`` (other than "none"), ``response_format`` other
  than text, and non-text content parts are a 400 saying they are not supported. Ignored on
  purpose: ``user``, ``metadata``, ``store``, ``service_tier``, ``parallel_tool_calls``,
  ``stream_options`` fields other than ``include_usage``. Admin bodies are the exception:
  they refuse unknown fields (a misspelt ``model`` would otherwise retarget the call).
* **Valid Unicode only** (:func:`check_valid_unicode`): a string holding an unpaired
  surrogate (``"\\ud800"``, legal JSON spelling, not Unicode) is a 400 naming its path.
* **Size limits** (:class:`ProtocolLimits`, all configuration): at most
  ``max_stop_sequences`` stop strings of at most ``max_stop_chars`` characters each.
  Body size (413) and prompt length against ``max_model_len`` are checked by the server.

Every client error becomes :class:`APIError`, rendered as the OpenAI error object
``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``.

Chat template (:func:`render_chat_prompt`): the tiny story models (stories260K, the demo
model) were trained on plain text with no roles, so the ``"plain"`` template renders a
conversation as the text of its messages in order (system, user, assistant alike), joined
with a newline, with no role markers; a single user message ``"Once upon a time"`` becomes
exactly the prompt ``"Once upon a time"``, so chat and completions agree for greedy decoding.
The ``"roles"`` template (``"System: …\\nUser: …\\nAssistant:"``) is available for models
that know turns; the server takes the template name as configuration.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

# ---------------------------------------------------------------------------------------------
# Errors


class APIError(Exception):
    """A request failure rendered as an OpenAI error object.

    Attributes: ``status`` (HTTP status), ``message``, ``param`` (the offending field, dotted
    for nested fields, or None), ``code`` (a short machine-readable reason or None),
    ``err_type`` (the OpenAI ``type``; ``invalid_request_error`` for every 4xx),
    ``headers`` (extra response headers such as ``Retry-After``).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, err_type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param
        self.code = code
        if err_type is None:
            err_type = "invalid_request_error" if 400 <= self.status < 500 else "server_error"
        self.err_type = err_type
        self.headers = dict(headers or {})

    def body(self) -> dict:
        """The OpenAI error document: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.err_type,
                          "param": self.param, "code": self.code}}


def loc_to_param(loc: tuple) -> str | None:
    """Pydantic error location → OpenAI ``param``: ``("messages", 0, "content")`` →
    ``"messages[0].content"``; an empty location → None."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validation_error_to_api_error(errors: list[dict]) -> APIError:
    """Turn pydantic/FastAPI validation errors (``ValidationError.errors()``) into one 400.

    The first error names ``param`` and ``code`` (the pydantic error type); the message lists
    every error as ``"<param>: <reason> (got <value>)"``.
    """
    if not errors:
        return APIError(400, "invalid request", code="invalid_request")
    parts = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if loc and loc[0] == "body":  # FastAPI prefixes body fields with "body"
            loc = loc[1:]
        param = loc_to_param(loc)
        msg = str(err.get("msg", "invalid value"))
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        text = f"{param}: {msg}" if param else msg
        if ("input" in err and err.get("type") not in ("missing", "json_invalid", "extra_forbidden") and param
                and "got" not in msg):
            text += f" (got {_short(err['input'])})"
        parts.append(text)
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    if loc and loc[0] == "body":
        loc = loc[1:]
    return APIError(400, "; ".join(parts), param=loc_to_param(loc), code=str(first.get("type") or "invalid_value"))


def _surrogate_at(text: str) -> int | None:
    """Index of the first unpaired UTF-16 surrogate in ``text`` (None when it is valid Unicode)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def check_valid_unicode(obj: Any) -> None:
    """Raise APIError 400 (``code="invalid_unicode"``) when a string in a parsed JSON body holds
    an unpaired UTF-16 surrogate.

    JSON text may spell one (``"\\ud800"``; RFC 8259 section 8.2 leaves its meaning
    unpredictable) and ``json.loads`` accepts it, but such a string is not Unicode text: it
    cannot be encoded as UTF-8, so echoing it back, or giving it to a Rust tokenizer, fails
    deep inside the server. ``param`` is the path of the first offending string (document
    order), or of the object holding an offending key. O(size of the body): one C-speed
    encode of the whole document, and a path-tracking walk only when that fails.
    """
    try:
        json.dumps(obj, ensure_ascii=False, check_circular=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    except (TypeError, ValueError, RecursionError):
        pass  # not a plain JSON document (NaN, odd types): walk it
    stack: list[tuple[Any, tuple]] = [(obj, ())]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, str):
            at = _surrogate_at(value)
            if at is not None:
                param = loc_to_param(loc)
                where = param or "the request body"
                raise APIError(400, f"{where}: the string holds an unpaired UTF-16 surrogate "
                                    f"({value[at]!r}) at character {at}; strings must be valid Unicode",
                               param=param, code="invalid_unicode")
        elif isinstance(value, dict):
            for key in value:
                if _surrogate_at(key) is not None:
                    param = loc_to_param(loc)
                    where = param or "the request body"
                    raise APIError(400, f"{where}: an object key holds an unpaired UTF-16 surrogate; "
                                        "strings must be valid Unicode", param=param, code="invalid_unicode")
            stack.extend((v, loc + (k,)) for k, v in reversed(list(value.items()))
                         if isinstance(v, (str, dict, list)))
        elif isinstance(value, list):
            stack.extend((v, loc + (i,)) for i, v in reversed(list(enumerate(value)))
                         if isinstance(v, (str, dict, list)))


def validate_model(cls: type[BaseModel], obj: Any, limits: "ProtocolLimits | None" = None) -> Any:
    """``cls.model_validate(obj)`` with the limits as validation context; errors → APIError 400."""
    if not isinstance(obj, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(obj).__name__}",
                       code="invalid_type")
    try:
        return cls.model_validate(obj, context={"limits": limits or ProtocolLimits()})
    except ValidationError as exc:
        raise validation_error_to_api_error(exc.errors(include_url=False)) from None


# ---------------------------------------------------------------------------------------------
# Limits


@dataclass(frozen=True)
class ProtocolLimits:
    """Request-shape limits (configuration, not constants of the protocol).

    ``max_stop_sequences`` stop strings of at most ``max_stop_chars`` characters (vLLM has
    no limit; OpenAI allows 4 — 16 keeps the per-step stop scan cheap), at most
    ``max_batch_prompts`` prompts in one completions request, ``max_logprobs`` top
    alternatives for the legacy ``logprobs`` field (OpenAI: 5) and ``max_top_logprobs`` for
    chat ``top_logprobs`` (OpenAI: 20).
    """

    max_stop_sequences: int = 16
    max_stop_chars: int = 256
    max_batch_prompts: int = 16
    max_logprobs: int = 5
    max_top_logprobs: int = 20


def _limits(info: Any) -> ProtocolLimits:
    ctx = getattr(info, "context", None) or {}
    return ctx.get("limits") or ProtocolLimits()


# ---------------------------------------------------------------------------------------------
# Strict scalar types


def _strict_int(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("int_type", "must be an integer, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        raise PydanticCustomError("int_type", "must be an integer")
    if isinstance(value, str):
        raise PydanticCustomError("int_type", "must be an integer, not a string (strings are not coerced)")
    raise PydanticCustomError("int_type", "must be an integer")


#: An integer: JSON integers, or JSON numbers with an integral value (1e12); never strings or booleans.
JsonInt = Annotated[int, BeforeValidator(_strict_int)]


def _strict_number(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("float_type", "must be a number, not a boolean")
    if isinstance(value, str):
        raise PydanticCustomError("float_type", "must be a number, not a string (strings are not coerced)")
    return value


#: A finite number (int or float); never strings or booleans.
JsonFloat = Annotated[float, BeforeValidator(_strict_number)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


# ---------------------------------------------------------------------------------------------
# Shared validation helpers


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
    n: JsonInt | None = 1
    stream: bool | None = False
    stop: Any = None
    seed: JsonInt | None = None
    repetition_penalty: JsonFloat | None = Field(default=None, gt=0.0)
    presence_penalty: JsonFloat | None = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: JsonFloat | None = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, Any] | None = None
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
            raise PydanticCustomError("out_of_range", "must be greater than or equal to {lo} and less than or equal to {hi} "
                                      "(a 64-bit seed), got {n}",
                                      {"lo": SEED_MIN, "hi": SEED_MAX, "n": value})
        return value

    @field_validator("n")
    @classmethod
    def _v_n(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise PydanticCustomError("unsupported_n", "only n=1 is supported (one choice per prompt), got {n}",
                                      {"n": value})
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

    prompt: Any = Field(default=None, validate_default=True)
    echo: bool | None = False
    logprobs: JsonInt | None = Field(default=None, ge=0)
    prompt_logprobs: JsonInt | None = Field(default=None, ge=0)
    suffix: str | None = None
    best_of: JsonInt | None = None

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

    @field_validator("best_of")
    @classmethod
    def _v_best_of(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise PydanticCustomError("unsupported_parameter", "only best_of=1 is supported, got {n}", {"n": value})
        return value

    def prompts(self) -> list[str] | list[list[int]]:
        """The normalized prompts: a list of texts or a list of token-id lists (never empty)."""
        return self.prompt


def normalize_prompt(value: Any, limits: ProtocolLimits) -> list[str] | list[list[int]]:
    """Normalize the completions ``prompt`` field (F17 policy: empty prompts are refused).

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
    content: Any = None
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

    messages: list[ChatMessage]
    max_completion_tokens: JsonInt | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: JsonInt | None = Field(default=None, ge=0)
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    prompt_logprobs: Any = None

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


CHAT_TEMPLATES = ("plain", "roles")


def render_chat_prompt(messages: list[ChatMessage], template: str = "plain") -> str:
    """Render chat messages into one prompt string.

    ``"plain"`` (default, for the plain-text story models): the non-empty message texts in
    order joined by ``"\\n"``, no role markers. ``"roles"``: ``"System: …\\nUser: …\\n
    Assistant: …\\nAssistant:"`` — each message on its own line prefixed by its role, ending
    with an open assistant turn. Raises ValueError for an unknown template name.
    """
    if template == "plain":
        return "\n".join(m.text() for m in messages if m.text() != "")
    if template == "roles":
        names = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
        lines = [f"{names[m.role]}: {m.text()}" for m in messages]
        return "\n".join(lines + ["Assistant:"])
    raise ValueError(f"unknown chat template {template!r}; known: {', '.join(CHAT_TEMPLATES)}")


# ---------------------------------------------------------------------------------------------
# /tokenize and /detokenize (vLLM's tokenizer API)


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
    included) are a 400 naming ``tokens[i]``, checked by :func:`check_token_ids` (the server
    knows the vocabulary)."""

    model: str | None = None
    tokens: list[JsonInt]


def check_token_ids(ids: list[int], vocab_size: int, *, param: str = "tokens") -> None:
    """Raise APIError 400 naming ``param[i]`` for the first id outside ``[0, vocab_size)``."""
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise APIError(400, f"{param}[{i}]: token id {t} is out of range; the vocabulary has "
                                f"{vocab_size} tokens (ids 0..{vocab_size - 1})",
                           param=f"{param}[{i}]", code="invalid_token_id")


class DetokenizeResponse(BaseModel):
    prompt: str


# ---------------------------------------------------------------------------------------------
# Server-side checks that need the tokenized prompt


def check_prompt_length(prompt_len: int, max_model_len: int, *, param: str = "prompt") -> None:
    """Raise APIError 400 when a prompt leaves no room for one generated token.

    ``prompt_len`` and ``max_model_len`` in tokens; the limit is ``max_model_len - 1``.
    """
    if prompt_len >= max_model_len:
        raise APIError(
            400, f"{param}: the prompt is {prompt_len} tokens; max_model_len is {max_model_len}, so a prompt "
                 f"may have at most {max_model_len - 1} tokens (one must be left to generate)",
            param=param, code="context_length_exceeded")


def check_max_tokens(max_tokens: int | None, prompt_len: int, max_model_len: int, *,
                     param: str = "max_tokens") -> None:
    """Raise APIError 400 when ``max_tokens > max_model_len - prompt_len`` (F14, F16).

    The message names the field, the value, and the bound with its parts.
    """
    if max_tokens is None:
        return
    room = max_model_len - prompt_len
    if max_tokens > room:
        raise APIError(
            400, f"{param}: {max_tokens} is more than the limit {room} = max_model_len {max_model_len} - "
                 f"prompt {prompt_len} tokens (prompt + {param} = {prompt_len + max_tokens} > {max_model_len})",
            param=param, code="context_length_exceeded")


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


def new_id(prefix: str) -> str:
    """A response id: ``<prefix>-<32 hex digits>`` (e.g. ``cmpl-…``, ``chatcmpl-…``)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    """Unix time in whole seconds (the ``created`` field)."""
    return int(time.time())


# pydantic needs the forward reference resolved
_SamplingFields.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()


# ---------------------------------------------------------------------------------------------
# Admin API bodies (docs/architecture.md, "Engine admin API")


class _StrictAdmin(_Strict):
    """Admin bodies refuse unknown fields: an admin call changes the engine, and a misspelt
    field silently dropped would change it differently (``{"mode": "int8", "modle": "light"}``
    would switch *every* model; ``{"kind": "oom", "cnt": 5}`` would inject one fault)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class AdminPrecisionRequest(_StrictAdmin):
    """``POST /admin/precision``: ``mode`` full|int8; ``model`` None = every served model."""

    mode: Literal["full", "int8"]
    model: str | None = None


class AdminFaultRequest(_StrictAdmin):
    """``POST /admin/fault``: make the next ``count`` steps run out of memory for real."""

    kind: str = "oom"
    count: JsonInt = Field(default=1, ge=1, le=1000)
    model: str | None = None


class AdminDrainRequest(_StrictAdmin):
    """``POST /admin/drain``: stop (true) or resume (false) admitting; ``model`` None = all."""

    draining: bool = True
    model: str | None = None


class AdminRouteRequest(_StrictAdmin):
    """``POST /admin/route``: send requests for ``model`` to ``to``; ``to`` null clears."""

    model: str
    to: str | None = None
