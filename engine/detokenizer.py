"""Incremental detokenization with stop strings that never leak.

Two layers, fed one token at a time:

1. Decoding (vLLM's ``detokenize_incrementally``, prefix_offset / read_offset): the text of
   the new token is ``decode(ids[prefix_offset:]) - decode(ids[prefix_offset:read_offset])``,
   a window of a few recent ids, so each token costs O(window) and not O(output length), and
   tokenizers that strip the first piece's leading space (SentencePiece) still give the
   right spaces (the window starts with earlier ids; the first output token gets up to
   ``context_tokens`` prompt ids as context, like vLLM's 5). When the window's text ends in
   U+FFFD the last token ended inside a UTF-8 sequence (byte-fallback tokens): nothing is
   released until the character completes, so a character is never emitted half. A window
   that stays incomplete for ``max_pending_tokens`` tokens (invalid bytes from the model) is
   released except its last 3 tokens (a UTF-8 character has at most 4 bytes), so the
   window, and the cost per token, stay bounded.
   One ``decode`` per token, not two: after a clean step the window's start stays put and the
   text just decoded is the next step's prefix text (the tokenizers' decode concatenates
   per-id bytes, so a prefix that ends on a character boundary decodes to a prefix of the
   longer window); the window is moved up to the last commit point (one extra decode) once it
   spans more than ``_WINDOW`` ids, and after a forced release, so a token still costs O(window).

2. Stop strings: released text is held back while its end could be the start of a stop
   string (exactly the longest suffix that is a prefix of some stop string, so at most
   ``max(len(stop)) - 1`` characters). When a stop string appears, the text before it is
   released and nothing after it, ever. If several stop strings appear in the same new
   text, the one that *ends* first wins: the result is what character-by-character
   streaming would give, independent of how the text was split into tokens.

The caller (engine) should not feed EOS or stop token ids; a stop token id ends the request
and, as in vLLM, its text is not part of the output.
"""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"
#: A UTF-8 character has at most 4 bytes, so at most 3 byte tokens can be its incomplete head.
_MAX_PARTIAL_TOKENS = 3
#: Ids the decode window may span before its start moves up (bounds the cost of a decode).
_WINDOW = 8


