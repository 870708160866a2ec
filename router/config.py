"""The router's configuration: :class:`RouterConfig` and ``--engine NAME=URL`` parsing.

Every limit is configuration; :meth:`RouterConfig.validate` raises :class:`ConfigError`
(a ``ValueError`` naming the flag) for a bad value, so the CLI fails before serving.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from inferctl.contract.http import MAX_BODY_BYTES, check_api_key, host_name_problem, redact_url
from inferctl.contract.logs import check_log_format
from inferctl.contract.yamlfile import load_yaml
from inferctl.router.ratelimit import DEFAULT_NAME, KeyLimit

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
            or a URL that is not ``http://`` / ``https://`` with a host, or that has more than
            host and port: a port outside 1..65535 or not a number, credentials, a path, a query
            or a fragment (the message names ``--engine``, the replica and the problem).
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
    problem = _url_problem(url, parts)
    if problem is not None:
        shown = redact_url(url)
        raise ConfigError(f"--engine: {name}: URL {shown!r} {problem}; give http(s)://host[:port] only")
    return EngineSpec(name, url)


def _url_problem(url: str, parts: Any) -> str | None:
    """Why an engine ``url`` (``parts``: its ``urlsplit``) is more than ``http(s)://host[:port]``,
    or None.

    The router appends its own paths (``/ready``, ``/v1/...``) to the URL, so a path, query or
    fragment would be silently mangled; credentials would travel in every probe and show in
    ``/replicas`` and logs (the replicas' key goes in ``--upstream-api-key-env``; the message
    never echoes them); a port outside 1..65535 (RFC 6335 section 6: port 0 is reserved) or not
    a number would fail every probe."""
    if "@" in parts.netloc:
        return "carries credentials (user:password@), which would show in logs and /replicas"
    hostport = parts.netloc.rpartition("]")[2]      # past an IPv6 literal's brackets
    if ":" in hostport:
        text = hostport.rpartition(":")[2]
        if not text:
            return "has an empty port"
        if not (text.isascii() and text.isdigit()):
            return f"has port {text!r}, not a number"
        if not 1 <= int(text) <= 65535:
            return f"has port {int(text)}, outside 1-65535"
    bad = host_name_problem(parts.hostname or "")
    if bad is not None:
        return f"has a host that is not a valid host name ({bad})"
    if parts.path not in ("", "/"):
        return f"has a path ({parts.path!r}); the router adds /ready, /v1/... itself"
    if "?" in url:
        return "has a query (?...)"
    if "#" in url:
        return "has a fragment (#...)"
    return None


#: Longest interval or timeout a flag accepts (a day): above, a probe or a request is never awaited.
MAX_SECONDS = 86400.0


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
    ``connect_timeout_seconds``: upstream connect deadline. ``upstream_connections``: the most
    upstream connections open at once, all replicas together (each in-flight request holds
    one; size it above the concurrent clients). ``retry_after_seconds``: the
    ``Retry-After`` of a 503 when no replica is ready. ``log_format``: ``text`` or ``json``.
    ``rate_keys``: per-key rate limits by raw API key (never logged); ``rate_default``: the
    limits of keys not listed (:mod:`inferctl.router.ratelimit`; ``--config`` ``rate_limits``).
    ``upstream_api_key``: the replicas' API key (their ``--api-key``), sent on the router's own
    probes, and on forwarded requests in place of the client's ``Authorization`` when
    ``api_key`` is set too (the client was admitted with the router's key); read from the
    variable ``--upstream-api-key-env`` / ``upstream_api_key_env`` names, never from a flag value
    (it would show in ``ps``); never logged (docs/router.md "API keys").
    ``api_key``: the key the router's own clients must send on ``/v1/*`` (``--api-key`` /
    ``$INFERCTL_API_KEY``, as the engine's; :mod:`inferctl.router.auth`); None: open. Never logged.
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
    upstream_connections: int = 1000
    retry_after_seconds: int = 1
    log_format: str = "text"
    rate_keys: Mapping[str, KeyLimit] = field(default_factory=dict, repr=False)
    rate_default: KeyLimit | None = None
    upstream_api_key: str | None = field(default=None, repr=False)
    api_key: str | None = field(default=None, repr=False)

    def validate(self) -> "RouterConfig":
        """Check every field; returns ``self``.

        Raises:
            ConfigError: no engine, a duplicate name, a non-positive interval/timeout, a
                negative ``max_retries`` or ``epsilon``, ``affinity_chars`` < 1, a
                ``max_body_bytes`` outside 1 .. :data:`MAX_BODY_BYTES`, an unknown
                ``log_format``, a controller URL that is not http(s), an ``api_key`` no client
                could send (:func:`inferctl.contract.http.check_api_key`; the message never
                holds the key).
        """
        if not self.engines:
            raise ConfigError("--engine: at least one NAME=URL is required (or engines in --config)")
        names = [e.name for e in self.engines]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"--engine: duplicate name(s) {', '.join(dup)}")
        for flag, value in (("--probe-interval", self.probe_interval_seconds),
                            ("--probe-timeout", self.probe_timeout_seconds),
                            ("--upstream-timeout", self.upstream_timeout_seconds),
                            ("--connect-timeout", self.connect_timeout_seconds)):
            if not 0 < value <= MAX_SECONDS:   # nan and inf too: inf never probed again after the first
                raise ConfigError(f"{flag}: must be > 0 and <= {MAX_SECONDS:g} seconds, got {value}")
        if self.max_retries < 0:
            raise ConfigError(f"--max-retries: must be >= 0, got {self.max_retries}")
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):   # nan: no replica ever within the bound
            raise ConfigError(f"--epsilon: must be a finite number >= 0, got {self.epsilon}")
        if self.affinity_chars < 1 or self.affinity_min_chars < 0:
            raise ConfigError(f"--affinity-chars: must be >= 1 (min chars >= 0), got {self.affinity_chars}, "
                              f"{self.affinity_min_chars}")
        if self.vnodes < 1:
            raise ConfigError(f"vnodes: must be >= 1, got {self.vnodes}")
        if self.upstream_connections < 1:
            raise ConfigError(f"--upstream-connections: must be >= 1, got {self.upstream_connections}")
        if not 1 <= self.max_body_bytes <= MAX_BODY_BYTES:
            raise ConfigError(f"--max-body-bytes: must be >= 1 and <= {MAX_BODY_BYTES} bytes (1 GiB), "
                              f"got {self.max_body_bytes}")
        if self.api_key is not None:
            try:
                check_api_key(self.api_key, "--api-key (or $INFERCTL_API_KEY)")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        try:
            check_log_format(self.log_format)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.controller is not None:
            parts = urlsplit(self.controller)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"--controller: URL {self.controller!r} must be http(s)://host[:port]")
            problem = _url_problem(self.controller, parts)   # a port like 99999 was accepted, then every poll failed
            if problem is not None:
                shown = self.controller if "@" not in parts.netloc else "<URL with credentials>"
                raise ConfigError(f"--controller: URL {shown!r} {problem}; give http(s)://host[:port] only")
        return self

    def attempts(self) -> int:
        """Attempts per request: 1 + min(max_retries, replicas - 1)."""
        return 1 + min(self.max_retries, len(self.engines) - 1)


#: The top-level keys of a ``--config`` file.
FILE_KEYS = ("engines", "controller", "rate_limits", "upstream_api_key_env")


def upstream_key_from_env(var: str, env: Mapping[str, str] | None = None,
                          source: str = "--upstream-api-key-env") -> str:
    """The replicas' API key from the environment variable ``var`` (stripped: a secret mounted
    from a file ends in a newline).

    Raises:
        ConfigError: ``var`` is not a variable name, is unset or empty, or holds a key no client
            could send (:func:`inferctl.contract.http.check_api_key`); the message names
            ``source`` and the variable, never the value."""
    import os

    env = os.environ if env is None else env
    if not isinstance(var, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
        raise ConfigError(f"{source}: {var!r} is not an environment variable name")
    key = (env.get(var) or "").strip()
    if not key:
        raise ConfigError(f"{source}: environment variable {var} is not set or empty")
    try:
        return check_api_key(key, "key")
    except ValueError as exc:
        raise ConfigError(f"{source}: ${var}: {str(exc).removeprefix('key: ')}") from None
_LIMIT_KEYS = ("requests_per_minute", "tokens_per_minute")
#: Largest per-minute limit accepted (a bigger one is no limit: leave the key out).
MAX_PER_MINUTE = 1e15


def load_config_file(path: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Read a router ``--config`` YAML file (docs/router.md "Configuration file") into
    ``{"engines": [EngineSpec], "controller": str | None, "rate_keys": {raw key: KeyLimit},
    "rate_default": KeyLimit | None, "upstream_api_key": str | None}``. ``env``: where
    ``key_env`` and ``upstream_api_key_env`` names are looked up (default ``os.environ``).

    Raises:
        ConfigError: the file cannot be read, is not UTF-8, is not a YAML mapping, holds a key
            twice in one mapping or nests too deeply (:func:`inferctl.contract.yamlfile.load_yaml`),
            or a field is wrong: a limit outside 1..1e15 per minute, an API key no client could
            send (:func:`inferctl.contract.http.check_api_key`); the message names the file and
            the field's path (``rate_limits.keys[1].tokens_per_minute: must be a number >= 1, got -5``).
    """
    import os

    env = os.environ if env is None else env
    try:
        with open(path, encoding="utf-8") as f:
            doc = load_yaml(f.read())
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config: {path} is not UTF-8 text") from None
    except ValueError as exc:   # invalid YAML, a duplicate key, nesting too deep
        raise ConfigError(f"--config: {path}: {exc}") from None
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise ConfigError(f"--config: {path} must be a mapping of {', '.join(FILE_KEYS)}")

    def fail(where: str, msg: str) -> ConfigError:
        return ConfigError(f"--config {path}: {where}: {msg}")

    unknown = sorted(str(k) for k in doc if k not in FILE_KEYS)
    if unknown:
        raise fail(unknown[0], f"unknown key (known: {', '.join(FILE_KEYS)})")
    engines = []
    raw_engines = doc.get("engines") or []
    if not isinstance(raw_engines, list):
        raise fail("engines", "must be a list of {name, url}")
    for i, e in enumerate(raw_engines):
        if not isinstance(e, dict) or set(e) != {"name", "url"}:
            raise fail(f"engines[{i}]", "must be a mapping with exactly name and url")
        try:
            engines.append(parse_engine(f"{e['name']}={e['url']}"))
        except ConfigError as exc:
            raise fail(f"engines[{i}]", str(exc).removeprefix("--engine: ")) from None
    controller = doc.get("controller")
    if controller is not None and not isinstance(controller, str):
        raise fail("controller", f"must be a URL string, got {controller!r}")
    keys, default = _rate_limits(doc.get("rate_limits"), env, fail)
    var = doc.get("upstream_api_key_env")
    upstream_key = None if var is None else upstream_key_from_env(var, env, f"--config {path}: upstream_api_key_env")
    return {"engines": engines, "controller": controller, "rate_keys": keys, "rate_default": default,
            "upstream_api_key": upstream_key}


