"""The ``inferctl`` commands that run the controller in the foreground: ``inferctl up`` (the
bundled engine(s), the router with ``--replicas N``, and the controller) and ``inferctl controller
run --config FILE``. They check their flags (bad usage: one line, exit 2), pick the API's admin
token and hand over to :func:`inferctl.controller.up.serve`, whose exit code they exit with.
"""

from __future__ import annotations

from typing import Any, Optional

import typer

from inferctl.controller.admin_client import TOKEN_ENV, TokenFileOpt, _die


def _server_token(config, token: Optional[str], token_file: Optional[str]) -> tuple[Optional[str], str]:  # noqa: ANN001
    """``(token, where it came from)`` for the controller's API: ``--token-file``, else
    ``--token`` / ``$INFERCTL_ADMIN_TOKEN``, else the configuration's ``admin_token`` /
    ``admin_token_env``; None: ``serve`` generates one. A given token must pass
    :func:`inferctl.contract.http.check_admin_token` (>= 16 characters, no leading ``-``):
    exit 2 naming the flag or field otherwise."""
    from inferctl.contract.http import check_admin_token, read_token_file

    if token and token_file:
        _die("--token-file: give either --token ($INFERCTL_ADMIN_TOKEN) or --token-file, not both", code=2)
    try:
        if token_file:
            src = f"--token-file {token_file}"
            return check_admin_token(read_token_file(token_file, "--token-file"), src), src
        if token:
            src = "--token / $INFERCTL_ADMIN_TOKEN"
            return check_admin_token(token, src), src
        tok = config.token()
        if tok:
            src = "the configuration (admin_token / admin_token_env)"
            return check_admin_token(tok, src), src
    except ValueError as exc:
        _die(str(exc), code=2)
    return None, "generated"


def _run_config(config, token: Optional[str], engine_log_dir: Optional[str], token_file: Optional[str] = None,  # noqa: ANN001
                allowed_hosts: tuple[str, ...] = (), router: Any = None,
                port_flags: Optional[dict[str, str]] = None) -> None:
    from inferctl.controller.up import serve

    tok, src = _server_token(config, token, token_file)
    code = serve(config, tok, token_source=src, echo=lambda s: typer.echo(s),
                 engine_log_dir=engine_log_dir, echo_error=lambda s: typer.echo(s, err=True),
                 allowed_hosts=tuple(allowed_hosts), router=router, port_flags=port_flags)
    raise typer.Exit(code)


#: ``--token`` of ``controller run`` / ``up`` (the API's own token).
ServerTokenOpt = typer.Option(None, "--token", envvar=TOKEN_ENV,
                              help="Admin token of the controller's API (>= 16 characters; else the config's; else "
                                   "generated and printed). A flag's value is visible to every user in `ps`: prefer "
                                   f"${TOKEN_ENV} or --token-file.")
AllowedHostOpt = typer.Option([], "--allowed-host",
                              help="Accept this Host header name on the controller's API (repeatable). Bound to "
                                   "loopback, only localhost/127.0.0.1/[::1] are accepted otherwise (DNS rebinding "
                                   "guard); bound elsewhere, any name unless some are listed.")


def _load(config_path: Optional[str]):  # noqa: ANN202
    from inferctl.controller.config import ConfigError, load_config, parse_config

    try:
        return load_config(config_path) if config_path else parse_config({})
    except ConfigError as exc:
        _die(str(exc), code=2)


def controller_run(config: str = typer.Option(..., "--config", "-c", help="YAML configuration file."),
                   token: Optional[str] = ServerTokenOpt,
                   engine_log_dir: Optional[str] = typer.Option(None, "--engine-log-dir",
                                                                help="Write launched engines' output here."),
                   token_file: Optional[str] = TokenFileOpt,
                   allowed_host: list[str] = AllowedHostOpt) -> None:
    """Run the controller from a configuration file until Ctrl-C (engines it launches stop with it)."""
    _run_config(_load(config), token, engine_log_dir, token_file, tuple(allowed_host))


