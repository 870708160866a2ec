"""Consistent hashing with bounded loads: the prefix-affinity and session ring.

A key (a prompt prefix, a session id) hashes onto a ring of ``vnodes`` points per replica
(Karger et al. 1997); its home is the first point clockwise. With bounded loads (Mirrokni,
Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018,
arXiv:1608.01350) no replica takes more than ``capacity = ceil((1 + epsilon) × (L + 1) / n)``
requests, ``L`` the outstanding requests over the ``n`` candidates: the walk skips a replica
whose load is already at capacity and takes the next one clockwise. So a key sticks to its
home while the home's load allows, and spills to the same successor each time when it does
not. Since ``n × capacity >= L + 1`` some candidate always has room.

The ring holds every configured replica once; replicas that are not candidates (not ready,
not serving the model) are skipped on the walk, which is the same as the ring of the
candidates alone (removing a node removes only its points).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Mapping


def key_hash(key: str) -> int:
    """A stable 64-bit hash of ``key`` (BLAKE2b, 8 bytes): the same on every process and run."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def capacity(total_load: int, n: int, epsilon: float) -> int:
    """Bounded-load capacity ``ceil((1 + epsilon) × (total_load + 1) / n)`` (>= 1).

    ``total_load``: outstanding requests over the candidates (the new one excluded);
    ``n``: candidates (>= 1). Raises ValueError for ``n < 1`` or a negative ``epsilon``.
    """
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if epsilon < 0:
        raise ValueError(f"epsilon: must be >= 0, got {epsilon}")
    return max(1, math.ceil((1.0 + epsilon) * (total_load + 1) / n - 1e-9))


class HashRing:
    """A consistent-hash ring over replica names, ``vnodes`` points each.

    Raises ValueError for an empty node list or ``vnodes < 1``.
    """

    def __init__(self, nodes: Iterable[str], vnodes: int = 64) -> None:
        names = list(dict.fromkeys(nodes))
        if not names:
            raise ValueError("nodes: the ring needs at least one replica")
        if vnodes < 1:
            raise ValueError(f"vnodes: must be >= 1, got {vnodes}")
        points = sorted((key_hash(f"{name}#{i}"), name) for name in names for i in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._names = [n for _, n in points]
        self.nodes = tuple(names)

    def walk(self, key: str) -> list[str]:
        """Every replica in the order the key visits them clockwise (its home first)."""
        start = bisect.bisect_left(self._hashes, key_hash(key))
        order: dict[str, None] = {}
        total = len(self._names)
        for i in range(total):
            order.setdefault(self._names[(start + i) % total])
            if len(order) == len(self.nodes):
                break
        return list(order)

    def lookup(self, key: str, loads: Mapping[str, int], epsilon: float) -> tuple[str, bool] | None:
        """The replica for ``key`` among the candidates ``loads`` (name → outstanding requests).

        Returns ``(replica, at_home)``: ``at_home`` is False when the key's first candidate was
        at capacity (:func:`capacity`) and the walk went on. None when no candidate is on the
        ring. Candidates not on the ring are ignored.
        """
        cands = {name: int(load) for name, load in loads.items() if name in self.nodes}
        if not cands:
            return None
        cap = capacity(sum(cands.values()), len(cands), epsilon)
        first = True
        for name in self.walk(key):
            if name not in cands:
                continue
            if cands[name] + 1 <= cap:
                return name, first
            first = False
        return None  # unreachable: n × capacity >= total + 1
