"""Sequence: one request's tokens, state and timings inside the engine (vLLM's names).

A sequence's tokens are ``token_ids = prompt_token_ids + output_token_ids`` (kept as one list
so the runner never concatenates). ``num_computed_tokens`` counts the tokens whose K/V are in
the cache; the scheduler feeds ``token_ids[num_computed_tokens:]`` in chunks. Preemption by
recompute sets it back to 0 and frees the blocks; the outputs already produced are kept and
recomputed as part of the next prefill.

Prompt logprobs (vLLM's ``prompt_logprobs``): a sequence built with ``prompt_logprobs_k`` not
None collects, while its prompt is prefilled, one :data:`PromptLogprobEntry` per prompt token
after the first (the logprob of token ``t`` given tokens ``0..t-1``, its rank, and the
``prompt_logprobs_k`` most likely alternatives). They are handed out once, with the request's
first output, and never recomputed after that (a recompute after preemption skips them).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:   # pragma: no cover
    import torch

    from inferctl.engine.sampling_params import SamplingParams


class Logprob(NamedTuple):
    """One token's logprob in a prompt-logprobs entry (vLLM's ``Logprob``, without the text).

    Attributes:
        logprob: natural-log probability, ``log_softmax`` of the model's raw logits (float;
            NaN or -inf when the logits were non-finite — make it JSON-safe before sending).
        rank: 1-based rank in the vocabulary: the number of tokens whose logprob is >= this
            one's (vLLM's definition, so ties share the worse rank; 1 = the most likely).
    """

    logprob: float
    rank: int


#: ``{token_id: Logprob}`` for one prompt position: the actual prompt token plus the top-k
#: alternatives (at most k + 1 entries).
PromptLogprobEntry = dict[int, Logprob]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_REPETITION = "repetition"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style finish reason (stop, length, repetition, abort, error), or None."""
        return self.value if self in _FINISHED else None


_FINISHED = frozenset({SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH,
                       SequenceStatus.FINISHED_REPETITION, SequenceStatus.FINISHED_ABORTED,
                       SequenceStatus.FINISHED_ERROR})


class Sequence:
    """One request. Times are ``time.monotonic()`` seconds; ``arrival_wall`` is epoch seconds.

    Attributes:
        request_id: the caller's id (unique among unfinished requests).
        prompt_token_ids / output_token_ids / token_ids: lists of int token ids.
        params: the request's ``SamplingParams``.
        max_tokens: resolved output limit (params.max_tokens, or what fits in max_model_len).
        status: :class:`SequenceStatus`.
        num_computed_tokens: tokens whose K/V are in the cache.
        block_table: physical KV block ids, in order.
        logprobs: logprob of each generated token (float; may be non-finite).
        top_logprobs: per generated token ``{token_id: logprob}`` when asked for, else None.
        generator: per-request ``torch.Generator`` when the request has a seed, else None.
        detokenizer: the request's ``IncrementalDetokenizer`` (or None when none is used).
        itl: inter-token latencies (seconds) of this request.
        scheduled_time: when the scheduler first took the request off the waiting queue
            (monotonic seconds; kept across preemptions, as vLLM's ``scheduled_ts``).
        oom_retries: OOMs this request was blamed for (see LLMEngine).
        num_preemptions: times this sequence was preempted (recompute).
        error: the error message when status is FINISHED_ERROR.
        prompt_logprobs_k: top alternatives per prompt token when the request asked for
            prompt logprobs (0..max_logprobs), else None.
        prompt_logprobs: the entries collected so far, one per prompt position 1, 2, …
            (index ``p - 1`` holds position ``p``); None when not asked for or once handed out.
    """

    __slots__ = ("request_id", "prompt_token_ids", "output_token_ids", "token_ids", "params",
                 "max_tokens", "status", "num_computed_tokens", "block_table", "arrival_time",
                 "arrival_wall", "scheduled_time", "first_token_time", "last_token_time", "finish_time", "logprobs",
                 "top_logprobs", "generator", "detokenizer", "itl", "oom_retries",
                 "num_preemptions", "error", "error_status", "precision", "stop_token_ids",
                 "ignore_eos", "repetition_stop", "prompt_logprobs_k", "prompt_logprobs", "x_request_id")

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: "SamplingParams",
                 max_tokens: int, arrival_time: float, arrival_wall: float,
                 generator: "torch.Generator | None" = None, detokenizer: Any = None,
                 prompt_logprobs_k: int | None = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.token_ids: list[int] = list(prompt_token_ids)
        self.params = params
        self.max_tokens = max_tokens
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.arrival_time = arrival_time
        self.arrival_wall = arrival_wall
        self.scheduled_time: float | None = None   # first admitted to the running queue
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finish_time: float | None = None
        self.logprobs: list[float] = []
        self.top_logprobs: list[dict[int, float]] | None = None
        self.generator = generator
        self.detokenizer = detokenizer
        self.itl: list[float] = []
        self.oom_retries = 0
        self.x_request_id: str | None = None   # the HTTP request's X-Request-Id (logs, /stats, faults)
        self.num_preemptions = 0
        self.error: str | None = None
        self.error_status: int | None = None
        self.precision: str | None = None
        self.stop_token_ids: frozenset[int] = frozenset()
        self.ignore_eos = False
        self.repetition_stop = False
        self.prompt_logprobs_k = prompt_logprobs_k
        self.prompt_logprobs: list[PromptLogprobEntry] | None = [] if prompt_logprobs_k is not None else None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in _FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        """True while prompt logprobs are asked for and not handed out yet (no output token)."""
        return self.prompt_logprobs is not None and not self.output_token_ids

    def set_prompt_logprobs(self, num_cached: int, entries: list[PromptLogprobEntry]) -> None:
        """Store the entries a chunk starting at position ``num_cached`` produced (positions
        ``num_cached + 1 …``), replacing anything at or after them (a recompute)."""
        lst = self.prompt_logprobs
        if lst is None:
            return
        del lst[num_cached:]
        if len(lst) != num_cached:
            raise ValueError(f"prompt logprobs of {self.request_id!r}: a chunk at position {num_cached} "
                             f"follows only {len(lst)} scored positions")
        lst.extend(entries)

    def append_token(self, token_id: int, logprob: float, now: float) -> None:
        """Record a generated token and its timing."""
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        if self.first_token_time is None:
            self.first_token_time = now
        else:
            self.itl.append(now - self.last_token_time)
        self.last_token_time = now

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: the cache holds nothing of this sequence any more."""
        self.num_computed_tokens = 0
        self.block_table = []
        self.status = SequenceStatus.PREEMPTED

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens})")
