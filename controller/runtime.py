"""Assemble the controller's running parts from a :class:`~controller.config.ControllerConfig`
(what ``inferctl up`` and ``inferctl controller run`` run, :mod:`inferctl.controller.up`).

:func:`build_runtime` makes them: the engines the controller launches
(:class:`~controller.actions.EngineSupervisor`, started and healthy), engine clients for every
engine (launched or only watched, e.g. a vLLM URL), the GPU source (:func:`gpu_source_options`),
the policies (:func:`build_policies`), the reset rails, the actions, the loop and the HTTP API;
:class:`Runtime` holds them and :meth:`Runtime.close` stops them in order. An engine that exits
with :data:`USAGE_EXIT_CODE` before it is healthy is :class:`EngineUsageError`, with the
engine's own message (:func:`engine_usage_message`).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from inferctl.controller.actions import Actions, EngineSupervisor, engine_serve_argv
from inferctl.controller.api import create_app
from inferctl.controller.config_launch import launch_env
from inferctl.controller.config import ConfigError, ControllerConfig, check_files
from inferctl.controller.eventlog_retention import EventLogMaintenance, Retention
from inferctl.controller.events import EventLog, EventLogError
from inferctl.controller.lifecycle import adopt_engine, mark_unclean_shutdown, record_launch
from inferctl.controller.loop import Controller
from inferctl.controller.state import ControllerState
from inferctl.controller.metrics import build_registry
from inferctl.controller.reset import GpuResetter
from inferctl.controller.supervisor import owned_pids, owner_key

#: the exit code of ``inferctl engine serve`` (and of every inferctl command) for bad usage
USAGE_EXIT_CODE = 2


class EngineUsageError(ConfigError):
    """A launched engine exited with :data:`USAGE_EXIT_CODE` before it was healthy: its command
    line (``--engine-arg``, ``launch.args``, the model) is bad usage, so ``inferctl up`` exits 2
    too (:func:`inferctl.controller.up.serve`), with the engine's own message."""


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
                    + (said if said else "its message is above") + " (check --engine-arg, --model, the"
                    " configuration's launch.args and the environment's INFERCTL_* switches)") from None
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
