"""Per-key rate limits: requests and tokens per minute, token buckets (``--config`` ``rate_limits``).

A key is the client's API key (``Authorization: Bearer KEY``); each configured key has a
``name`` (the only thing metrics and logs carry: a raw key never appears in a label) and
``requests_per_minute`` and/or ``tokens_per_minute``. Requests with a key not configured (or no
key) share the ``default`` limits, if any, under the name ``default``.

Token bucket (the classic algorithm, e.g. https://en.wikipedia.org/wiki/Token_bucket): a bucket
of capacity C = the per-minute limit refills at C / 60 per second.

* Requests: one token per request, taken at admission.
* Tokens: counted from the answer's ``usage.total_tokens`` at response end (a stream's usage
  when the client asked for it with ``stream_options.include_usage``; a stream without usage
  counts its content chunks, about one token each, plus nothing for the prompt). A request is
  admitted while the tokens bucket is above 0; its usage is then debited, possibly below 0
  (one long answer may overdraw it), and later requests wait until it refills above 0. No
  up-front reservation of ``max_tokens``: a request never pays for tokens it did not use.

A refused request gets 429 with ``Retry-After`` = the seconds until the bucket holds what the
request needs (rounded up, at least 1) — the header RFC 9110 §10.2.3 defines.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

#: The name of the limits shared by keys not configured (and requests without a key).
DEFAULT_NAME = "default"
#: The ``limit`` label values of ``inferctl_router_rate_limited_total``.
LIMITS = ("requests", "tokens")


@dataclass(frozen=True)
class KeyLimit:
    """One key's limits (None: not limited on that count). ``name`` labels its metrics."""

    name: str
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


class TokenBucket:
    """Capacity ``per_minute``, refilled at ``per_minute / 60`` per second (``clock`` seconds)."""

    def __init__(self, per_minute: float, clock: Callable[[], float]) -> None:
        self.capacity = float(per_minute)
        self.rate = self.capacity / 60.0
        self.clock = clock
        self.level = self.capacity
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, need: float) -> float:
        """Seconds until ``level >= need`` (``need``: 1 for a request, a tiny amount for "above
        0"); 0 when it does now."""
        self._refill()
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, amount: float) -> None:
        """Debit ``amount`` (the level may go below 0: a debt paid by the refill)."""
        self._refill()
        self.level -= amount


@dataclass(frozen=True)
class Admission:
    """``ok``; else ``limit`` (requests or tokens) and ``retry_after`` (whole seconds >= 1).
    ``name``: the key's configured name (None: no limit applies)."""

    ok: bool
    name: str | None = None
    limit: str | None = None
    retry_after: int = 0


class RateLimiter:
    """The buckets of every configured key (``keys``: raw API key -> :class:`KeyLimit`) and of
    ``default`` (None: keys not configured are not limited). Thread-safe."""

    def __init__(self, keys: Mapping[str, KeyLimit], default: KeyLimit | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keys = dict(keys)
        self.default = default
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], TokenBucket] = {}

    def limit_for(self, api_key: str | None) -> KeyLimit | None:
        """The limits that apply to ``api_key`` (its own, else ``default``, else None)."""
        if api_key is not None and api_key in self.keys:
            return self.keys[api_key]
        return self.default

    def _bucket(self, name: str, kind: str, per_minute: float) -> TokenBucket:
        b = self._buckets.get((name, kind))
        if b is None:
            b = self._buckets[(name, kind)] = TokenBucket(per_minute, self.clock)
        return b

    def admit(self, api_key: str | None) -> Admission:
        """Admit one request of ``api_key`` now (taking its request token) or refuse it."""
        lim = self.limit_for(api_key)
        if lim is None:
            return Admission(True)
        with self._lock:
            waits = []
            if lim.requests_per_minute is not None:
                waits.append(("requests", self._bucket(lim.name, "requests", lim.requests_per_minute).wait_for(1.0)))
            if lim.tokens_per_minute is not None:
                waits.append(("tokens", self._bucket(lim.name, "tokens", lim.tokens_per_minute).wait_for(1e-9)))
            refused = [(w, kind) for kind, w in waits if w > 0]
            if refused:
                wait, kind = max(refused)
                return Admission(False, lim.name, kind, max(1, math.ceil(wait - 1e-6)))
            if lim.requests_per_minute is not None:
                self._bucket(lim.name, "requests", lim.requests_per_minute).take(1.0)
            return Admission(True, lim.name)

    def charge(self, name: str | None, tokens: int | None) -> None:
        """Debit ``tokens`` (a finished answer's usage) from key ``name``'s tokens bucket."""
        if name is None or not tokens or tokens < 0:
            return
        lim = self.default if name == DEFAULT_NAME else next(
            (k for k in self.keys.values() if k.name == name), None)
        if lim is None or lim.tokens_per_minute is None:
            return
        with self._lock:
            self._bucket(name, "tokens", lim.tokens_per_minute).take(float(tokens))


def bearer_key(authorization: str | None) -> str | None:
    """The API key of an ``Authorization: Bearer KEY`` header, else None."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None


class UsageMeter:
    """Tokens of one answer, fed its body bytes as they pass (:meth:`feed`), read at the end
    (:attr:`tokens`): a JSON answer's ``usage.total_tokens``; a stream's last ``usage`` event
    if it has one, else one token per ``data:`` event carrying choices (module docstring)."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self._buf = b""
        self._usage: int | None = None
        self._chunks = 0

    def feed(self, data: bytes) -> None:
        if not self.stream:
            self._buf += data
            return
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self._line(line.strip())

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        total = _total_tokens(payload)
        if total is not None:
            self._usage = total
        elif b'"choices"' in payload:
            self._chunks += 1

    @property
    def tokens(self) -> int:
        if not self.stream:
            return _total_tokens(self._buf) or 0
        if self._buf:
            self._line(self._buf.strip())
            self._buf = b""
        return self._usage if self._usage is not None else self._chunks


def _total_tokens(payload: bytes) -> int | None:
    """``usage.total_tokens`` of a JSON document (None: absent, not JSON, not a count)."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):   # not JSON, or an upstream body nested past the parser's limit
        return None
    usage = doc.get("usage") if isinstance(doc, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and not isinstance(total, bool) and total >= 0 else None
