"""What the engine does about a failed step (OOM handling; docs/field-cases.md, the OOM kinds).

An OOM during a step — ``torch.OutOfMemoryError`` from the accountant's budget, from an
injected fault or from CUDA, or a CUDA error whose code is in ``oom_error_codes`` — never
kills the engine: the step's sequences are re-queued at the front of the waiting queue
(arrival order kept, blocks freed, recomputed later). The kind decides what happens next:

* ``impossible`` (requested > device total): the request with the largest activation share
  fails at once (status 400: it can never fit), no retry;
* ``fragmentation`` (reserved-unallocated ≥ requested): ``empty_cache()``, then retry;
* ``exhaustion``: retry after a backoff of ``min(max, base·2^(k-1))`` seconds for the k-th
  consecutive OOM.

The request blamed (largest activation share, then the latest arrival) counts a retry; past
``max_oom_retries`` it fails with status 503 and a retry hint — never silently dropped. Any
other step error fails the step's requests (status 500); a hardware error is counted apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from inferctl.contract.oom import OOM_EXHAUSTION, OOM_FRAGMENTATION, OOM_IMPOSSIBLE, OomInfo, classify_oom
from inferctl.contract.stats import (ACTION_BACKOFF, ACTION_EMPTY_CACHE, ACTION_REJECT,
                                     SOURCE_CUDA)
from inferctl.contract.units import format_size
from inferctl.engine.memory_plan import ActivationModel
from inferctl.engine.oom import parse_oom_message
from inferctl.engine.sequence import Sequence


@dataclass
class OomDecision:
    """The response to one OOM: its numbers and kind, where it came from, the action taken
    (``backoff``/``empty_cache``/``reject``), the sequences to fail ``(seq, message, HTTP
    status)`` and those to re-queue."""

    info: OomInfo
    kind: str
    source: str
    action: str
    failed: list[tuple[Sequence, str, int]] = field(default_factory=list)
    requeue: list[Sequence] = field(default_factory=list)
    culprit: Sequence | None = None   # the request blamed (largest activation share)


def oom_info_of(exc: BaseException) -> OomInfo:
    """The numbers of an OOM exception: its ``oom_info`` attribute (set by the accountant),
    else its parsed message, else an :class:`OomInfo` with no numbers."""
    info = getattr(exc, "oom_info", None)
    if info is not None:
        return info
    try:
        return parse_oom_message(str(exc))
    except ValueError:
        return OomInfo(message=str(exc))


def step_error_message(exc: BaseException, kind: str) -> str:
    """The error every request of a failed (non-OOM) step gets: ``"<kind> error during the
    step: <Type>: <message>"``."""
    return f"{kind} error during the step: {type(exc).__name__}: {exc}"


class OomHandler:
    """Decides the response to OOMs and keeps the backoff state (the stepping thread only).

    Args:
        max_oom_retries / oom_backoff_seconds / oom_backoff_max_seconds: ``EngineConfig``.
        acts: the activation model, to blame the request with the largest share.
    """

    def __init__(self, max_oom_retries: int, oom_backoff_seconds: float,
                 oom_backoff_max_seconds: float, acts: ActivationModel):
        self.max_oom_retries = max_oom_retries
        self.backoff_seconds = oom_backoff_seconds
        self.backoff_max_seconds = oom_backoff_max_seconds
        self.acts = acts
        self.consecutive_ooms = 0
        self.backoff_until = 0.0

    def backoff_remaining(self) -> float:
        """Seconds until the next step may run after an exhaustion OOM (0 = now)."""
        return max(0.0, self.backoff_until - time.monotonic())

    def forward_succeeded(self) -> None:
        """A forward completed: the consecutive-OOM count starts again."""
        self.consecutive_ooms = 0

    def decide(self, exc: BaseException, scheduled: list[tuple[Sequence, int]], precision: str,
               accountant) -> OomDecision:
        """The response to ``exc`` raised by the step that ran ``scheduled``.

        Side effects: the blamed sequence's ``oom_retries`` += 1 (not for ``impossible``);
        ``accountant.empty_cache()`` for fragmentation; the backoff deadline for exhaustion.
        """
        info = oom_info_of(exc)
        kind = classify_oom(info) or OOM_EXHAUSTION
        source = getattr(exc, "oom_source", SOURCE_CUDA)
        culprit = max(scheduled, key=lambda sn: (self.acts.share_of(*sn), sn[0].arrival_time))[0]
        req = format_size(info.requested_bytes) if info.requested_bytes is not None else "an unknown size"
        decision = OomDecision(info, kind, source, ACTION_REJECT, culprit=culprit)
        if kind == OOM_IMPOSSIBLE:
            decision.failed.append((culprit, (
                f"out of memory: a step of this request needs {req}, more than the device's "
                f"total {format_size(info.total_bytes)}; it can never fit — shorten the prompt "
                "or max_tokens"), 400))
        else:
            culprit.oom_retries += 1
            if kind == OOM_FRAGMENTATION:
                decision.action = ACTION_EMPTY_CACHE
                accountant.empty_cache()
            else:
                decision.action = ACTION_BACKOFF
                self.consecutive_ooms += 1
                delay = min(self.backoff_max_seconds,
                            self.backoff_seconds * 2 ** (self.consecutive_ooms - 1))
                self.backoff_until = time.monotonic() + delay
            if culprit.oom_retries > self.max_oom_retries:
                free = format_size(info.free_bytes) if info.free_bytes is not None else "unknown"
                decision.failed.append((culprit, (
                    f"out of memory ({kind}) after {self.max_oom_retries} retries: a step "
                    f"needed {req}, {free} free at precision {precision}; retry later "
                    "(the engine may switch to int8 to free memory) or send a shorter request"),
                    503))
        failed_ids = {id(s) for s, _, _ in decision.failed}
        decision.requeue = [s for s, _ in scheduled if id(s) not in failed_ids]
        return decision
