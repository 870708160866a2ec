"""The HAProxy data plane: ``inferctl router --data-plane haproxy``.

The router's Python data plane costs about 0.2 ms of CPU a request; at 64 closed-loop clients
the requests of a burst queue behind each other on its one event loop and it adds 5–7 ms at p50
on this host, where a compiled proxy adds 1.5–1.8 ms (docs/benchmarks.md, "Router"). In this
mode HAProxy (C, one thread) carries the requests and the router's Python process is the control
plane only, as llm-d drives Envoy and AIBrix its gateway:

* **HAProxy** listens on the router's ``--host``/``--port``. ``POST`` to ``/v1/completions``,
  ``/v1/chat/completions``, ``/tokenize`` and ``/detokenize`` goes to the replicas; every other
  request (``/health``, ``/ready``, ``/replicas``, ``/metrics``, ``/v1/models``, the OpenAPI
  document) goes to the Python app on a private loopback port, answering as it always does.
* **Routing** (:func:`render_config`): consistent hashing with bounded load
  (``hash-type consistent`` + ``hash-balance-factor`` = 100 × (1 + ``--epsilon``): no replica
  above that share of the average load, the rule of the Python ring). The key is the
  ``X-Session-Id`` header, else the prompt's first ``--affinity-chars`` bytes (the completions
  ``prompt`` string, or the chat's first message ``content``) when at least
  ``--affinity-min-chars`` long, else a random number: a keyless request lands at random within
  the bounded load. Weights carry each replica's KV-cache use (:func:`weight_for`).
* **Readiness** (:class:`DataPlaneSync`): every server starts ``disabled``; after each probe
  round the control plane sets each one ``ready`` or ``maint`` over HAProxy's runtime API (the
  ``stats socket``) from the replica's routable state (its ``/ready`` and the controller's view,
  :mod:`inferctl.router.probe`) and its weight. In-flight requests on a replica put in ``maint``
  finish.
* **Retries**: a connection refused, a connection closed before any answer byte, or a 503 is
  retried on another replica (``retry-on conn-failure empty-response 503``, ``option redispatch
  1``, ``retries`` = ``--max-retries``); nothing is retried once a byte went to the client. A
  request body larger than ``tune.bufsize`` (:data:`BUFSIZE`) is not retried, and its affinity key
  is not read (HAProxy keeps one buffer of it): it lands at random.
* **Same front door**: ``X-Request-Id`` (the client's when 1..200 visible ASCII characters, else
  a new uuid4 hex, as :func:`inferctl.contract.http.request_id`) on the request and every answer;
  ``X-Inferctl-Replica`` on answers; the ``Host`` rule of
  :func:`inferctl.contract.hosts.host_allowed` (421); 413 above ``--max-body-bytes`` (declared
  ``Content-Length``); 503 ``no_ready_replica`` with ``Retry-After`` when no replica is ready.
  The bodies are the Python router's OpenAI error objects.
* **Metrics**: the control plane reads HAProxy's ``show stat`` each round and moves the router's
  own series (:func:`apply_stats`): ``inferctl_router_requests_total`` by replica and status
  *class* (``2xx``, ``4xx``, ``5xx``...; HAProxy counts classes), ``_retries_total`` with reason
  ``dataplane`` (HAProxy's retries and redispatches; it does not say why), ``_outstanding_requests``
  (HAProxy's current requests to each). What only the Python data plane measures (the upstream
  time-to-first-byte and overhead histograms, routing decisions, rate limits) is absent here:
  no data, not 0.

Not in this mode (the CLI refuses them, exit 2): ``--api-key``, ``--upstream-api-key-env``,
``rate_limits`` and ``https://`` replicas. The request is not validated before the replica: a
bad request gets the engine's own 4xx, passed through unchanged, which is what the Python router
returns too. One model per fleet: the model named in a request does not steer the choice
(:meth:`DataPlaneSync.tick` warns when the replicas serve different models).

HAProxy: the Debian package ``haproxy`` (2.6 in bookworm); its manual:
https://docs.haproxy.org/2.6/configuration.html (configuration), .../management.html (runtime API).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from inferctl.contract.errors import APIError
from inferctl.contract.hosts import HOST_REFUSED_STATUS, HostRefused, host_name, is_loopback
from inferctl.router.config import ConfigError, RouterConfig
from inferctl.router.replicas import Replica, ReplicaSet

log = logging.getLogger("inferctl.router.dataplane")

#: The data planes ``--data-plane`` accepts.
DATA_PLANES: tuple[str, ...] = ("python", "haproxy")
#: Where Debian installs HAProxy (not on an unprivileged user's PATH).
DEBIAN_PATH = "/usr/sbin/haproxy"
#: The environment variable naming the HAProxy binary (``--haproxy auto`` looks there first).
HAPROXY_ENV = "INFERCTL_HAPROXY"
#: The router's series only the python data plane feeds (its request path measures them): with HAProxy
#: carrying the requests they are unregistered, so they are absent (no data), not a row of zeros.
PYTHON_PLANE_SERIES: tuple[str, ...] = (
    "inferctl_router_overhead_seconds", "inferctl_router_upstream_latency_seconds",
    "inferctl_router_routing_decisions_total", "inferctl_router_affinity_keys", "inferctl_router_rejected_total",
    "inferctl_router_rate_limited_total", "inferctl_router_stream_errors_total",
    "inferctl_router_client_disconnects_total")
#: HAProxy's buffer (``tune.bufsize``, bytes): a request body up to about this size is read whole
#: before routing, so its affinity key is read and it can be retried. 64 KiB: a long system prompt
#: (about 16k tokens of English) fits; HAProxy allocates buffers per connection as needed.
BUFSIZE = 65536
#: The ``POST`` paths HAProxy sends to the replicas (everything else goes to the control plane).
HOT_PATHS: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
#: HAProxy's server weight of an idle replica with an empty KV cache (range 1..256).
FULL_WEIGHT = 100
#: Seconds HAProxy's soft stop (SIGUSR1) waits for requests in flight at shutdown (``hard-stop-after``).
STOP_GRACE_SECONDS = 30.0


def is_executable(path: str) -> bool:
    """``path`` is a file this process may execute."""
    return os.path.isfile(path) and os.access(path, os.X_OK)


def haproxy_host(host: str) -> str:
    """``host`` as HAProxy's addresses and ``Host`` values write it: an IPv6 literal in brackets."""
    return f"[{host}]" if ":" in host else host