def up(model_arg: Optional[str] = typer.Argument(None, metavar="MODEL", show_default=False,
                                                 help="Model path (same as --model, vLLM style)."),
       model: Optional[str] = typer.Option(None, "--model", help="Model path (llama2.c .bin, HF dir or .gguf"
                                           " file); default: the built-in demo model."),
       config: Optional[str] = typer.Option(None, "--config", "-c", help="YAML configuration (engines, GPU"
                                            " source, thresholds, holds, rails)."),
       replicas: int = typer.Option(1, "--replicas", "-n", min=1, help="Engines to launch (main-0 … on ports"
                                    " --engine-port + i) behind a router; 1: one engine named main, no router."),
       router_port: int = typer.Option(8080, "--router-port", min=1, max=65535, help="The router's port."),
       with_router: Optional[bool] = typer.Option(None, "--router/--no-router", help="Start the router"
                                                  " (default: when --replicas > 1)."),
       router_data_plane: str = typer.Option("python", "--router-data-plane", metavar="python|haproxy",
                                             help="The router's --data-plane: python, or haproxy (HAProxy carries"
                                             " the requests; no API keys; needs a router: --replicas N > 1 or"
                                             " --router; docs/router.md \"Data planes\")."),
       memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="Engine memory budget, e.g."
                                                   " 512MiB or 2GiB (binary units; default: what the model needs"
                                                   " on CPU, gpu_memory_utilization of the GPU on CUDA)."),
       engine_port: Optional[int] = typer.Option(None, "--engine-port", min=1, max=65535, show_default=False,
                                                 help="The engine's port (default 8000; replicas on 8000,"
                                                      " 8001, …; with --config, its first launched engine's)."),
       controller_port: Optional[int] = typer.Option(None, "--controller-port", min=0, max=65535,
                                                     show_default=False,
                                                     help="The controller's API port (default 8900, or the"
                                                          " config's listen.port; 0: any free port)."),
       token: Optional[str] = ServerTokenOpt,
       token_file: Optional[str] = TokenFileOpt,
       allowed_host: list[str] = AllowedHostOpt,
       engine_log_dir: Optional[str] = typer.Option(None, "--engine-log-dir",
                                                    help="Write the engines' (and router's) output here."),
       engine_arg: list[str] = typer.Option([], "--engine-arg", help="Extra `inferctl engine serve` argument"
                                            " (repeatable), e.g. --engine-arg=--max-num-seqs=32.")) -> None:
    """Start the bundled engine(s), the router and the controller; print their URLs (the router's
    first: the one clients use); run until Ctrl-C.

    Without --config: --replicas bundled engines ("main", or main-0 … main-N-1), the GPU source
    "auto" (NVML, else the simulated GPU), default policies. With --config: that file, with
    --model, --memory-budget and --engine-port applied to its first launched engine.
    """
    from inferctl.controller.config import ConfigError
    from inferctl.controller.router_launch import RouterSpec
    from inferctl.controller.up import UP_PORT_FLAGS
    from inferctl.controller.up_flags import up_config, up_flags

    from inferctl.contract.envflags import check_switches

    try:
        # the engines up launches inherit this environment: a bad INFERCTL_* switch is said here,
        # before anything starts, rather than as "engine 'main-0' refused its command line"
        check_switches()
        model = up_flags(model_arg, model, memory_budget)
        final = up_config(_load(config), from_file=bool(config), replicas=replicas, model=model,
                          memory_budget=memory_budget, engine_port=engine_port, engine_args=list(engine_arg),
                          controller_port=controller_port)
    except (ConfigError, ValueError) as exc:
        _die(str(exc), code=2)
    if router_data_plane not in ("python", "haproxy"):
        _die(f"--router-data-plane: {router_data_plane!r} is not one of python, haproxy", code=2)
    router = RouterSpec(final.listen.host, router_port, router_data_plane) \
        if (replicas > 1 if with_router is None else with_router) else None
    if router_data_plane != "python":
        from inferctl.controller.up import router_plane_problem
        problem = router_plane_problem(router, final)
        if problem:
            _die(problem, code=2)
    _run_config(final, token, engine_log_dir, token_file, tuple(allowed_host), router=router,
                port_flags=UP_PORT_FLAGS)
