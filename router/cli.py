"""``inferctl router``: serve the router with uvicorn (``register(app)`` adds the command).

Exit codes: 0 after a clean stop (SIGINT/SIGTERM), 2 for a bad flag (the message names it),
3 when uvicorn could not start (port taken).
"""

from __future__ import annotations

from typing import List, Optional

import typer

from inferctl.contract.hosts import check_bind_host
from inferctl.contract.units import parse_size
from inferctl.contract.logs import check_log_level
from inferctl.router.config import ConfigError, RouterConfig, load_config_file, parse_engine, upstream_key_from_env

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
    configure_router_logging(config.log_format, log_level)
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


def register(app: typer.Typer) -> None:
    """Attach ``router`` to the ``inferctl`` typer app."""
    app.command("router")(router)