def find_haproxy(spec: str = "auto") -> str | None:
    """The HAProxy binary, or None: ``spec`` ``none`` → None; ``auto`` → ``$INFERCTL_HAPROXY``, then
    ``haproxy`` on PATH, then :data:`DEBIAN_PATH`, else None; any other value is a path (the binary,
    or a wrapper that runs it with ``exec``).

    Raises:
        FileNotFoundError: ``spec`` is a path that is not an executable file."""
    if spec == "none":
        return None
    if spec != "auto":
        if not is_executable(spec):
            raise FileNotFoundError(f"{spec!r} is not an executable file")
        return spec
    for candidate in (os.environ.get(HAPROXY_ENV), shutil.which("haproxy"), DEBIAN_PATH):
        if candidate and is_executable(candidate):
            return candidate
    return None


def fitting_maxconn(wanted: int = 4096) -> int:
    """``wanted``, lowered to what this process's hard limit on open files allows HAProxy (about
    two descriptors a connection plus a margin), at least 64. Keep it in the thousands: HAProxy
    sizes its pool of idle server connections from ``maxconn``, and at 256 64 keep-alive clients
    read 14.9–15.9 ms of added p50 against 1.0–6.2 ms at 4096 (2026-12-04, docs/benchmarks.md)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return wanted
    return max(64, min(wanted, (hard - 64) // 2))


def drop_python_plane_series(registry, metrics: Mapping) -> None:
    """Unregister :data:`PYTHON_PLANE_SERIES` from the router's ``registry`` (a prometheus-client
    ``CollectorRegistry``; ``metrics`` maps catalog names to the registered metrics)."""
    for name in PYTHON_PLANE_SERIES:
        if name in metrics:
            registry.unregister(metrics[name])


def unsupported(config: RouterConfig) -> list[str]:
    """The settings of ``config`` the HAProxy data plane does not carry (module docstring), each as
    the flag or file key an operator wrote; empty when it can run ``config``."""
    out = []
    if config.api_key is not None:
        out.append("--api-key")
    if config.upstream_api_key is not None:
        out.append("--upstream-api-key-env (or the config file's upstream_api_key_env)")
    if config.rate_keys or config.rate_default is not None:
        out.append("rate_limits (the --config file)")
    out += [f"--engine {e.name}={e.url} (https)" for e in config.engines if not e.url.startswith("http://")]
    return out


def replica_host(config: RouterConfig) -> str:
    """The ``Host`` HAProxy sends the replicas: the replicas' common host name when they share one (the
    Python router sends each replica's own), else ``localhost``. HAProxy rewrites headers before it picks
    the server, so it cannot name each one; every inferctl engine accepts a loopback name whatever it is
    bound to (:func:`inferctl.contract.hosts.host_allowed`, rule 2), and the client's own ``Host`` would be
    refused by a replica bound to loopback."""
    hosts = {urlsplit(e.url).hostname for e in config.engines}
    if len(hosts) == 1:
        (host,) = hosts
        return haproxy_host(host) if host else "localhost"
    return "localhost"


def server_address(url: str) -> str:
    """``http://host:port`` → HAProxy's ``host:port`` (an IPv6 literal in brackets, port 80 when absent).

    Raises:
        ValueError: not an ``http://`` URL with a host."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"a replica URL must be http://host[:port], got {url!r}")
    return f"{haproxy_host(parts.hostname)}:{parts.port or 80}"


