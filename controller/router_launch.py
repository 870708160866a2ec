"""The router ``inferctl up --replicas N`` starts in front of its launched engines: where it
listens (:class:`RouterSpec`), its command line (:func:`router_argv`: ``python -m inferctl
router`` as a supervised subprocess, the controller never imports the router) and the API keys
handed to it in its environment, never on its command line (:func:`router_env`,
:func:`upstream_key`; docs/router.md "API keys"). :func:`inferctl.controller.up.serve` starts it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping

from inferctl.contract.http import check_api_key
from inferctl.controller.config_launch import API_KEY_ENV, launch_env
from inferctl.controller.config import ControllerConfig

#: where ``inferctl up --replicas N`` (N > 1) puts the router (``--router-port``)
DEFAULT_ROUTER_PORT = 8080


@dataclass(frozen=True)
class RouterSpec:
    """The router ``inferctl up`` starts in front of its launched engines (``inferctl router`` as
    a supervised subprocess: the controller never imports the router)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_ROUTER_PORT
    #: the router's ``--data-plane`` (``python`` or ``haproxy``; ``inferctl up --router-data-plane``)
    data_plane: str = "python"


#: the variable ``inferctl up`` hands the launched engines' API key to its router in (never argv)
UPSTREAM_KEY_ENV = "INFERCTL_UPSTREAM_API_KEY"


def router_argv(spec: RouterSpec, engines: list[tuple[str, str]], controller_url: str,
                upstream_key_env: str | None = None) -> list[str]:
    """``python -m inferctl router`` in front of ``engines`` (name, URL), reading the
    controller's ``/status`` (docs/router.md), logging warnings and errors only;
    ``upstream_key_env``: the variable that holds the engines' API key (``--upstream-api-key-env``)."""
    argv = [sys.executable, "-m", "inferctl", "router", "--host", spec.host, "--port", str(spec.port)]
    if spec.data_plane != "python":
        argv += ["--data-plane", spec.data_plane]
    for name, url in engines:
        argv += ["--engine", f"{name}={url}"]
    if upstream_key_env:
        argv += ["--upstream-api-key-env", upstream_key_env]
    return argv + ["--controller", controller_url, "--log-level", "warning"]


def upstream_key(config: ControllerConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key of the launched engines, which their router sends on its probes: each one's
    ``launch.api_key`` / ``launch.api_key_env``, else the ``$INFERCTL_API_KEY`` it inherits from
    ``environ`` (default ``os.environ``: ``INFERCTL_API_KEY=... inferctl up --replicas N``); None
    when none has one. Raises ``RuntimeError`` when two launched engines have different keys (one
    router holds one key) and ``ValueError`` for an unusable key
    (:func:`~inferctl.controller.config_launch.launch_env`)."""
    inherited = (os.environ if environ is None else environ).get(API_KEY_ENV) or None
    keys = {k for e in config.engines if e.launch is not None
            for k in [launch_env(e.launch).get(API_KEY_ENV) or inherited] if k}
    if len(keys) > 1:
        raise RuntimeError("router: the launched engines have different API keys (launch.api_key /"
                           " api_key_env): one router sends one key to every replica")
    return next(iter(keys), None)


def router_env(config: ControllerConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The API keys ``inferctl up`` hands its router, explicitly (docs/router.md "API keys": one key
    at the front door). ``environ``: the shell's environment (default ``os.environ``).

    * ``INFERCTL_API_KEY`` (the router's own ``--api-key``, what clients send): the shell's
      ``$INFERCTL_API_KEY`` when set, else the launched engines' key (:func:`upstream_key`), so
      a fleet whose engines need a key is never open at the router; absent when neither exists.
    * :data:`UPSTREAM_KEY_ENV` (``--upstream-api-key-env``): the launched engines' key, which the
      router sends on its probes and, as it admitted the client with its own key, in place of
      the client's ``Authorization`` on forwarded requests.

    So ``INFERCTL_API_KEY=K`` in the shell with engines on ``launch.api_key: E`` gives clients one
    key, K; the router talks to the engines with E. The router's environment otherwise inherits
    the shell's, and the shell's ``$INFERCTL_API_KEY`` is the only value its key could inherit,
    which this sets explicitly. Raises ``RuntimeError`` naming ``$INFERCTL_API_KEY`` (never the
    value) for a shell key no client could send, or for engines with different keys
    (:func:`upstream_key`)."""
    environ = os.environ if environ is None else environ
    shell = environ.get(API_KEY_ENV) or None
    if shell is not None:
        try:
            check_api_key(shell, f"${API_KEY_ENV}")
        except ValueError as exc:
            raise RuntimeError(f"router: {exc}") from None
    upstream = upstream_key(config, environ)
    front = shell or upstream
    env = {}
    if front is not None:
        env[API_KEY_ENV] = front
    if upstream is not None:
        env[UPSTREAM_KEY_ENV] = upstream
    return env