def _limit(where: str, raw: Any, name: str, fail: Callable[[str, str], ConfigError],
           extra: tuple[str, ...] = ()) -> KeyLimit:
    if not isinstance(raw, dict):
        raise fail(where, f"must be a mapping of {', '.join(extra + _LIMIT_KEYS)}")
    unknown = sorted(str(k) for k in raw if k not in extra + _LIMIT_KEYS)
    if unknown:
        raise fail(f"{where}.{unknown[0]}", f"unknown key (known: {', '.join(extra + _LIMIT_KEYS)})")
    values = {}
    for k in _LIMIT_KEYS:
        v = raw.get(k)
        # a bucket must hold one whole request / token: with a capacity below 1 it never would
        # and every request would be refused forever (with a Retry-After promising otherwise)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 1):
            raise fail(f"{where}.{k}", f"must be a number >= 1 (per minute), got {v!r}")
        if v is not None and v > MAX_PER_MINUTE:
            raise fail(f"{where}.{k}", f"must be at most {MAX_PER_MINUTE:.0e} (per minute), got {v!r}")
        values[k] = None if v is None else float(v)
    if values["requests_per_minute"] is None and values["tokens_per_minute"] is None:
        raise fail(where, "give requests_per_minute and/or tokens_per_minute")
    return KeyLimit(name, values["requests_per_minute"], values["tokens_per_minute"])


