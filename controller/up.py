"""Assemble and run the whole controller: ``inferctl up`` and ``inferctl controller run``.

:func:`build_runtime` turns a :class:`~controller.config.ControllerConfig` into running parts:
the engines the controller launches (:class:`~controller.actions.EngineSupervisor`, started
and healthy), engine clients for every engine (launched or only watched, e.g. a vLLM URL),
the GPU source, the policies, the reset rails, the actions, the loop and the HTTP API.

:func:`serve` runs it in the foreground: it binds the API socket, prints the router's URL first
when asked for one (``inferctl up --replicas N``: :class:`RouterSpec`, :func:`up_config`), then
the engine URLs as they become healthy, starts the router (after the engines, so that the
controller answers its first reads), prints the controller's URL, serves until SIGINT/SIGTERM, then shuts down in
order — the API stops, the loop stops (running actions finish), each launched engine gets
SIGTERM (SIGKILL after its ``stop_timeout_seconds``), the router stops last. The controller
never imports the engine or the router: they run as ``python -m inferctl engine serve ...`` /
``python -m inferctl router ...`` subprocesses and are reached over HTTP.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from inferctl.contract.http import check_api_key, generate_admin_token
from inferctl.controller.actions import Actions, EngineSupervisor, engine_serve_argv
from inferctl.controller.api import create_app
from inferctl.controller.config_launch import API_KEY_ENV, launch_env
from inferctl.controller.config import (DEFAULT_ENGINE_PORT, ConfigError, ControllerConfig, check_files,
                                        parse_config)
from inferctl.controller.eventlog_retention import EventLogMaintenance, Retention
from inferctl.controller.events import EventLog, EventLogError
from inferctl.controller.heap import freeze_startup_heap
from inferctl.controller.lifecycle import adopt_engine, mark_unclean_shutdown, record_launch
from inferctl.controller.loop import Controller
from inferctl.controller.state import ControllerState
from inferctl.controller.metrics import build_registry
from inferctl.controller.reset import GpuResetter
from inferctl.controller.router_watch import RouterWatch
from inferctl.controller.supervisor import find_owned, owned_pids, owner_key

#: where ``inferctl up --replicas N`` (N > 1) puts the router (``--router-port``)
DEFAULT_ROUTER_PORT = 8080
#: the exit code of ``inferctl engine serve`` (and of every inferctl command) for bad usage
USAGE_EXIT_CODE = 2


class EngineUsageError(ConfigError):
    """A launched engine exited with :data:`USAGE_EXIT_CODE` before it was healthy: its command
    line (``--engine-arg``, ``launch.args``, the model) is bad usage, so ``inferctl up`` exits 2
    too (:func:`serve`), with the engine's own message."""


def engine_usage_message(log_path: str | Path | None) -> str | None:
    """The engine's own usage error from the end of its log (its last ``error: ...`` /
    ``Error: ...`` line), or None (no log: the message went to the terminal, or none found)."""
    if log_path is None:
        return None
    try:
        with open(log_path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 64 * 1024))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = [ln.strip() for ln in tail.splitlines() if ln.strip()[:6].lower() == "error:"]
    return found[-1][6:].strip() if found else None


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