def host_regex(bind_host: str, allowed_hosts: Iterable[str] = ()) -> str | None:
    """A PCRE for a lower-cased ``Host`` header value (port and one trailing dot allowed) that
    matches exactly the names :func:`inferctl.contract.hosts.host_allowed` accepts for a server
    bound to ``bind_host`` with ``allowed_hosts``; None when every name is accepted (no check).
    A request without ``Host`` is accepted in both (rule 1 there; the frontend's ACL here).

    Raises:
        ConfigError: an ``--allowed-host`` pattern with a character outside letters, digits, ``.``,
            ``-``, ``*`` and ``:`` (it would not be a host name)."""
    # host_name(): a bracketed name ends at "]" (anything after it is ignored); a plain name with one
    # ":" ends there (any port text); a plain name with more colons is the whole value
    octet = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
    plain: list[str] = [r"localhost", rf"127(\.{octet}){{3}}"]
    bracketed: list[str] = [r"0*(:0*){0,6}:0*1"]
    patterns = [p.strip().lower().rstrip(".") for p in allowed_hosts]
    for p in patterns:
        if not re.fullmatch(r"\[[0-9a-f:.]+\]|[0-9a-f.]*:[0-9a-f:.]*|[a-z0-9.*-]+", p):
            raise ConfigError(f"--allowed-host: {p!r} is not a host name pattern")
        if p == "*":
            return None
        bare = p[1:-1] if p.startswith("[") else p
        if ":" in bare:
            bracketed.append(re.escape(bare))
        elif p.startswith("*."):
            plain.append(r"[^:\[\]]+" + re.escape(p[1:]))
        else:
            plain.append(re.escape(p))
    if not is_loopback(host_name(bind_host)):
        if not patterns:
            return None
        plain.append(rf"{octet}(\.{octet}){{3}}")                 # rule 5: an IP literal
        bracketed.append(r"[0-9a-f:.]*:[0-9a-f:.]*")
    return (r"^((" + "|".join(plain) + r")\.?(:[^:]*)?|\[(" + "|".join(bracketed) + r")\.?\].*)$")


def weight_for(replica: Replica) -> int:
    """HAProxy's weight of a routable replica: :data:`FULL_WEIGHT` / (1 + KV use), the use rounded
    to quarters so a fluctuating reading does not move the hash ring every round (100, 80, 67, 57,
    50); a missing reading counts as empty, as in :func:`inferctl.router.balancer.load_score`."""
    kv = 0.0 if replica.kv_usage_ratio is None else min(1.0, max(0.0, float(replica.kv_usage_ratio)))
    return max(1, round(FULL_WEIGHT / (1.0 + round(kv * 4) / 4)))


def _error_file(err: APIError) -> str:
    return json.dumps(err.body(), separators=(",", ":")) + "\n"


