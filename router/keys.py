"""Request keys: the prompt-prefix affinity key and the request id.

* :func:`affinity_prefix` — the first N characters of what the replica will prefill first:
  the completions prompt (the first prompt of a batch; token-id prompts as their first
  ``N // 4`` ids, about 4 characters a token), or the chat messages rendered as
  ``role\\x1etext\\x1f`` in order (system prompt and first turns first, so every turn of a
  conversation sharing them hashes the same). Too short (< ``min_chars``) → None: such a
  prompt has little cache worth keeping and goes to the least-loaded replica.
* :func:`request_id` — the client's ``X-Request-Id`` when it is 1..200 visible ASCII
  characters (the engine echoes ids up to 200 characters), else a new ``uuid4`` hex.
"""

from __future__ import annotations

from typing import Any

from inferctl.contract.http import MAX_REQUEST_ID_CHARS, request_id  # noqa: F401 - one rule for router and engine
from inferctl.contract.openai import ChatCompletionRequest, CompletionRequest


def affinity_prefix(req: Any, chars: int, min_chars: int) -> str | None:
    """The affinity key of a validated request (module docstring), at most ``chars`` characters;
    None when shorter than ``min_chars`` or of another type."""
    text = ""
    if isinstance(req, CompletionRequest):
        first = req.prompts()[0]
        if isinstance(first, str):
            text = first[:chars]
        else:
            text = "ids:" + ",".join(str(t) for t in first[: max(1, chars // 4)])
    elif isinstance(req, ChatCompletionRequest):
        parts: list[str] = []
        size = 0
        for message in req.messages:
            part = f"{message.role}\x1e{message.text()}\x1f"
            parts.append(part)
            size += len(part)
            if size >= chars:
                break
        text = "".join(parts)[:chars]
    else:
        return None
    return text if len(text) >= max(1, min_chars) else None