def describe_exit(code: int | None) -> str:
    """A process's end for people: ``0`` → ``exit code 0, clean stop``; ``-15`` (Python's
    ``Popen.returncode`` for a signal) → ``ended by SIGTERM``; None → ``still running``."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"ended by signal {-code}"
    return f"exit code {code}" + (", clean stop" if code == 0 else "")


@dataclass
class Runtime:
    """Everything :func:`build_runtime` made; :meth:`close` undoes it (idempotent)."""

    config: ControllerConfig
    admin_token: str
    controller: Controller
    app: Any
    event_log: EventLog
    supervisors: dict[str, EngineSupervisor] = field(default_factory=dict)
    clients: dict[str, Any] = field(default_factory=dict)
    gpu_source: Any = None
    maintenance: EventLogMaintenance | None = None
    closed: bool = False

    def close(self) -> None:
        """Stop the loop, then every supervised engine (adopted ones too: a clean exit leaves no
        launched process behind), then the event log's upkeep; the event log is closed last
        (what it still cannot write is logged, :meth:`EventLog.close`). Never raises for the
        event log."""
        if self.closed:
            return
        self.closed = True
        try:
            self.controller.stop()
        finally:
            if self.maintenance is not None:
                self.maintenance.stop()
            for name, sup in self.supervisors.items():
                code = sup.stop()
                self.event_log.append("lifecycle", "supervisor", f"engine {name} stopped ({describe_exit(code)})",
                                      target=name, outcome={"exit_code": code})
            for client in self.clients.values():
                close = getattr(client, "close", None)
                if close is not None:
                    close()
            close = getattr(self.gpu_source, "close", None)
            if close is not None:
                close()
            self.event_log.close()


#: A GPU source's own per-call deadline as a share of the loop's per-call timeout, so that the
#: source's deadline (NVML's worker-thread join, DCGM's and the simulated GPU's HTTP timeout)
#: fires first and the reading says what hung ("nvmlDeviceGetMemoryInfo did not return ..."),
#: rather than the loop's generic "timed out after ..." for the whole poll.
SOURCE_TIMEOUT_SHARE = 0.8


def gpu_source_options(config: ControllerConfig) -> dict[str, Any]:
    """The options passed to the GPU source: ``gpu.options`` with ``timeout_s`` defaulting to
    :data:`SOURCE_TIMEOUT_SHARE` × ``intervals.call_timeout_seconds`` (seconds)."""
    opts = dict(config.gpu.options)
    opts.setdefault("timeout_s", SOURCE_TIMEOUT_SHARE * config.intervals.call_timeout_seconds)
    return opts


def _gpu_source(config: ControllerConfig) -> Any:
    """Build the configured GPU source. Raises :class:`ConfigError` naming the field when the
    options cannot make one (a missing driver for ``auto`` without a bundled engine, a replay
    trace that does not parse, a bad value)."""
    from inferctl.controller.gpu import make_gpu_source

    opts = gpu_source_options(config)
    if config.gpu.kind in ("auto", "sim") and "engine_stats_url" not in opts and "stats_fn" not in opts:
        bundled = [e for e in config.engines if e.kind == "bundled"]
        if bundled:
            opts["engine_stats_url"] = f"{bundled[0].url}/stats"
        elif config.gpu.kind == "sim":
            raise ConfigError("gpu.options.engine_stats_url: the simulated GPU needs a bundled engine's"
                              " /stats URL (none is configured)")
    field = "gpu.options.path" if config.gpu.kind == "replay" else "gpu.options"
    try:
        return make_gpu_source(config.gpu.kind, **opts)
    except ConfigError:
        raise
    except (ValueError, TypeError, OSError) as exc:
        if config.gpu.kind == "auto" and "simulated" in str(exc):
            raise ConfigError("gpu.kind: auto found no NVIDIA driver and there is no bundled engine to"
                              " simulate a GPU from; set gpu.kind to dcgm (options.url) or replay"
                              " (options.path)") from None
        raise ConfigError(f"{field}: {exc}") from None


def build_policies(config: ControllerConfig, counter: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The policies ``inferctl up`` runs, built from ``config.policies``: per engine name
    ``{"precision": PrecisionPolicy, "fragmentation": …, "breaker": …}`` (those that apply to
    the engine's kind), and per GPU index a HardwarePolicy. ``counter`` is the controller's
    invalid-sample counter the policies report to. Raises ConfigError for an unreadable Xid
    catalogue."""
    from inferctl.controller.gpu.xid import XidCatalog
    from inferctl.controller.policies import (FragmentationPolicy, HardwarePolicy, LatencyBreaker,
                                     PrecisionPolicy)
    from inferctl.controller.policies.liveness import EngineLiveness, GpuTelemetryLiveness

    pc = config.policies
    per_engine: dict[str, dict[str, Any]] = {}
    for e in config.engines:
        pols: dict[str, Any] = {}
        frag = None
        if pc.fragmentation.enabled:
            frag = pols["fragmentation"] = FragmentationPolicy(pc.fragmentation.options(), engine=e.name,
                                                               counter=counter)
        if pc.precision.enabled and e.kind == "bundled":   # precision needs the admin API
            pols["precision"] = PrecisionPolicy(pc.precision.options(), engine=e.name,
                                                fragmentation=frag, counter=counter)
        if pc.breaker_active() and e.kind == "bundled":
            pols["breaker"] = LatencyBreaker(pc.breaker.options(), engine=e.name, counter=counter)
        if pc.liveness.enabled:   # down/up, restarts, hangs (a hang restarts only what we launched)
            pols["liveness"] = EngineLiveness(pc.liveness.options(), engine=e.name,
                                              can_restart=e.kind == "bundled" and e.launch is not None)
        per_engine[e.name] = pols
    gpu_policies: dict[str, Any] = {}
    if pc.liveness.enabled:
        gpu_policies["telemetry"] = GpuTelemetryLiveness()
    if pc.hardware.enabled:
        gpu_engines: dict[str, list[str]] = {}
        for e in config.engines:
            if e.gpu is not None:
                gpu_engines.setdefault(str(e.gpu), []).append(e.name)
        xid_dir = pc.hardware.xid_catalog_dir
        if xid_dir is None:
            catalog = XidCatalog.builtin()
        else:   # configured: a catalogue that does not load is an error, not a silent fallback
            buckets = Path(xid_dir) / "xid_resolution_buckets.csv"
            try:
                catalog = XidCatalog.load(Path(xid_dir) / "xid_catalog.csv",
                                          buckets if buckets.exists() else None)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"policies.hardware.xid_catalog_dir: {exc}") from None
        gpu_policies["hardware"] = HardwarePolicy(catalog.action, pc.hardware.options(),
                                                  gpu_engines=gpu_engines)
    return per_engine, gpu_policies