#: HAProxy's own errors (``errorfile``): status → (reason phrase, message, code, OpenAI type).
HAPROXY_ERRORS: dict[int, tuple[str, str, str, str]] = {
    400: ("Bad Request", "the request could not be read as HTTP (the router's HAProxy refused it)",
          "invalid_request", "invalid_request_error"),
    408: ("Request Timeout", "the request was not received in time", "request_timeout", "invalid_request_error"),
    500: ("Internal Server Error", "the router failed on this request", "router_error", "server_error"),
    502: ("Bad Gateway", "the replica's answer was broken or invalid", "bad_gateway", "server_error"),
    503: ("Service Unavailable", "no ready replica to serve this request", "no_ready_replica",
          "service_unavailable_error"),
    504: ("Gateway Timeout", "no answer from the replica in time (--upstream-timeout)", "upstream_timeout",
          "server_error"),
}
#: The ``Host`` value in the 421 body: HAProxy's log-format, JSON-escaped, the first 100 bytes
#: (:class:`inferctl.contract.hosts.HostRefused` shows ``repr(host[:100])``).
HOST_PLACEHOLDER = "%[req.fhdr(host),bytes(0,100),json(utf8s)]"


def error_bodies(config: RouterConfig, bind_host: str, allowed_hosts: tuple[str, ...]) -> dict[str, str]:
    """The answers HAProxy gives itself, by file name: ``no_ready_replica.json`` (503),
    ``too_large.json`` (413), ``host_not_allowed.json`` (421, a log-format file: the ``Host`` value is
    filled in as the Python router's message shows it), and ``error-<status>.http`` (whole HTTP answers
    for HAProxy's own errors, :data:`HAPROXY_ERRORS`); the Python router's OpenAI error objects."""
    refused = HostRefused("\x00", bind_host, tuple(allowed_hosts))
    host_body = _error_file(APIError(HOST_REFUSED_STATUS, refused.message, param="Host", code="host_not_allowed"))
    host_body = host_body.replace("%", "%%").replace(json.dumps(repr("\x00"))[1:-1], f"'{HOST_PLACEHOLDER}'")
    out: dict[str, str] = {}
    for status, (phrase, message, code, kind) in HAPROXY_ERRORS.items():
        body = _error_file(APIError(status, message, code=code, err_type=kind)).encode()
        head = (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
                "cache-control: no-cache\r\nconnection: close\r\n\r\n")
        out[f"error-{status}.http"] = head + body.decode()
    _phrase, message, code, kind = HAPROXY_ERRORS[503]          # HAProxy's own 503 says the same
    out["no_ready_replica.json"] = _error_file(APIError(503, message, code=code, err_type=kind))
    out["too_large.json"] = _error_file(APIError(
        413, f"request body is larger than the limit of {config.max_body_bytes} bytes", code="request_too_large"))
    out["host_not_allowed.json"] = host_body
    return out