class Decoder(Protocol):
    """What the detokenizer needs from a tokenizer (``engine.tokenizer``)."""

    def decode(self, ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    """Turns generated token ids into text deltas, holding back partial characters and
    possible stop-string prefixes.

    Args:
        tokenizer: anything with ``decode(ids: list[int]) -> str`` that decodes a full id
            list (skipping BOS; byte tokens UTF-8 decoded with errors="replace").
        stop: stop strings (each non-empty; validated by ``SamplingParams``).
        prompt_ids: the prompt's token ids; its last ``context_tokens`` give the first
            output token its leading space right. None = decode the output on its own.
        context_tokens: prompt ids used as context (default 5, as vLLM).
        max_pending_tokens: tokens a never-completing UTF-8 sequence may hold back before it
            is released as U+FFFD (default 8; must be > 3).

    Attributes:
        text: all text released so far (a property).
        stopped: True once a stop string was found.
        stop_reason: the stop string that ended the output, or None.

    Raises:
        ValueError: a stop string is empty or not a string; bad ``context_tokens`` /
            ``max_pending_tokens``.
    """

    def __init__(self, tokenizer: Decoder, stop: list[str] | None = None,
                 prompt_ids: list[int] | None = None, context_tokens: int = 5,
                 max_pending_tokens: int = 8):
        stops = list(stop or [])
        for i, s in enumerate(stops):
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop[{i}] must be a non-empty string, got {s!r}")
        if context_tokens < 0:
            raise ValueError(f"context_tokens must be >= 0, got {context_tokens}")
        if max_pending_tokens <= _MAX_PARTIAL_TOKENS:
            raise ValueError(
                f"max_pending_tokens must be > {_MAX_PARTIAL_TOKENS}, got {max_pending_tokens}")
        self._tok = tokenizer
        self._stops = stops
        self._max_pending = max_pending_tokens
        ctx = list(prompt_ids[-context_tokens:]) if prompt_ids and context_tokens else []
        # A prompt that ends inside a UTF-8 character would make a dirty prefix: drop those ids.
        while ctx and tokenizer.decode(ctx).endswith(_REPLACEMENT):
            ctx.pop()
        self._ids: list[int] = ctx
        self._prefix_offset = 0
        self._read_offset = len(ctx)
        self._prefix_text: str | None = None    # decode(ids[prefix_offset:read_offset]) or unknown
        self._held = ""
        self._parts: list[str] = []
        self._text_cache = ""
        self._num_output_tokens = 0
        self.stopped = False
        self.stop_reason: str | None = None

    @property
    def text(self) -> str:
        """All text released so far (deltas of add() and flush(), concatenated)."""
        if self._parts:
            self._text_cache += "".join(self._parts)
            self._parts.clear()
        return self._text_cache

    @property
    def num_output_tokens(self) -> int:
        """Token ids added so far."""
        return self._num_output_tokens

    def add(self, token_id: int) -> tuple[str, bool]:
        """Feed one generated token.

        Returns:
            ``(new_text, stopped)``: the text that became safe to send (may be ""), and
            whether a stop string has been found (then new_text is the text before it, and
            every later call returns ``("", True)``).
        """
        if self.stopped:
            return "", True
        self._num_output_tokens += 1
        self._ids.append(int(token_id))
        delta = self._decode_step(final=False)
        if delta is None:
            return "", False
        return self._release(delta, final=False), self.stopped

    def flush(self) -> str:
        """Release everything still held at the end of the output (no stop string found):
        an incomplete UTF-8 tail becomes U+FFFD, a held stop-string prefix is released.
        A stop string found in that last text still truncates it. Returns "" after a stop.
        """
        if self.stopped:
            return ""
        delta = self._decode_step(final=True) or ""
        return self._release(delta, final=True)

    # --- layer 1: decoding -------------------------------------------------------------
    def _decode_step(self, final: bool) -> str | None:
        """New final text since read_offset, advancing the window; None = hold."""
        prefix_text = self._prefix_text
        if prefix_text is None:
            prefix_text = self._prefix_text = self._tok.decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._tok.decode(self._ids[self._prefix_offset:])
        pending = len(self._ids) - self._read_offset
        clean = len(full) > len(prefix_text) and not full.endswith(_REPLACEMENT)
        if clean or final:
            return self._commit(full, prefix_text, len(self._ids), keep_start=True)
        if pending < self._max_pending:
            return None
        # Never-completing bytes: release all but the last tokens, which may still be the
        # head of a valid character.
        upto = len(self._ids) - (_MAX_PARTIAL_TOKENS if full.endswith(_REPLACEMENT) else 0)
        if upto > self._read_offset:
            full = self._tok.decode(self._ids[self._prefix_offset:upto])
        else:
            upto = len(self._ids)
        return self._commit(full, prefix_text, upto)

    def _commit(self, full: str, prefix_text: str, upto: int, keep_start: bool = False) -> str:
        """Release ``full`` past ``prefix_text`` and move read_offset to ``upto`` (``full`` is
        ``decode(ids[prefix_offset:upto])``). ``keep_start``: a clean step keeps the window's
        start and caches ``full`` as the next prefix text while the window is short; otherwise the
        window starts at the old read_offset (the last commit point) and its text is decoded then."""
        delta = full[len(prefix_text):] if len(full) > len(prefix_text) else ""
        if keep_start and upto - self._prefix_offset < _WINDOW:
            self._prefix_text = full
        else:
            self._prefix_offset = self._read_offset
            self._prefix_text = None
        self._read_offset = upto
        return delta

    # --- layer 2: stop strings ---------------------------------------------------------
    def _release(self, delta: str, final: bool) -> str:
        if not self._stops:   # nothing is ever held or cut without stop strings (the common case)
            return self._emit(delta)
        buf = self._held + delta
        hit = self._first_stop(buf)
        if hit is not None:
            start, stop = hit
            self._held = ""
            self.stopped = True
            self.stop_reason = stop
            return self._emit(buf[:start])
        hold = 0 if final else self._stop_prefix_len(buf)
        self._held = buf[len(buf) - hold:] if hold else ""
        return self._emit(buf[:len(buf) - hold])

    def _first_stop(self, buf: str) -> tuple[int, str] | None:
        """(start, stop) of the stop occurrence that ends first (ties: the longer one)."""
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            i = buf.find(stop)
            if i < 0:
                continue
            end = i + len(stop)
            if best is None or (end, i) < (best[0], best[1]):
                best = (end, i, stop)
        return None if best is None else (best[1], best[2])

    def _stop_prefix_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            first = stop[0]
            i = buf.find(first, max(0, len(buf) - (len(stop) - 1)))
            while i >= 0:
                if len(buf) - i <= longest:
                    break
                if stop.startswith(buf[i:]):
                    longest = len(buf) - i
                    break
                i = buf.find(first, i + 1)
        return longest

    def _emit(self, s: str) -> str:
        if s:
            self._parts.append(s)
        return s
