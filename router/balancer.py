"""The routing rule: which ready replica takes a request, and why.

1. ``X-Session-Id`` given → the session id on the hash ring with bounded loads
   (:mod:`inferctl.router.ring`; with an :class:`~inferctl.router.ring.AffinityTable`, the
   key's remembered placement): reason ``session``.
2. Else a prompt prefix of at least ``affinity_min_chars`` characters → the prefix key on the
   ring: reason ``affinity`` (requests sharing the first N characters land on the same
   replica while its load allows, so its KV/prefix cache is reused).
   A ring key whose replica is at the bounded load goes on along its walk: reason ``spill``
   (for a session or a prefix alike; the key then follows the replica it spilled to).
3. Else (a short prompt) → the least-loaded replica by :func:`load_score`: reason ``least_load``.
4. A retry takes the least-loaded replica not tried yet: reason ``fallback``.

:func:`load_score` is least-outstanding-requests weighted by the replica's own view:
``(outstanding + waiting + 1) × (1 + kv_usage_ratio)`` — ``outstanding`` the router's in-flight
requests to it, ``waiting`` its scheduler queue and ``kv_usage_ratio`` its KV-cache use from
its last ``/stats`` (a missing reading counts as 0 there: the router's own count still ranks
it). A full KV cache doubles the score: it will queue or preempt the next request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferctl.router.ring import AffinityTable, HashRing


@dataclass(frozen=True)
class ReplicaLoad:
    """One candidate's load: ``outstanding`` (router in-flight requests), ``waiting``
    (scheduler queue, None = no reading), ``kv_usage_ratio`` (0..1, None = no reading)."""

    name: str
    outstanding: int
    waiting: int | None = None
    kv_usage_ratio: float | None = None


@dataclass(frozen=True)
class Decision:
    """The chosen replica and the reason (``session``, ``affinity``, ``spill``, ``least_load``,
    ``fallback``); ``at_home`` is False when a ring key spilled past its loaded replica (bounded
    load: reason ``spill``)."""

    replica: str
    reason: str
    at_home: bool = True


def load_score(r: ReplicaLoad) -> float:
    """``(outstanding + waiting + 1) × (1 + kv_usage_ratio)``; missing readings count as 0,
    ``kv_usage_ratio`` is clamped to 0..1."""
    kv = 0.0 if r.kv_usage_ratio is None else min(1.0, max(0.0, float(r.kv_usage_ratio)))
    waiting = 0 if r.waiting is None else max(0, int(r.waiting))
    return (max(0, r.outstanding) + waiting + 1) * (1.0 + kv)


def least_loaded(cands: Sequence[ReplicaLoad], tie: int = 0) -> str:
    """The candidate with the lowest :func:`load_score`; among equal scores the
    ``tie % k``-th (a rotating counter spreads an idle fleet round-robin).

    Raises ValueError for no candidate.
    """
    if not cands:
        raise ValueError("cands: no candidate replica")
    scores = [(load_score(c), c.name) for c in cands]
    best = min(s for s, _ in scores)
    tied = sorted(name for s, name in scores if s <= best + 1e-12)
    return tied[tie % len(tied)]


def choose(cands: Sequence[ReplicaLoad], ring: HashRing | AffinityTable, *, session: str | None, prefix: str | None,
           epsilon: float, tie: int = 0, retry: bool = False) -> Decision:
    """Apply the routing rule (module docstring) to the candidates (ready replicas not tried).

    ``ring``: a stateless :class:`HashRing` or the router's sticky :class:`AffinityTable`;
    ``session``: the ``X-Session-Id`` value or None; ``prefix``: the affinity key (already cut to
    N characters, None when too short); ``retry``: this is not the request's first attempt.
    Raises ValueError for no candidate.
    """
    if not cands:
        raise ValueError("cands: no candidate replica")
    if retry:
        return Decision(least_loaded(cands, tie), "fallback")
    for key, reason in ((session, "session"), (prefix, "affinity")):
        if key:
            found = ring.lookup(("s:" if reason == "session" else "p:") + key,
                                {c.name: c.outstanding for c in cands}, epsilon)
            if found is not None:
                return Decision(found[0], reason if found[1] else "spill", found[1])
    return Decision(least_loaded(cands, tie), "least_load")
