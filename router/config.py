"""The router's configuration: :class:`RouterConfig` and ``--engine NAME=URL`` parsing.

Every limit is configuration; :meth:`RouterConfig.validate` raises :class:`ConfigError`
(a ``ValueError`` naming the flag) for a bad value, so the CLI fails before serving.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

#: A replica name: what ``replica`` labels and logs carry.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ConfigError(ValueError):
    """A bad router setting; the message names the flag and the value."""


@dataclass(frozen=True)
class EngineSpec:
    """One replica: ``name`` (labels, logs) and ``url`` (``http(s)://host:port``, no trailing /)."""

    name: str
    url: str


def parse_engine(text: str) -> EngineSpec:
    """``NAME=URL`` → :class:`EngineSpec`.

    Raises:
        ConfigError: no ``=``, a name outside ``[A-Za-z0-9_.-]`` (1..64, starting alphanumeric),
            or a URL that is not ``http://`` / ``https://`` with a host.
    """
    name, sep, url = text.partition("=")
    name, url = name.strip(), url.strip().rstrip("/")
    if not sep or not name or not url:
        raise ConfigError(f"--engine: expected NAME=URL, got {text!r}")
    if not _NAME.match(name):
        raise ConfigError(f"--engine: name {name!r} must be 1-64 characters of letters, digits, '_', '.', '-'")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--engine: {name}: URL {url!r} must be http(s)://host[:port]")
    return EngineSpec(name, url)


@dataclass(frozen=True)
class RouterConfig:
    """Router settings (docs/router.md explains each).

    ``engines``: the replicas. ``controller``: the controller's base URL or None.
    ``probe_interval_seconds``: readiness / ``/stats`` / controller poll period (s).
    ``probe_timeout_seconds``: one probe's deadline (s). ``max_retries``: at most this many
    other replicas after the first attempt (also capped at replicas - 1).
    ``affinity_chars``: N, the prompt characters hashed for prefix affinity.
    ``affinity_min_chars``: shorter prompts go to the least-loaded replica instead.
    ``epsilon``: bounded-load slack: a replica above ``(1 + epsilon)`` × the average
    outstanding load is skipped (Mirrokni, Thorup, Zadimoghaddam 2018). ``vnodes``: points per
    replica on the hash ring. ``max_body_bytes``: largest request body (413 above, as the
    engine). ``upstream_timeout_seconds``: read deadline between two upstream bytes.
    ``connect_timeout_seconds``: upstream connect deadline. ``retry_after_seconds``: the
    ``Retry-After`` of a 503 when no replica is ready. ``log_format``: ``text`` or ``json``.
    """

    engines: tuple[EngineSpec, ...]
    controller: str | None = None
    probe_interval_seconds: float = 1.0
    probe_timeout_seconds: float = 1.0
    max_retries: int = 2
    affinity_chars: int = 256
    affinity_min_chars: int = 32
    epsilon: float = 0.25
    vnodes: int = 64
    max_body_bytes: int = 4 * 1024 * 1024
    upstream_timeout_seconds: float = 600.0
    connect_timeout_seconds: float = 2.0
    retry_after_seconds: int = 1
    log_format: str = "text"

    def validate(self) -> "RouterConfig":
        """Check every field; returns ``self``.

        Raises:
            ConfigError: no engine, a duplicate name, a non-positive interval/timeout, a
                negative ``max_retries`` or ``epsilon``, ``affinity_chars`` < 1, an unknown
                ``log_format``, a controller URL that is not http(s).
        """
        if not self.engines:
            raise ConfigError("--engine: at least one NAME=URL is required")
        names = [e.name for e in self.engines]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"--engine: duplicate name(s) {', '.join(dup)}")
        for flag, value in (("--probe-interval", self.probe_interval_seconds),
                            ("--probe-timeout", self.probe_timeout_seconds),
                            ("--upstream-timeout", self.upstream_timeout_seconds),
                            ("--connect-timeout", self.connect_timeout_seconds)):
            if not value > 0:
                raise ConfigError(f"{flag}: must be > 0 seconds, got {value}")
        if self.max_retries < 0:
            raise ConfigError(f"--max-retries: must be >= 0, got {self.max_retries}")
        if self.epsilon < 0:
            raise ConfigError(f"--epsilon: must be >= 0, got {self.epsilon}")
        if self.affinity_chars < 1 or self.affinity_min_chars < 0:
            raise ConfigError(f"--affinity-chars: must be >= 1 (min chars >= 0), got {self.affinity_chars}, "
                              f"{self.affinity_min_chars}")
        if self.vnodes < 1:
            raise ConfigError(f"vnodes: must be >= 1, got {self.vnodes}")
        if self.max_body_bytes < 1:
            raise ConfigError(f"--max-body-bytes: must be >= 1, got {self.max_body_bytes}")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"--log-format: must be text or json, got {self.log_format!r}")
        if self.controller is not None:
            parts = urlsplit(self.controller)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"--controller: URL {self.controller!r} must be http(s)://host[:port]")
        return self

    def attempts(self) -> int:
        """Attempts per request: 1 + min(max_retries, replicas - 1)."""
        return 1 + min(self.max_retries, len(self.engines) - 1)
