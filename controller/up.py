"""Run the whole controller in the foreground: ``inferctl up`` and ``inferctl controller run``.

:func:`serve` binds the API socket, prints the router's URL first when asked for one
(``inferctl up --replicas N``: :class:`~controller.router_launch.RouterSpec`,
:func:`~controller.up_flags.up_config`), builds the running parts
(:func:`~controller.runtime.build_runtime`) and prints the engine URLs as they become healthy,
starts the router (after the engines, so that the controller answers its first reads), prints
the controller's URL, serves until SIGINT/SIGTERM, then shuts down in order — the API stops, the
loop stops (running actions finish), each launched engine gets SIGTERM (SIGKILL after its
``stop_timeout_seconds``), the router stops last. A port in use is said before anything starts
(:func:`check_ports_free`). The controller never imports the engine or the router: they run as
``python -m inferctl engine serve ...`` / ``python -m inferctl router ...`` subprocesses and are
reached over HTTP.

The parts ``inferctl up`` is made of live in their own modules: ``controller/runtime.py``
(:func:`build_runtime`, :class:`Runtime`, the policies and the GPU source),
``controller/router_launch.py`` (the router's command line and keys) and
``controller/up_flags.py`` (the configuration made from ``inferctl up``'s flags).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Callable

from inferctl.contract.http import generate_admin_token
from inferctl.controller.actions import EngineSupervisor
from inferctl.controller.config import ConfigError, ControllerConfig
from inferctl.controller.heap import freeze_startup_heap
from inferctl.controller.router_launch import UPSTREAM_KEY_ENV, RouterSpec, router_argv, router_env
from inferctl.controller.router_watch import RouterWatch
from inferctl.controller.runtime import Runtime, build_runtime
from inferctl.controller.supervisor import find_owned, owner_key


def check_log_dir(path: str | Path | None, flag: str = "--engine-log-dir") -> None:
    """Raise :class:`ConfigError` naming ``flag`` unless ``path`` (None: not given) is a
    directory this process can write, creating it when missing (an existing file there was
    errno 17 from the first launch, exit 1)."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag}: {str(p)!r} is a file, not a directory; give a directory for the"
                          " engines' logs (created when missing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot create the directory {str(p)!r} ({exc.strerror or exc})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: the directory {str(p)!r} is not writable")


def generate_token() -> str:
    """A fresh admin token: :func:`inferctl.contract.http.generate_admin_token` (192 bits, hex)."""
    return generate_admin_token()


#: Why ``--router-data-plane haproxy`` cannot run a fleet with API keys.
HAPROXY_KEYS_REFUSED = ("router: --router-data-plane haproxy does not carry API keys ($INFERCTL_API_KEY or the "
                        "engines' launch.api_key): use --router-data-plane python (docs/router.md \"Data planes\")")


def router_plane_problem(spec: RouterSpec | None, config: ControllerConfig) -> str | None:
    """Why ``inferctl up`` cannot start the router's ``--router-data-plane`` it was given, said before
    anything starts (None: it can): no router at all (one replica without ``--router``), or API keys
    (the shell's ``$INFERCTL_API_KEY`` or the engines' ``launch.api_key``) with the haproxy plane, which
    does not carry them (docs/router.md "Data planes"). The bad key cases of :func:`router_env` are
    said as they are."""
    if spec is None:
        return ("--router-data-plane: no router is started (one replica): add --replicas N (N > 1) or --router")
    try:
        keys = router_env(config)
    except RuntimeError as exc:
        return str(exc)
    return HAPROXY_KEYS_REFUSED if spec.data_plane == "haproxy" and keys else None


def _start_router(spec: RouterSpec, config: ControllerConfig, controller_url: str,
                  log_dir: str | Path | None) -> EngineSupervisor:
    """Start the router (port checked free first) and wait for its ``/health``; RuntimeError
    when it cannot start."""
    env = router_env(config)
    if spec.data_plane == "haproxy" and env:     # up's CLI said so before starting (router_plane_problem)
        raise RuntimeError(HAPROXY_KEYS_REFUSED)
    _bind(spec.host, spec.port).close()      # a port in use is said here, not by a timeout
    engines = [(e.name, e.url or "") for e in config.engines if e.launch is not None]
    if not engines:
        raise RuntimeError("router: no launched engine to route to")
    log_path = None if log_dir is None else Path(log_dir) / "router.log"
    sup = EngineSupervisor("router", router_argv(spec, engines, controller_url,
                                                 UPSTREAM_KEY_ENV if UPSTREAM_KEY_ENV in env else None),
                           _url(spec.host, spec.port), env=env or None,
                           health_timeout_seconds=60.0, stop_timeout_seconds=10.0, log_path=log_path)
    sup.start()
    return sup


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"listen: cannot bind {host}:{port} ({exc.strerror or exc})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


#: ``inferctl up``'s flags for each server's port (:func:`check_ports_free`)
UP_PORT_FLAGS = {"controller": "--controller-port", "engine": "--engine-port", "router": "--router-port"}


