"""A compiled reference proxy for ``python -m bench.router``'s overhead part: HAProxy.

The router's overhead target (≤ 2 ms added p50 at 64 closed-loop clients, issue 9) is read
against going straight to the engine. What any extra HTTP hop costs on the same host, in the same
rounds and the same CPU placement, is the floor no router can go under; HAProxy (C, one thread,
about 40–60 µs of CPU a request here) measures it. It is a benchmark reference only: the router
itself stays ``inferctl router``.

HAProxy comes from the Debian package ``haproxy`` (``apt-get install haproxy``; 2.6 in bookworm).
Its configuration does the work a router must do at least: HTTP/1.1 keep-alive both ways
(``http-reuse always``), the whole request body read before it is forwarded
(``option http-buffer-request``, as the router reads and validates it), one log line a request
with its timings (:data:`TIMING_PREFIX`; the engine's part apart from the proxy's); one thread,
like the router's one event loop. HAProxy's configuration manual:
https://docs.haproxy.org/2.6/configuration.html
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from inferctl.router.dataplane import DEBIAN_PATH, fitting_maxconn, haproxy_version  # noqa: F401 - one copy
from inferctl.router.dataplane import find_haproxy as _find_haproxy
from inferctl.router.dataplane import haproxy_host
from inferctl.router.dataplane import start as _start

def find_haproxy(spec: str = "auto") -> str | None:
    """The HAProxy binary to use, or None (:func:`inferctl.router.dataplane.find_haproxy`: ``none``,
    ``auto`` or a path; a wrapper must run HAProxy with ``exec``: the bench reads the started
    process's pid for its CPU, pins it and stops it, so a wrapper that forks would leave HAProxy
    running and measure the shell).

    Raises:
        FileNotFoundError: ``spec`` is a path that is not an executable file (the message names
            ``--reference-proxy``)."""
    try:
        return _find_haproxy(spec)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"--reference-proxy: {exc}") from None


def haproxy_config(port: int, upstream: str, maxconn: int = 4096) -> str:
    """HAProxy's configuration: listen on 127.0.0.1:``port``, forward every request to ``upstream``
    (``http://HOST:PORT``, the engine), ``maxconn`` connections at most (HAProxy asks for about two
    file descriptors per connection at start and exits when the hard limit is lower: :func:`fitting_maxconn`).
    Keep it in the thousands: HAProxy sizes its pool of idle server connections from it (the
    ``tune.pool-*-fd-ratio`` settings), and at ``maxconn 256`` 64 keep-alive clients read 14.89 and 15.88 ms
    of added p50 against 0.99–6.22 ms at 4096 in the same rounds (2026-12-04, docs/benchmarks.md).

    Raises:
        ValueError: ``upstream`` is not an ``http://host:port`` URL, or ``port`` / ``maxconn`` out of range."""
    try:
        parts = urlsplit(upstream)
        upstream_port = parts.port
    except ValueError:          # urllib's "Port out of range" / "could not be cast"
        upstream_port = None
    if parts.scheme != "http" or not parts.hostname or not upstream_port:
        raise ValueError(f"upstream must be http://HOST:PORT, got {upstream!r}")
    if type(port) is not int or not 1 <= port <= 65535:
        raise ValueError(f"port must be 1..65535, got {port}")
    if type(maxconn) is not int or not 1 <= maxconn <= 100_000:
        raise ValueError(f"maxconn must be 1..100000, got {maxconn}")
    return "\n".join([
        "global",
        "    nbthread 1",
        f"    maxconn {maxconn}",
        "    log stdout format raw local0",
        "defaults",
        "    mode http",
        "    log global",
        f'    log-format "{TIMING_PREFIX} %Tr %Ta"',
        "    timeout connect 2s",
        "    timeout client 600s",
        "    timeout server 600s",
        "    option http-keep-alive",
        "    http-reuse always",
        "frontend reference",
        f"    bind 127.0.0.1:{port}",
        "    option http-buffer-request",
        "    default_backend engine",
        "backend engine",
        f"    server engine {haproxy_host(parts.hostname)}:{upstream_port}",
        "",
    ])


#: Each request's line in HAProxy's output (its log to stdout): the prefix, then ``%Tr`` (ms from the
#: request sent to the server to its response headers: the engine's part) and ``%Ta`` (ms from
#: the request's first byte to the response's last, the proxy's part included). Custom log
#: format: https://docs.haproxy.org/2.6/configuration.html#8.2.4
TIMING_PREFIX = "inferctl-timing"


def _timing_lines(log: Path) -> list[list[str]]:
    """The timing lines ``log`` (``haproxy.log``) holds now, each split in words (none when it does not exist)."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [line.split() for line in text.splitlines() if line.startswith(TIMING_PREFIX)]


def timings_seen(log: Path) -> int:
    """How many timing lines ``log`` (``haproxy.log``) holds now (0 when it does not exist)."""
    return len(_timing_lines(log))


def server_times(log: Path, skip: int, expect: int, wait: float = 2.0) -> list[float]:
    """The ``%Tr`` values (ms, the engine's time to response headers as HAProxy saw it) of the timing
    lines after the first ``skip``, waiting up to ``wait`` seconds for ``expect`` such values (HAProxy
    writes each line when its request ends); a line with ``-1`` (no response: a connection closed
    without a request, as :func:`start_haproxy`'s readiness check) is left out."""
    deadline = time.monotonic() + wait
    while True:
        times = [float(f[1]) for f in _timing_lines(log)[skip:] if len(f) == 3 and re.fullmatch(r"[0-9]+", f[1])]
        if len(times) >= expect or time.monotonic() > deadline:
            return times
        time.sleep(0.05)


def start_haproxy(binary: str, port: int, upstream: str, workdir: Path, maxconn: int = 4096,
                  timeout: float = 10.0) -> subprocess.Popen:
    """Write the configuration under ``workdir`` (``haproxy.cfg``), check it (``haproxy -c``),
    start HAProxy in the foreground (``-db``), its output to ``workdir/haproxy.log``, and wait
    until it accepts connections on ``port``.

    Raises:
        RuntimeError: ``haproxy -c`` refused the configuration, or HAProxy exited or did not listen
            within ``timeout`` seconds (its output in the message; it is stopped)."""
    return _start(binary, haproxy_config(port, upstream, maxconn), workdir, host="127.0.0.1", port=port,
                  timeout=timeout)