def render_config(config: RouterConfig, *, bind_host: str, port: int, control_port: int, socket_path: str,
                  files: str, allowed_hosts: tuple[str, ...] = (), maxconn: int = 4096) -> str:
    """HAProxy's configuration for the router (module docstring): the frontend on ``bind_host``:``port``,
    backend ``replicas`` (one server per engine, named as the engine, all starting ``disabled``),
    backend ``control`` (the Python app on 127.0.0.1:``control_port``), the runtime socket at
    ``socket_path`` (mode 600, admin level), the error bodies of :func:`error_bodies` in the folder
    ``files``.

    Raises:
        ValueError: a port out of 1..65535, or a replica URL that is not ``http://``.
        ConfigError: an ``--allowed-host`` pattern that is not a host name."""
    for name, value in (("port", port), ("control_port", control_port)):
        if type(value) is not int or not 1 <= value <= 65535:
            raise ValueError(f"{name} must be 1..65535, got {value!r}")
    bind = haproxy_host(bind_host)
    hosts = host_regex(bind_host, allowed_hosts)
    timeout = max(1, round(config.upstream_timeout_seconds))
    factor = max(101, round(100 * (1.0 + config.epsilon)))
    per_server = max(1, config.upstream_connections)
    json_ct = "content-type application/json"
    lines = [
        "global",
        "    nbthread 1",
        f"    maxconn {maxconn}",
        f"    tune.bufsize {BUFSIZE}",
        f"    hard-stop-after {round(STOP_GRACE_SECONDS)}s",
        # one router a port: without it a second HAProxy on a taken port would share it (SO_REUSEPORT)
        "    noreuseport",
        f"    stats socket {socket_path} mode 600 level admin",
        "defaults",
        "    mode http",
        f"    timeout connect {max(1, round(config.connect_timeout_seconds * 1000))}ms",
        f"    timeout client {timeout}s",
        f"    timeout server {timeout}s",
        "    timeout http-request 60s",
        "    timeout http-keep-alive 60s",
        "    option http-keep-alive",
        "    http-reuse always",
        *[f"    errorfile {status} {files}/error-{status}.http" for status in HAPROXY_ERRORS],
        "frontend router",
        f"    bind {bind}:{port}",
        "    acl hot_method method POST",
        f"    acl hot_path path {' '.join(HOT_PATHS)}",
        # the Python router's request id rule (contract.http.request_id): the client's when one header
        # of 1..200 visible ASCII characters, else a new uuid4 in hex
        "    http-request set-var(txn.rid) req.fhdr(x-request-id,1) "
        "if { req.fhdr(x-request-id,1) -m reg '^[!-~]{1,200}$' }",
        "    http-request set-var(txn.rid) uuid,regsub(-,,g) unless { var(txn.rid) -m found }",
        "    http-request set-header x-request-id %[var(txn.rid)]",
        "    http-after-response set-header x-request-id %[var(txn.rid)] if { var(txn.rid) -m found }",
    ]
    if hosts is not None:
        lines += [
            "    acl host_given req.fhdr(host) -m reg '[^ \t]'",      # no Host or a blank one: allowed (rule 1)
            f"    acl host_ok req.fhdr(host),lower -m reg '{hosts}'",
            f"    http-request return status {HOST_REFUSED_STATUS} {json_ct} lf-file {files}/host_not_allowed.json "
            "if hot_method hot_path host_given !host_ok",
        ]
    lines += [
        # the declared length first (no wait for a body that will be refused), then the body itself, which
        # is waited for here (the affinity key and the retries need it), so a chunked one is checked too
        f"    http-request return status 413 {json_ct} file {files}/too_large.json "
        f"if hot_method hot_path {{ req.hdr_val(content-length) gt {config.max_body_bytes} }}",
        "    http-request wait-for-body time 60s if hot_method hot_path",
        f"    http-request return status 413 {json_ct} file {files}/too_large.json "
        f"if hot_method hot_path {{ req.body_size gt {config.max_body_bytes} }}",
        "    use_backend replicas if hot_method hot_path",
        "    default_backend control",
        "backend replicas",
        "    balance hash var(txn.key)",
        "    hash-type consistent",
        f"    hash-balance-factor {factor}",
        f"    retries {config.max_retries}",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response 503",
        f"    http-request return status 503 {json_ct} file {files}/no_ready_replica.json "
        f"hdr retry-after {config.retry_after_seconds} if {{ nbsrv lt 1 }}",
        # the affinity key: the session header, else the prompt's first N bytes when long enough, else random
        f"    http-request set-header host {replica_host(config)}",
        "    http-request set-var(txn.key) req.fhdr(x-session-id),concat(s:) if { req.fhdr(x-session-id) -m reg . }",
    ]
    for path in ("$.prompt", "$.messages[0].content"):
        lines.append("    http-request set-var(txn.key) "
                     f"req.body,json_query('{path}'),bytes(0,{config.affinity_chars}) "
                     f"if !{{ var(txn.key) -m found }} {{ req.body,json_query('{path}'),length "
                     f"ge {max(1, config.affinity_min_chars)} }}")
    lines += [
        "    http-request set-var(txn.key) rand unless { var(txn.key) -m found }",
        "    http-response set-header x-inferctl-replica %[srv_name]",
    ]
    for e in config.engines:
        lines.append(f"    server {e.name} {server_address(e.url)} disabled weight {FULL_WEIGHT} maxconn {per_server}")
    lines += [
        "backend control",
        f"    server control 127.0.0.1:{control_port}",
        "",
    ]
    return "\n".join(lines)


class RuntimeApiError(Exception):
    """HAProxy's runtime API refused a command or could not be reached (the message says which)."""


