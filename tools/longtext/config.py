"""Long-text settings: the design notes' defaults, :class:`LongTextError` and :class:`LongTextConfig`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: The design notes' long-text settings.
DEFAULT_CHUNK_SIZE = 512
DEFAULT_OVERLAP = 64
DEFAULT_MAX_NEW_TOKENS = 1024
DEFAULT_REPETITION_PENALTY = 1.2
DEFAULT_POSITION_BUCKET = 64
SEQ_REP_NS = (1, 2, 3, 4)
#: The marker ``--sep-every`` inserts: the text "[SEP]" as the model's tokenizer encodes it (one
#: token where the vocabulary has a ``[SEP]`` token, e.g. BERT's; several otherwise).
DEFAULT_SEP_TEXT = "[SEP]"
#: ``--memory-compression`` values: none, or "mean" (a mean-pooled embedding of the text before the window).
MEMORY_COMPRESSIONS = ("none", "mean")

class LongTextError(ValueError):
    """Bad input or an engine that cannot do what is asked. ``field`` names the option."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

@dataclass
class LongTextConfig:
    """Settings of one long-text run (defaults: the design notes').

    ``chunk_size`` tokens per window including BOS; ``overlap`` book tokens shared by
    consecutive windows; ``max_new_tokens`` generated per window (capped, see
    :func:`plan_generation`); ``repetition_penalty`` (CTRL/HF definition, 1 = off);
    ``temperature`` 0 = greedy; ``seed`` for sampling; ``position_bucket`` width of the
    position profile in tokens; ``max_chunks`` evenly spaced windows (None = all);
    ``generate`` False skips generation; ``concurrency`` requests in flight (HTTP);
    ``sep_every`` inserts ``sep_text`` (tokenized) before every book token whose index in the
    book is a multiple of it (None = off); ``memory_compression`` "mean" puts the mean input
    embedding of all book tokens before the window as one extra position after BOS
    (:mod:`.markers`).

    Raises:
        LongTextError: a value out of range, naming the field and the limit.
    """

    chunk_size: int = DEFAULT_CHUNK_SIZE
    overlap: int = DEFAULT_OVERLAP
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    repetition_penalty: float = DEFAULT_REPETITION_PENALTY
    temperature: float = 0.0
    seed: int | None = None
    position_bucket: int = DEFAULT_POSITION_BUCKET
    max_chunks: int | None = None
    generate: bool = True
    concurrency: int = 8
    sep_every: int | None = None
    sep_text: str = DEFAULT_SEP_TEXT
    memory_compression: str = "none"

    def __post_init__(self) -> None:
        def integer(name: str, minimum: int, value: Any) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise LongTextError(name, f"must be an integer >= {minimum}, got {value!r}")

        integer("chunk_size", 3, self.chunk_size)
        integer("overlap", 0, self.overlap)
        integer("max_new_tokens", 1, self.max_new_tokens)
        integer("position_bucket", 1, self.position_bucket)
        integer("concurrency", 1, self.concurrency)
        if self.max_chunks is not None:
            integer("max_chunks", 1, self.max_chunks)
        if self.sep_every is not None:
            integer("sep_every", 1, self.sep_every)
        if not self.sep_text:
            raise LongTextError("sep_text", "must not be empty")
        if self.memory_compression not in MEMORY_COMPRESSIONS:
            raise LongTextError("memory_compression", f"must be one of {', '.join(MEMORY_COMPRESSIONS)}, "
                                                      f"got {self.memory_compression!r}")
        if self.overlap > self.chunk_size - 2:
            raise LongTextError("overlap", f"must be <= chunk_size - 2 = {self.chunk_size - 2} (BOS + at "
                                           f"least one new token per window), got {self.overlap}")
        rp = self.repetition_penalty
        if isinstance(rp, bool) or not isinstance(rp, (int, float)) or not math.isfinite(rp) or rp <= 0:
            raise LongTextError("repetition_penalty", f"must be a finite number > 0, got {rp!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 2:
            raise LongTextError("temperature", f"must be between 0 and 2, got {t!r}")

