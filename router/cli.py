"""``inferctl router``: serve the router with uvicorn (``register(app)`` adds the command).

Exit codes: 0 after a clean stop (SIGINT/SIGTERM), 2 for a bad flag (the message names it),
3 when uvicorn could not start (port taken).
"""

from __future__ import annotations

import subprocess
from typing import List, Optional

import typer

from inferctl.contract.hosts import check_bind_host
from inferctl.contract.units import parse_size
from inferctl.contract.logs import check_log_level
from inferctl.router.config import ConfigError, RouterConfig, load_config_file, parse_engine, upstream_key_from_env
from inferctl.router.dataplane import DATA_PLANES

#: Third-party loggers quieted to WARNING unless ``--log-level debug``: httpx logs every request
#: it sends at INFO ("HTTP Request: GET http://.../ready"), i.e. every probe of every replica.
NOISY_LOGGERS = ("httpx", "httpcore")


def configure_router_logging(log_format: str, log_level: str) -> None:
    """The router's logging: the root logger (contract/logs.py) at ``log_level``, and the
    :data:`NOISY_LOGGERS` at WARNING unless ``log_level`` is ``debug`` (then they follow the root)."""
    import logging

    from inferctl.contract.logs import configure_logging

    configure_logging(log_format, log_level)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if log_level.lower() == "debug" else logging.WARNING)


def router(
    engine: List[str] = typer.Option([], "--engine", help="A replica as NAME=URL (repeat for each replica; "
                                     "added to the --config file's engines)."),
    config_file: Optional[str] = typer.Option(None, "--config", help="A YAML file: engines, controller, "
                                              "rate_limits (per-key requests/tokens per minute); docs/router.md."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", min=1, max=65535, help="Port to listen on."),
    controller: Optional[str] = typer.Option(None, "--controller",
                                             help="The controller's base URL: its /status view blocks engines "
                                                  "it reports draining, isolated, restarting or down."),
    probe_interval: float = typer.Option(1.0, "--probe-interval", help="Seconds between readiness probes."),
    probe_timeout: float = typer.Option(1.0, "--probe-timeout", help="Deadline of one probe (s)."),
    max_retries: int = typer.Option(2, "--max-retries",
                                    help="Other replicas tried when one refuses before the first byte."),
    affinity_chars: int = typer.Option(256, "--affinity-chars",
                                       help="Prompt characters hashed for prefix affinity (N)."),
    affinity_min_chars: int = typer.Option(32, "--affinity-min-chars",
                                           help="Shorter prompts go to the least-loaded replica."),
    epsilon: float = typer.Option(0.25, "--epsilon",
                                  help="Bounded-load slack: skip a replica above (1+eps) x the average load."),
    max_body_bytes: str = typer.Option("4MiB", "--max-body-bytes",
                                       help="Largest request body (413 above); at most 1GiB."),
    upstream_timeout: float = typer.Option(600.0, "--upstream-timeout",
                                           help="Seconds to wait for the next upstream byte."),
    upstream_connections: int = typer.Option(1000, "--upstream-connections",
                                             help="Most upstream connections open at once (all replicas; "
                                                  "each in-flight request holds one)."),
    log_format: str = typer.Option("text", "--log-format", help="text | json (one JSON object per line)."),
    log_level: str = typer.Option("info", "--log-level", help="debug | info | warning | error | critical (any "
                                                             "case); httpx's per-probe request lines show "
                                                             "only at debug."),
    upstream_api_key_env: Optional[str] = typer.Option(
        None, "--upstream-api-key-env", metavar="NAME",
        help="The environment variable holding the replicas' API key (their --api-key), sent on the router's "
             "probes (and, with --api-key, on forwarded requests in place of the client's key); never the key "
             "itself on the command line (docs/router.md \"API keys\")."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="INFERCTL_API_KEY",
                                          help="Require 'Authorization: Bearer <key>' on /v1/* (401 otherwise, as "
                                               "the engine); /health, /ready, /metrics stay open. Prefer "
                                               "$INFERCTL_API_KEY (a flag is visible in `ps`)."),
    allowed_host: List[str] = typer.Option([], "--allowed-host",
                                           help="A Host name clients may use (repeat; default: loopback names "
                                                "when bound to loopback, any name otherwise)."),
    data_plane: str = typer.Option("python", "--data-plane", metavar="python|haproxy",
                                   help="python: this process carries the requests (every feature); haproxy: "
                                        "HAProxy carries them and this process drives it (about a fifth of the "
                                        "CPU a request; no --api-key, upstream key, rate limits or https:// "
                                        "replicas, and one model per fleet; docs/router.md \"Data planes\")."),
    haproxy: str = typer.Option("auto", "--haproxy", metavar="PATH",
                                help="The HAProxy binary of --data-plane haproxy (auto: $INFERCTL_HAPROXY, "
                                     "PATH, /usr/sbin/haproxy)."),
) -> None:
    """Serve the OpenAI-compatible router in front of engine replicas (docs/router.md)."""
    import uvicorn

    from inferctl.router.app import create_app

    try:
        log_level = check_log_level(log_level)
        check_bind_host(host)   # exit 2 naming --host (uvicorn's getaddrinfo failure exited 3)
        from_file = load_config_file(config_file) if config_file else {"engines": [], "controller": None,
                                                                          "rate_keys": {}, "rate_default": None,
                                                                          "upstream_api_key": None}
        upstream_key = (upstream_key_from_env(upstream_api_key_env) if upstream_api_key_env
                        else from_file["upstream_api_key"])
        config = RouterConfig(
            engines=tuple(from_file["engines"]) + tuple(parse_engine(e) for e in engine),
            controller=controller or from_file["controller"],
            rate_keys=from_file["rate_keys"], rate_default=from_file["rate_default"],
            probe_interval_seconds=probe_interval, probe_timeout_seconds=probe_timeout, max_retries=max_retries,
            affinity_chars=affinity_chars, affinity_min_chars=affinity_min_chars, epsilon=epsilon,
            max_body_bytes=parse_size(max_body_bytes, "--max-body-bytes"),
            upstream_timeout_seconds=upstream_timeout, upstream_connections=upstream_connections,
            log_format=log_format, upstream_api_key=upstream_key, api_key=api_key).validate()
    except (ConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if data_plane not in DATA_PLANES:
        typer.echo(f"error: --data-plane: {data_plane!r} is not one of {', '.join(DATA_PLANES)}", err=True)
        raise typer.Exit(2)
    configure_router_logging(config.log_format, log_level)
    if data_plane == "haproxy":
        _serve_haproxy(config, host=host, port=port, allowed_hosts=tuple(allowed_host), log_level=log_level,
                       binary_spec=haproxy)
        return
    app = create_app(config, bind_host=host, allowed_hosts=tuple(allowed_host))
    # "routing", not "router:": under `inferctl up --replicas N` this line follows up's own
    # "router: URL" line, and two "router:" lines read as the URL printed twice
    typer.echo(f"routing http://{host}:{port} -> {', '.join(f'{e.name}={e.url}' for e in config.engines)}",
               err=True)
    # proxy_headers off: the router reads no client address or scheme, so uvicorn's X-Forwarded-*
    # middleware would be one more ASGI layer on every request for nothing (uvloop and httptools,
    # pinned in pyproject, are picked by uvicorn's "auto" settings)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(),
                                           access_log=False, log_config=None, proxy_headers=False))
    server.run()
    if not server.started:
        raise typer.Exit(3)