@dataclass
class Runtime:
    """HAProxy's runtime API over its ``stats socket`` (a Unix socket): one command a connection
    (management guide section 9.3)."""

    socket_path: str
    timeout: float = 2.0

    async def command(self, text: str) -> str:
        """Send ``text`` (one command, no newline) and return HAProxy's whole answer.

        Raises:
            RuntimeApiError: the socket could not be reached in ``timeout`` seconds."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(self.socket_path), self.timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise RuntimeApiError(f"HAProxy runtime socket {self.socket_path}: {exc or type(exc).__name__}") from exc
        try:
            writer.write(text.encode() + b"\n")
            await writer.drain()
            return (await asyncio.wait_for(reader.read(), self.timeout)).decode(errors="replace")
        except (OSError, asyncio.TimeoutError) as exc:
            raise RuntimeApiError(f"HAProxy runtime command {text.split()[0]!r}: {exc or type(exc).__name__}") from exc
        finally:
            writer.close()


def parse_stat(text: str, backend: str = "replicas") -> dict[str, dict[str, str]]:
    """``show stat`` CSV (management guide section 9.1; the header line starts with ``# ``) → each
    server of ``backend`` by name, its fields by column name (strings as HAProxy wrote them)."""
    body = text[2:] if text.startswith("# ") else text
    rows = csv.DictReader(io.StringIO(body))
    return {row["svname"]: row for row in rows
            if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND", None)}


#: ``show stat`` columns counted into ``inferctl_router_requests_total``: the status class label.
STATUS_COLUMNS: dict[str, str] = {"hrsp_1xx": "1xx", "hrsp_2xx": "2xx", "hrsp_3xx": "3xx", "hrsp_4xx": "4xx",
                                  "hrsp_5xx": "5xx", "hrsp_other": "other"}


def _int(row: Mapping[str, str], column: str) -> int | None:
    try:
        return int(row.get(column) or "")
    except ValueError:
        return None


@dataclass
class StatCounters:
    """The last ``show stat`` counters seen, to turn HAProxy's running totals into increments
    (a total lower than the last one means HAProxy restarted: the new total is the increment)."""

    last: dict[tuple[str, str], int] = field(default_factory=dict)

    def delta(self, key: tuple[str, str], total: int) -> int:
        """The increase of ``key``'s running total since the last call."""
        before = self.last.get(key, 0)
        self.last[key] = total
        return total - before if total >= before else total


def apply_stats(stats: Mapping[str, Mapping[str, str]], replicas: ReplicaSet, metrics: Mapping,
                counters: StatCounters) -> None:
    """Move the router's series from one ``show stat`` reading (module docstring, "Metrics"):
    requests by status class, retries (``wredis``: with ``option redispatch 1`` every retry is a redispatch;
    ``wretr`` counts the same retries again; reason ``dataplane``), and each
    replica's ``outstanding`` (HAProxy's ``scur``). A server absent from ``stats`` or a column HAProxy
    left empty changes nothing (no data, not 0)."""
    for r in replicas:
        row = stats.get(r.name)
        if row is None:
            continue
        for column, status in STATUS_COLUMNS.items():
            total = _int(row, column)
            if total is not None:
                step = counters.delta((r.name, column), total)
                if step:
                    metrics["inferctl_router_requests_total"].labels(r.name, status).inc(step)
        retried = _int(row, "wredis")    # option redispatch 1: each retry is one redispatch (wretr counts it too)
        if retried is not None:
            step = counters.delta((r.name, "retries"), retried)
            if step:
                metrics["inferctl_router_retries_total"].labels(r.name, "dataplane").inc(step)
        current = _int(row, "scur")
        if current is not None:
            r.outstanding = current


@dataclass
class DataPlaneSync:
    """After each probe round: push each replica's routable state and weight to HAProxy (only what
    changed since the last push; everything again after a failed command) and read its counters.

    ``proc``: the HAProxy process (None in tests that run one apart); when it has exited,
    :meth:`tick` raises :class:`DataPlaneExited`."""

    runtime: Runtime
    replicas: ReplicaSet
    metrics: Mapping
    proc: subprocess.Popen | None = None
    log: Path | None = None
    pushed: dict[str, tuple[str, int]] = field(default_factory=dict)
    counters: StatCounters = field(default_factory=StatCounters)
    warned_models: bool = False

    def desired(self, r: Replica) -> tuple[str, int]:
        """``("ready", weight)`` for a routable replica, ``("maint", weight)`` otherwise."""
        return ("ready" if r.routable else "maint"), weight_for(r)

    async def push(self) -> int:
        """Send the state and weight commands that differ from the last push; the number sent.

        Raises:
            RuntimeApiError: HAProxy refused a command or could not be reached (the next push resends all)."""
        sent = 0
        try:
            for r in self.replicas:
                want = self.desired(r)
                if self.pushed.get(r.name) == want:
                    continue
                for cmd in (f"set server replicas/{r.name} weight {want[1]}",
                            f"set server replicas/{r.name} state {want[0]}"):
                    answer = (await self.runtime.command(cmd)).strip()
                    if answer:        # HAProxy answers these commands with an empty line when they worked
                        raise RuntimeApiError(f"HAProxy refused {cmd!r}: {answer[:200]}")
                    sent += 1
                if self.pushed.get(r.name, ("", 0))[0] != want[0]:
                    log.info("data plane: replica %s -> %s", r.name, want[0])
                self.pushed[r.name] = want
        except RuntimeApiError:
            self.pushed.clear()
            raise
        return sent

    async def read_stats(self) -> None:
        """Read ``show stat`` and apply it (:func:`apply_stats`)."""
        stats = parse_stat(await self.runtime.command("show stat"))
        apply_stats(stats, self.replicas, self.metrics, self.counters)

    def check_models(self) -> None:
        """Warn once when the routable replicas list different models (this plane routes one model)."""
        seen = {r.models for r in self.replicas.routable() if r.models is not None}
        if len(seen) > 1 and not self.warned_models:
            self.warned_models = True
            log.warning("data plane haproxy routes without reading the model: the replicas serve different models "
                        "(%s); a request may reach a replica without its model and get its 404. Use --data-plane "
                        "python for a mixed fleet", "; ".join(sorted(",".join(sorted(m)) for m in seen)))

    async def tick(self) -> None:
        """One sync: check the process, push, read the counters, check the models.

        Raises:
            DataPlaneExited: HAProxy has exited.
            RuntimeApiError: a runtime command failed."""
        if self.proc is not None and self.proc.poll() is not None:
            said = log_tail(self.log)
            raise DataPlaneExited(f"HAProxy exited with status {self.proc.returncode}" + (f": {said}" if said else ""))
        await self.push()
        await self.read_stats()
        self.check_models()


class DataPlaneExited(Exception):
    """The HAProxy process ended while the router ran."""


@dataclass
class Driver:
    """The control plane's hook after each probe round (``create_app(after_round=driver.after_round)``):
    one :class:`DataPlaneSync` over the app's replicas and metrics, made at the first round.

    * HAProxy exited while the router runs → logged as an error once, ``died`` set, the server told
      to stop (the CLI then exits 3);
    * the runtime API failed → a warning once per failing streak (the next round retries);
    * once the server got its stop signal (``server.signalled``, :func:`data_plane_server`), nothing
      is synced: HAProxy's soft stop ends it on purpose.

    ``server``: the uvicorn server (set once made; None before)."""

    runtime: Runtime
    proc: subprocess.Popen | None = None
    server: object | None = None
    log: Path | None = None
    sync: DataPlaneSync | None = None
    died: str | None = None
    failing: bool = False

    async def after_round(self, state) -> None:
        """Sync once (see the class docstring); never raises."""
        if self.server is not None and getattr(self.server, "signalled", 0):
            return
        if self.sync is None:
            self.sync = DataPlaneSync(self.runtime, state.replicas, state.metrics, proc=self.proc, log=self.log)
        try:
            await self.sync.tick()
            if self.failing:
                log.info("data plane: HAProxy's runtime API answers again")
            self.failing = False
        except DataPlaneExited as exc:
            if self.died is None:
                log.error("data plane: %s; the router stops", exc)
                self.died = str(exc)
            if self.server is not None:
                self.server.should_exit = True
        except RuntimeApiError as exc:
            if not self.failing:
                log.warning("data plane: %s (retried every probe round)", exc)
            self.failing = True


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``),
    so a router killed with SIGKILL leaves no HAProxy behind; nothing elsewhere."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)   # PR_SET_PDEATHSIG = 1


