"""Logprobs in the OpenAI/vLLM JSON shapes, with each token's text from the tokenizer.

Logprobs are natural logs as the engine computes them; non-finite values are left as they
are here and become ``null`` when the document is dumped (:func:`inferctl.engine.entrypoints.sse.dumps`).
A token whose text cannot be rendered is shown as ``<id>``.
"""

from __future__ import annotations

from inferctl.engine.entrypoints.state import Tokenizer


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """The token's text (its bytes as UTF-8, invalid bytes replaced); ``<id>`` if unknown."""
    try:
        return tokenizer.token_bytes(int(token_id)).decode("utf-8", errors="replace")
    except Exception:  # noqa: BLE001 - a piece we cannot render is shown by its id
        return f"<{token_id}>"


def token_bytes(tokenizer: Tokenizer, token_id: int) -> list[int] | None:
    """The token's bytes as a list of ints (the chat ``bytes`` field); None if unknown."""
    try:
        return list(tokenizer.token_bytes(int(token_id)))
    except Exception:  # noqa: BLE001
        return None


def completion_logprobs(tokenizer: Tokenizer, token_ids: list[int], lps: list, tops: list, offset: int) -> dict:
    """Legacy completions ``logprobs``: ``{"tokens", "token_logprobs", "top_logprobs",
    "text_offset"}``, parallel lists over ``token_ids``; ``text_offset`` counts characters
    from ``offset`` (the echoed prompt's length, or what was already streamed)."""
    tokens = [token_text(tokenizer, t) for t in token_ids]
    offsets = []
    pos = offset
    for text in tokens:
        offsets.append(pos)
        pos += len(text)
    top_out = []
    for top in tops:
        if top is None:
            top_out.append(None)
        else:
            top_out.append({token_text(tokenizer, int(k)): v for k, v in dict(top).items()})
    return {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": top_out, "text_offset": offsets}


def prompt_logprobs_json(tokenizer: Tokenizer, entries: list | None) -> list | None:
    """The engine's prompt logprobs (``[None, {id: Logprob(logprob, rank)}, ...]``) in vLLM's
    JSON shape: ``[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]`` (non-finite
    logprobs become null when the document is dumped)."""
    if entries is None:
        return None
    texts: dict[int, str] = {}
    out: list = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        doc = {}
        for tid, (logprob, rank) in entry.items():
            text = texts.get(tid)
            if text is None:
                text = texts[tid] = token_text(tokenizer, tid)
            doc[str(tid)] = {"logprob": logprob, "rank": rank, "decoded_token": text}
        out.append(doc)
    return out


def chat_logprobs(tokenizer: Tokenizer, token_ids: list[int], lps: list, tops: list) -> dict:
    """Chat ``logprobs``: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``."""
    content = []
    for i, tid in enumerate(token_ids):
        top = tops[i] if i < len(tops) else None
        content.append({
            "token": token_text(tokenizer, tid),
            "logprob": lps[i] if i < len(lps) else None,
            "bytes": token_bytes(tokenizer, tid),
            "top_logprobs": [{"token": token_text(tokenizer, int(k)), "logprob": v,
                              "bytes": token_bytes(tokenizer, int(k))} for k, v in dict(top or {}).items()],
        })
    return {"content": content}