def _haproxy_binary(spec: str) -> str:
    """The HAProxy binary of ``--haproxy`` (exit 2 naming the flag when there is none)."""
    import os

    from inferctl.router.dataplane import HAPROXY_ENV, find_haproxy, is_executable

    named = os.environ.get(HAPROXY_ENV)
    if spec == "auto" and named and not is_executable(named):
        typer.echo(f"error: ${HAPROXY_ENV}: {named!r} is not an executable file (unset it, or give --haproxy PATH)",
                   err=True)
        raise typer.Exit(2)
    try:
        binary = find_haproxy(spec)
    except FileNotFoundError as exc:
        typer.echo(f"error: --haproxy: {exc}", err=True)
        raise typer.Exit(2)
    if binary is None:
        typer.echo("error: --data-plane haproxy: no HAProxy binary found ($INFERCTL_HAPROXY, PATH, /usr/sbin/haproxy); "
                   "install it (apt-get install haproxy) or give --haproxy PATH", err=True)
        raise typer.Exit(2)
    return binary


def _serve_haproxy(config: RouterConfig, *, host: str, port: int, allowed_hosts: tuple[str, ...], log_level: str,
                   binary_spec: str) -> None:
    """``--data-plane haproxy``: HAProxy on ``host``:``port`` carries the requests; this process serves
    the rest on a private loopback port and drives HAProxy (:mod:`inferctl.router.dataplane`). Exit 2
    for a setting HAProxy does not carry or no binary, 3 when HAProxy could not start or died."""
    import shutil
    import socket
    import tempfile
    from pathlib import Path

    import uvicorn

    from inferctl.router import dataplane as dp
    from inferctl.router.app import create_app

    problems = dp.unsupported(config)
    if problems:
        typer.echo(f"error: --data-plane haproxy does not carry {'; '.join(problems)}: use --data-plane python "
                   "(docs/router.md \"Data planes\")", err=True)
        raise typer.Exit(2)
    binary = _haproxy_binary(binary_spec)
    control = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    control.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    control.bind(("127.0.0.1", 0))
    control_port = control.getsockname()[1]
    workdir = Path(tempfile.mkdtemp(prefix="inferctl-router-"))
    try:
        try:
            cfg = dp.render_config(config, bind_host=host, port=port, control_port=control_port,
                                   socket_path=str(workdir / "haproxy.sock"), files=str(workdir),
                                   allowed_hosts=allowed_hosts, maxconn=dp.fitting_maxconn())
        except (ConfigError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2)
        try:
            proc = dp.start(binary, cfg, workdir, host=host, port=port,
                            bodies=dp.error_bodies(config, host, allowed_hosts))
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            typer.echo(f"error: --data-plane haproxy: {exc}", err=True)
            raise typer.Exit(3)
        driver = dp.Driver(dp.Runtime(str(workdir / "haproxy.sock")), proc, log=workdir / "haproxy.log")
        app = create_app(config, bind_host=host, allowed_hosts=allowed_hosts, after_round=driver.after_round)
        dp.drop_python_plane_series(app.state.router.registry, app.state.router.metrics)
        typer.echo(f"routing http://{host}:{port} -> {', '.join(f'{e.name}={e.url}' for e in config.engines)} "
                   f"(data plane: {dp.haproxy_version(binary)}, {binary})", err=True)
        server = dp.data_plane_server(uvicorn.Config(app, host="127.0.0.1", port=control_port,
                                                     log_level=log_level.lower(), access_log=False, log_config=None,
                                                     proxy_headers=False), proc)
        driver.server = server
        try:
            server.run(sockets=[control])
        finally:
            dp.stop(proc)
        if driver.died or not server.started:
            raise typer.Exit(3)
    finally:
        control.close()
        shutil.rmtree(workdir, ignore_errors=True)


def register(app: typer.Typer) -> None:
    """Attach ``router`` to the ``inferctl`` typer app."""
    app.command("router")(router)