def _check_free(host: str, port: int) -> None:
    """Raise RuntimeError when nothing may listen on ``host``:``port`` now (in use, or not an address of
    this host): HAProxy would fail to bind, and the connect check of :func:`start` could reach the other
    listener and take it for HAProxy."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise RuntimeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def log_tail(path: Path | None, lines: int = 5) -> str:
    """The last ``lines`` lines of HAProxy's output file (empty when there is none)."""
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) if path else ""
    except OSError:
        return ""


def start(binary: str, cfg_text: str, workdir: Path, *, host: str, port: int, bodies: Mapping[str, str] = {},
          timeout: float = 10.0) -> subprocess.Popen:
    """Write ``haproxy.cfg`` and the error ``bodies`` under ``workdir``, check the configuration
    (``haproxy -c``), start HAProxy in the foreground (``-db``; its output to ``workdir/haproxy.log``)
    and wait until it accepts connections on ``host``:``port``.

    Raises:
        RuntimeError: ``haproxy -c`` refused the configuration, or HAProxy exited or did not listen
            within ``timeout`` seconds (stopped then; its words in the message)."""
    for name, text in bodies.items():
        (workdir / name).write_text(text, encoding="utf-8")
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(cfg_text, encoding="utf-8")
    check = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
    if check.returncode != 0:
        said = (check.stdout + check.stderr).strip()[-2000:] or f"no output (is {binary} HAProxy?)"
        raise RuntimeError(f"haproxy -c refused {cfg}: {said}")
    target = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    _check_free(target, port)
    errlog = workdir / "haproxy.log"
    with open(errlog, "wb") as out:
        # its own session: a terminal's Ctrl-C reaches the router only, which then soft-stops HAProxy
        # (a SIGINT would hard-stop it, cutting requests in flight); it dies with the router (PDEATHSIG)
        proc = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection((target, port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.05)
    code = proc.poll()
    if code is None:
        proc.kill()
        proc.wait()
    said = errlog.read_text(errors="replace").strip()[-2000:]
    raise RuntimeError(f"HAProxy ({binary}) " + (f"exited with status {code}" if code is not None else
                                                 f"did not listen on {host}:{port} in {timeout:g} s")
                       + f": {said or 'no output'}")


def stop(proc: subprocess.Popen, grace: float = STOP_GRACE_SECONDS) -> int | None:
    """Soft-stop HAProxy (SIGUSR1: it stops listening and lets requests in flight finish), SIGKILL
    after ``grace`` seconds (+2: its own ``hard-stop-after`` comes first); its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)
        try:
            proc.wait(grace + 2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def haproxy_version(binary: str) -> str:
    """``HAProxy 2.6.12-1+deb12u3`` from ``binary -v`` (plain ``HAProxy`` when it says something else)."""
    try:
        out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return "HAProxy"
    return f"HAProxy {out[2]}" if len(out) > 2 and out[0] == "HAProxy" else "HAProxy"


def data_plane_server(config, proc: subprocess.Popen, grace: float = STOP_GRACE_SECONDS):
    """A uvicorn server for the control plane whose stop signal (SIGTERM, SIGINT) first soft-stops
    HAProxy (:func:`stop`'s SIGUSR1: it stops listening, requests in flight finish, at most ``grace``
    seconds), then shuts the control plane down; the process then exits 0 (no re-raised signal). A
    second signal kills HAProxy at once. ``config``: the ``uvicorn.Config``."""
    import uvicorn

    class DataPlaneServer(uvicorn.Server):
        def __init__(self) -> None:
            super().__init__(config)
            self.signalled = 0
            self.stop_sent: float | None = None

        def handle_exit(self, sig: int, frame) -> None:   # a signal handler: no logging, no loop calls
            self.signalled += 1

        async def on_tick(self, counter: int) -> bool:
            if self.signalled and proc.poll() is None:
                if self.stop_sent is None:
                    log.info("stop signal received: HAProxy stops listening and lets requests in flight finish "
                             "(at most %g s)", grace)
                    proc.send_signal(signal.SIGUSR1)
                    self.stop_sent = time.monotonic()
                elif self.signalled > 1 or time.monotonic() - self.stop_sent > grace + 2.0:
                    log.warning("HAProxy stopped now: requests in flight are cut")
                    proc.kill()
            if self.signalled and proc.poll() is not None:
                self.should_exit = True
            return await super().on_tick(counter)

    return DataPlaneServer()