def build_runtime(config: ControllerConfig, admin_token: str, *, engine_log_dir: str | Path | None = None,
                  on_engine_started: Callable[[str, EngineSupervisor], None] | None = None,
                  allowed_hosts: tuple[str, ...] = ()) -> Runtime:
    """Launch the configured engines (waiting for their ``/health``), then build the loop and
    the API (its ``Host`` guard keyed on ``config.listen.host`` plus ``allowed_hosts``).
    Raises :class:`~controller.config.ConfigError` naming the field before anything
    starts (a missing model, replay trace or Xid catalogue, an unusable event log, GPU source
    options that do not work), ``RuntimeError`` (an engine did not start; already-started ones
    are stopped) or ``ValueError`` (a bad option for a policy)."""
    from inferctl.controller.engines import make_engine_client
    from inferctl.controller.signals import InvalidSampleCounter

    check_files(config)
    registry, metrics = build_registry()
    try:
        event_log = EventLog(config.event_log, metrics=metrics, buffer_max=config.event_log_buffer_events)
    except EventLogError as exc:
        raise ConfigError(f"event_log: {exc}") from None
    if event_log.migrated_from < event_log.schema_version and event_log.last_id() > 0:
        event_log.append("lifecycle", "controller", f"event log schema migrated from version"
                         f" {event_log.migrated_from} to {event_log.schema_version}",
                         inputs={"path": config.event_log}, outcome={"schema_version": event_log.schema_version})
    mark_unclean_shutdown(event_log)
    ret = config.event_log_retention
    maintenance = EventLogMaintenance(
        event_log, Retention(max_age_seconds=None if ret.max_age_days is None else ret.max_age_days * 86400.0,
                             max_rows=ret.max_rows, max_bytes=ret.max_bytes_value()),
        metrics, check_interval_seconds=ret.check_interval_seconds,
        flush_interval_seconds=ret.flush_interval_seconds)
    supervisors: dict[str, EngineSupervisor] = {}
    tokens: dict[str, str | None] = {}
    try:
        for e in config.engines:
            tokens[e.name] = e.token()
            if e.launch is None:
                continue
            tokens[e.name] = tokens[e.name] or admin_token
            argv = engine_serve_argv(e.launch.port, e.launch.host, e.launch.model, e.launch.memory_budget,
                                     e.launch.engine_args(), shutdown_grace_seconds=e.launch.grace_seconds())
            log_path = None if engine_log_dir is None else Path(engine_log_dir) / f"engine-{e.name}.log"
            owner = None if config.event_log == ":memory:" else owner_key(config.event_log, e.name)
            sup = EngineSupervisor(e.name, argv, e.url or "",
                                   env={"INFERCTL_ADMIN_TOKEN": tokens[e.name] or "", **launch_env(e.launch)},
                                   health_timeout_seconds=e.launch.health_timeout_seconds,
                                   stop_timeout_seconds=e.launch.stop_timeout_seconds, log_path=log_path,
                                   owner=owner, on_launch=lambda s: record_launch(event_log, s))
            supervisors[e.name] = sup      # from here on, stopped if the build fails
            adopt_engine(event_log, sup)   # a previous controller's engine: adopt it or stop it
            try:
                sup.start()                # returns at once when adopted
            except RuntimeError:
                if sup.exited_unexpectedly() != USAGE_EXIT_CODE:
                    raise
                said = engine_usage_message(log_path)
                raise EngineUsageError(
                    f"engine {e.name!r} refused its command line (exit code {USAGE_EXIT_CODE}, bad usage): "
                    + (said if said else "its message is above") + " (check --engine-arg, --model and the"
                    " configuration's launch.args)") from None
            if on_engine_started is not None:
                on_engine_started(e.name, sup)
        timeout = config.intervals.call_timeout_seconds
        clients = {e.name: make_engine_client(e.kind, e.name, e.url or "", admin_token=tokens[e.name],
                                              timeout_s=timeout) for e in config.engines}
        gpu_source = _gpu_source(config)
        counter = InvalidSampleCounter()
        policies, gpu_policies = build_policies(config, counter)
        rails = config.rails
        resetter = GpuResetter(rails.nvidia_smi, gpu_source, event_log,
                               min_interval_seconds=rails.reset_min_interval_seconds, dry_run=rails.dry_run,
                               allowed_pids=lambda: owned_pids(supervisors.values()),
                               command_timeout_seconds=rails.command_timeout_seconds, metrics=metrics)
        light = {e.name: config.policies.breaker.options().get("light_model") for e in config.engines}
        state = ControllerState.for_config(config)
        actions = Actions(clients, supervisors, resetter, event_log, metrics,
                          engine_gpus={e.name: e.gpu for e in config.engines},
                          drain_timeout_seconds=rails.drain_timeout_seconds, light_models=light,
                          state=state, max_unavailable=rails.max_unavailable,
                          quiet_wait_seconds=rails.quiet_wait_seconds,
                          ready_timeout_seconds=max([e.launch.health_timeout_seconds for e in config.engines
                                                     if e.launch is not None] or [60.0]))
        controller = Controller(config, clients, gpu_source, policies, actions, event_log, metrics,
                                registry=registry, gpu_policies=gpu_policies, supervisors=supervisors,
                                resetter=resetter, counter=counter, state=state)
        app = create_app(controller, admin_token, bind_host=config.listen.host, allowed_hosts=allowed_hosts)
    except BaseException:
        for sup in supervisors.values():
            sup.stop()
        event_log.close()
        raise
    return Runtime(config, admin_token, controller, app, event_log, supervisors, clients, gpu_source,
                   maintenance)