def _rate_limits(raw: Any, env: Mapping[str, str],
                 fail: Callable[[str, str], ConfigError]) -> tuple[dict[str, KeyLimit], KeyLimit | None]:
    if raw is None:
        return {}, None
    if not isinstance(raw, dict) or not set(raw) <= {"keys", "default"}:
        raise fail("rate_limits", "must be a mapping of keys (a list) and default")
    default = None if raw.get("default") is None else _limit("rate_limits.default", raw["default"], DEFAULT_NAME,
                                                             fail)
    keys: dict[str, KeyLimit] = {}
    names: set[str] = set()
    entries = raw.get("keys") or []
    if not isinstance(entries, list):
        raise fail("rate_limits.keys", "must be a list")
    for i, entry in enumerate(entries):
        where = f"rate_limits.keys[{i}]"
        lim = _limit(where, entry, str(entry.get("name")) if isinstance(entry, dict) else "",
                     fail, ("name", "key", "key_env"))
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name) or name == DEFAULT_NAME:
            raise fail(f"{where}.name", "a name of 1-64 letters, digits, '_', '.', '-' (not 'default') is required"
                       " (metrics carry it, never the key)")
        if name in names:
            raise fail(f"{where}.name", f"duplicate name {name!r}")
        names.add(name)
        if ("key" in entry) == ("key_env" in entry):
            raise fail(where, "give exactly one of key and key_env")
        field_ = "key_env" if "key_env" in entry else "key"
        if "key_env" in entry:
            var = entry["key_env"]
            # a secret mounted from a file ends in a newline: strip it, as read_token_file does
            key = (env.get(var) or "").strip() if isinstance(var, str) else ""
            if not key:
                raise fail(f"{where}.key_env", f"environment variable {var!r} is not set or empty")
        else:
            key = entry["key"]
            if not isinstance(key, str) or not key.strip():
                raise fail(f"{where}.key", "must be a non-empty string")
        try:   # clients send 'Authorization: Bearer KEY' (stripped): a key with spaces would never match
            check_api_key(key, "key")
        except ValueError as exc:
            raise fail(f"{where}.{field_}", str(exc).removeprefix("key: ")) from None
        if key in keys:
            raise fail(f"{where}.key", f"the same key as {keys[key].name}")
        keys[key] = lim
    return keys, default