def check_ports_free(config: ControllerConfig, router: RouterSpec | None = None,
                     flags: dict[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` ``port P (ROLE) is in use on HOST; choose another with FIX`` for
    the first port the controller, a launched engine or the router would listen on that cannot be
    bound now. ``flags`` maps a role (controller, engine, router) to the flag that changes its
    port (``inferctl up``: :data:`UP_PORT_FLAGS`); without one the configuration key is named.
    Port 0 (any free port) and an engine a previous controller left running (it is adopted or
    stopped: :func:`~controller.supervisor.find_owned`) are not checked."""
    flags = flags or {}
    checks = [(config.listen.host, config.listen.port, "controller",
               flags.get("controller", "listen.port in the configuration"))]
    for i, e in enumerate(config.engines):
        if e.launch is None or (config.event_log != ":memory:" and find_owned(owner_key(config.event_log, e.name))):
            continue
        role = "engine" if e.name == "main" else f"engine {e.name}"
        checks.append((e.launch.host, e.launch.port, role,
                       flags.get("engine", f"engines[{i}].launch.port in the configuration")))
    if router is not None:
        checks.append((router.host, router.port, "router", flags.get("router", "--router-port")))
    for host, port, role, fix in checks:
        if not port:
            continue
        try:
            _bind(host, port).close()
        except RuntimeError:
            raise ConfigError(f"port {port} ({role}) is in use on {host}; choose another with {fix}"
                              + (" N" if fix.startswith("--") else "")) from None


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(config: ControllerConfig, admin_token: str | None = None, *, token_source: str = "config",
          echo: Callable[[str], None] = print, engine_log_dir: str | Path | None = None,
          echo_error: Callable[[str], None] | None = None, allowed_hosts: tuple[str, ...] = (),
          router: RouterSpec | None = None, port_flags: dict[str, str] | None = None) -> int:
    """Run the controller (and its launched engines, and with ``router`` the router in front of
    them) until SIGINT/SIGTERM. Returns 0 on a clean stop, 2 when the configuration cannot be
    used (:class:`ConfigError`: the field or flag is named; an ``engine_log_dir`` that is no
    directory; an engine that exits 2 at start, :class:`~controller.runtime.EngineUsageError`),
    1 when startup failed otherwise (a port in use, an engine or the router that did not start).
    The reason is one line through ``echo_error`` (default ``echo``), never raised. The router's
    URL (the one clients use) is printed first; on the way out the router stops last, after the
    engines drained. A port in use is said first, before anything starts
    (:func:`check_ports_free` with ``port_flags``: exit 2)."""
    echo_error = echo_error or echo
    import uvicorn

    stop = {"signal": None}

    def interrupt(signum: int, _frame: Any) -> None:   # during startup: unwind at once
        stop["signal"] = signum
        raise KeyboardInterrupt

    def note(signum: int, _frame: Any) -> None:        # after uvicorn: just remember it
        stop["signal"] = signum

    old = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    token = admin_token or generate_token()
    runtime: Runtime | None = None
    sock: socket.socket | None = None
    router_sup: EngineSupervisor | None = None
    watch: RouterWatch | None = None
    try:
        check_log_dir(engine_log_dir)
        check_ports_free(config, router, port_flags)
        sock = _bind(config.listen.host, config.listen.port)
        port = sock.getsockname()[1]
        if router is not None:      # said first (the URL clients use); started once the controller can answer
            echo(f"router:     {_url(router.host, router.port)}  (the URL clients use; OpenAI API under /v1)")

        def started(name: str, sup: EngineSupervisor) -> None:
            echo(f"engine:     {sup.base_url}  ({name}, pid {sup.pid})")

        runtime = build_runtime(config, token, engine_log_dir=engine_log_dir, on_engine_started=started,
                                allowed_hosts=allowed_hosts)
        for e in config.engines:
            if e.launch is None:
                echo(f"watching:   {e.url}  ({e.name}, {e.kind})")
        if router is not None:
            # after the engines: the router reads the controller's /status from its start, and
            # the API answers as soon as uvicorn serves the bound socket below (a router started
            # before a slow model load warned "controller unreachable" on a healthy start)
            router_sup = _start_router(router, config, _url(config.listen.host, port), engine_log_dir)
        freeze_startup_heap()           # the start-up heap out of every full GC (controller/heap.py)
        runtime.controller.start()
        if router_sup is not None:      # a router that exits on its own is started again
            watch = RouterWatch(router_sup, runtime.controller.event_log, echo)
            watch.start()
        if runtime.maintenance is not None:
            runtime.maintenance.start()
        echo(f"controller: {_url(config.listen.host, port)}  (/status /events /metrics; actions need the token)")
        if admin_token is None:
            echo(f"admin token: {token}")
            echo(f"  use it:   export INFERCTL_ADMIN_TOKEN={token}; inferctl status"
                 f" --url {_url(config.listen.host, port)}")
        else:
            echo(f"admin token: from {token_source}")
        echo("Ctrl-C to stop")
        server = uvicorn.Server(uvicorn.Config(runtime.app, log_level="warning", access_log=False,
                                               lifespan="off"))
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, note)
        server.run(sockets=[sock])
        return 0
    except KeyboardInterrupt:
        return 0
    except ConfigError as exc:
        echo_error(f"error: {exc}")
        return 2
    except (RuntimeError, ValueError, OSError) as exc:
        echo_error(f"error: {exc}")
        return 1
    finally:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, note)          # a second Ctrl-C must not break the shutdown
        if watch is not None:
            watch.stop()
        if runtime is not None:
            echo("stopping: controller, then engine(s)" + (", then the router" if router_sup else ""))
            runtime.close()
        if router_sup is not None:
            router_sup.stop()
        if sock is not None:
            sock.close()
        for s, h in old.items():
            signal.signal(s, h)
        if runtime is not None or router_sup is not None:
            echo("stopped")
        sys.stdout.flush()
