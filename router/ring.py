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

:class:`AffinityTable` is what the router routes with: the ring plus a memory of where each
key went. A stateless ring places a *few* keys badly — with 3 keys on 3 replicas, all three
land on different replicas only 2 times in 9 (3!/3³), and a request-count bound re-decided
per request makes a key sharing its home flap between the home and its successor (the
router's SmolLM2 run: 3 system prompts on 2 of 3 replicas, 9/9/0 answers). So a key's first
request *places* it: the first replica on its walk whose request load is under the bound
above AND whose count of live keys is under ``ceil((K + 1) / n)`` (the same bound with
ε = 0 over keys instead of requests, ``K`` the live keys on the candidates: the paper's
balls are the keys), and later requests *follow* the placement while that replica is a
candidate under the request bound and holds at most ``ceil((1 + ε) × (K + 1) / n)`` keys (a
replica back from a restart, or added, starts with none: this bound hands it the surplus of
the others' keys as they come, and nothing moves while each holds within ε of its share).
Over either bound the request spills (the walk again, from
the key's ring position) and the key now follows the replica it spilled to: that replica
prefills the prefix once and then holds it, while going back would only trade one cached
copy for another — a key that alternates pays a cold prefill on each replica it visits and
keeps both copies in use. A key idle for ``idle_seconds`` is forgotten (its cache is likely
evicted by then) and placed afresh on its next request.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping


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
        return self.walk_hash(key_hash(key))

    def walk_hash(self, h: int) -> list[str]:
        """:meth:`walk` from the key's :func:`key_hash` ``h``."""
        start = bisect.bisect_left(self._hashes, h)
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


#: Keys an :class:`AffinityTable` remembers at most (least recently used forgotten first):
#: kept as their 64-bit :func:`key_hash`, ~200 bytes each (13 MiB at 65,536, tracemalloc).
MAX_KEYS = 65536
#: Seconds after its last request a key's placement is forgotten (its prefix has likely been
#: evicted from the replica's cache under other traffic by then).
IDLE_SECONDS = 600.0


class AffinityTable:
    """Sticky bounded-load placement of ring keys (module docstring) over a :class:`HashRing`.

    ``max_keys``: keys remembered (LRU); ``idle_seconds``: a key unused that long is forgotten;
    ``clock``: monotonic seconds (tests pass a fake). One per router; not thread-safe (the
    event loop is its only caller). Raises ValueError for ``max_keys < 1`` or
    ``idle_seconds <= 0``.
    """

    def __init__(self, ring: HashRing, *, max_keys: int = MAX_KEYS, idle_seconds: float = IDLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys: must be >= 1, got {max_keys}")
        if not idle_seconds > 0:
            raise ValueError(f"idle_seconds: must be > 0, got {idle_seconds}")
        self.ring = ring
        self.nodes = ring.nodes
        self.max_keys = max_keys
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._where: OrderedDict[int, tuple[str, float]] = OrderedDict()   # key_hash -> (replica, last use)
        self._keys = {name: 0 for name in ring.nodes}                      # live keys per replica

    def placement(self, key: str) -> str | None:
        """The replica ``key`` is placed on now (None: not placed, or forgotten)."""
        self._expire(self._clock())
        found = self._where.get(key_hash(key))
        return None if found is None else found[0]

    def keys_per_replica(self) -> dict[str, int]:
        """Live (not forgotten) keys placed on each replica of the ring."""
        self._expire(self._clock())
        return dict(self._keys)

    def lookup(self, key: str, loads: Mapping[str, int], epsilon: float) -> tuple[str, bool] | None:
        """The replica for ``key`` among the candidates ``loads`` (name → outstanding requests),
        remembered as the key's placement.

        Returns ``(replica, at_home)``: ``at_home`` is False when the request spilled: the
        replica the key follows was at the request bound (:func:`capacity`) or held more than
        its share of keys by the same bound, or (a new key) the replica placement would pick was
        at the request bound, so it went on along the walk. None when no candidate
        is on the ring. Candidates not on the ring are ignored.
        """
        cands = {name: int(load) for name, load in loads.items() if name in self._keys}
        if not cands:
            return None
        now = self._clock()
        self._expire(now)
        cap = capacity(sum(cands.values()), len(cands), epsilon)
        h = key_hash(key)
        placed = self._where.pop(h, None)
        if placed is not None:
            self._keys[placed[0]] -= 1
        live = sum(self._keys[n] for n in cands)
        if placed is not None and placed[0] in cands and cands[placed[0]] + 1 <= cap \
                and self._keys[placed[0]] + 1 <= capacity(live, len(cands), epsilon):
            return self._remember(h, placed[0], now), True
        key_cap = capacity(live, len(cands), 0.0)
        walk = [name for name in self.ring.walk_hash(h) if name in cands]
        roomy = [name for name in walk if self._keys[name] + 1 <= key_cap]
        preferred = placed[0] if placed is not None and placed[0] in cands else (roomy or walk)[0]
        under = [name for name in walk if cands[name] + 1 <= cap]     # never empty: n × cap >= L + 1
        choice = next((name for name in under if name in roomy), under[0])
        return self._remember(h, choice, now), choice == preferred

    def _remember(self, h: int, name: str, now: float) -> str:
        self._where[h] = (name, now)
        self._keys[name] += 1
        while len(self._where) > self.max_keys:
            _, (old, _) = self._where.popitem(last=False)
            self._keys[old] -= 1
        return name

    def _expire(self, now: float) -> None:
        while self._where:
            key, (name, used) = next(iter(self._where.items()))
            if now - used < self.idle_seconds:
                return
            del self._where[key]
            self._keys[name] -= 1