@dataclass(frozen=True)
class RouterSpec:
    """The router ``inferctl up`` starts in front of its launched engines (``inferctl router`` as
    a supervised subprocess: the controller never imports the router)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_ROUTER_PORT


#: ``inferctl up``'s replicas: names ``main-0`` … (``main`` alone for one), ports from the base on
MAX_REPLICAS = 64


def replica_names(n: int) -> list[str]:
    """``["main"]`` for one replica, else ``["main-0", …, "main-<n-1>"]``."""
    return ["main"] if n == 1 else [f"main-{i}" for i in range(n)]


def up_flags(positional: str | None, model: str | None, memory_budget: str | None) -> str | None:
    """``inferctl up``'s model (``MODEL``, vLLM's habit, or ``--model``: both only when equal)
    after checking it and ``--memory-budget`` before anything starts. Raises ConfigError naming
    the flag: the model given twice, a Hugging Face hub id (never downloaded), a bad size."""
    from inferctl.contract.units import SizeError, parse_size
    from inferctl.controller.config import looks_like_hub_id

    if positional is not None and model is not None and positional != model:
        raise ConfigError(f"--model: the model is given twice ({positional!r} as MODEL and {model!r} as --model);"
                          " give one")
    model = model if model is not None else positional
    if model and model != "demo" and looks_like_hub_id(model):
        raise ConfigError(f"--model: {model!r} looks like a Hugging Face hub id: hub ids are not downloaded; give"
                          " a local path (a llama2.c .bin, a Hugging Face directory or a .gguf file)")
    if memory_budget is not None:
        try:
            parse_size(memory_budget, "--memory-budget", min_bytes=1)
        except SizeError as exc:
            raise ConfigError(str(exc)) from None
    return model


def up_config(cfg: ControllerConfig, *, from_file: bool, replicas: int = 1, model: str | None = None,
              memory_budget: str | None = None, engine_port: int | None = None,
              engine_args: list[str] | None = None, controller_port: int | None = None,
              cpus: int | None = None) -> ControllerConfig:
    """The configuration ``inferctl up`` runs: ``cfg`` (a file's, or the defaults) with its
    launched engines made from the flags. Without engines in ``cfg``: ``replicas`` bundled
    engines (:func:`replica_names`, ports ``engine_port`` (8000) + i); ``model``,
    ``memory_budget``, ``engine_args`` apply to each. With launched engines in ``cfg``: the flags
    apply to the first (``replicas`` must be 1). N > 1 replicas without ``--num-threads`` in
    ``engine_args`` get ``--num-threads max(1, cpus // N)`` each (``cpus``: this process's usable
    CPUs by default), so they split the cores instead of stalling on each other's threads
    (docs/performance.md, wave 7). Raises :class:`ConfigError` naming the flag or field."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError(f"--replicas: must be 1..{MAX_REPLICAS}, got {replicas}")
    data = cfg.model_dump()
    launched = [e for e in data["engines"] if e.get("launch") is not None]
    if data["engines"] and replicas > 1:
        raise ConfigError("--replicas: the configuration lists engines; list the replicas there"
                          " (or leave its engines out)")
    if not launched and not (from_file and data["engines"]):
        base = DEFAULT_ENGINE_PORT if engine_port is None else engine_port
        if base + replicas - 1 > 65535:
            raise ConfigError(f"--engine-port: {base} + {replicas} replicas runs past port 65535")
        for i, name in enumerate(replica_names(replicas)):
            data["engines"].append({"name": name, "kind": "bundled", "url": None, "launch": {"port": base + i}})
        launched = data["engines"][-replicas:]
        engine_port = None
    targets = launched if replicas > 1 else launched[:1]
    if not targets and (model or memory_budget or engine_port or engine_args):
        raise ConfigError("--model/--memory-budget/--engine-port need an engine to launch; the config launches none")
    for e in targets:
        for key, value in (("model", model), ("memory_budget", memory_budget), ("port", engine_port)):
            if value is not None:
                e["launch"][key] = value
        if engine_args:
            e["launch"]["args"] = list(e["launch"].get("args") or []) + list(engine_args)
        if replicas > 1 and not any(a.split("=")[0] == "--num-threads" for a in e["launch"].get("args") or []):
            share = max(1, (cpus or len(os.sched_getaffinity(0))) // replicas)
            e["launch"]["args"] = list(e["launch"].get("args") or []) + ["--num-threads", str(share)]
        if engine_port is not None or e.get("url") is None:
            e["url"] = None            # derived from launch.host/port again
    if controller_port is not None:
        data["listen"]["port"] = controller_port
    return parse_config(data)


#: the variable ``inferctl up`` hands the launched engines' API key to its router in (never argv)
UPSTREAM_KEY_ENV = "INFERCTL_UPSTREAM_API_KEY"


def router_argv(spec: RouterSpec, engines: list[tuple[str, str]], controller_url: str,
                upstream_key_env: str | None = None) -> list[str]:
    """``python -m inferctl router`` in front of ``engines`` (name, URL), reading the
    controller's ``/status`` (docs/router.md), logging warnings and errors only;
    ``upstream_key_env``: the variable that holds the engines' API key (``--upstream-api-key-env``)."""
    argv = [sys.executable, "-m", "inferctl", "router", "--host", spec.host, "--port", str(spec.port)]
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


def _start_router(spec: RouterSpec, config: ControllerConfig, controller_url: str,
                  log_dir: str | Path | None) -> EngineSupervisor:
    """Start the router (port checked free first) and wait for its ``/health``; RuntimeError
    when it cannot start."""
    _bind(spec.host, spec.port).close()      # a port in use is said here, not by a timeout
    engines = [(e.name, e.url or "") for e in config.engines if e.launch is not None]
    if not engines:
        raise RuntimeError("router: no launched engine to route to")
    log_path = None if log_dir is None else Path(log_dir) / "router.log"
    env = router_env(config)
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
    directory; an engine that exits 2 at start, :class:`EngineUsageError`), 1 when startup failed otherwise (a port in
    use, an engine or the router that did not start). The reason is one line through
    ``echo_error`` (default ``echo``), never raised. The router's URL (the one clients use) is
    printed first; on the way out the router stops last, after the engines drained. A port in
    use is said first, before anything starts (:func:`check_ports_free` with ``port_flags``: exit 2)."""
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
