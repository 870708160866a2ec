"""The controller's configuration (``inferctl up --config`` / ``inferctl controller run``).

Pydantic models loaded from YAML; unknown keys are errors (a typo never goes unnoticed) and
every error names the field as the YAML reads (``engines[0].url: ...``). Times are seconds, ratios 0..1. See
``docs/configuration.md`` and ``examples/inferctl.yaml``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from inferctl.contract.yamlfile import load_yaml
from inferctl.controller.config_checks import HHMM, WEEKDAYS, BindHost, check_http_url, check_scope
from inferctl.controller.config_launch import ApiKeyKey, ChatTemplateKey, launch_problem

DEFAULT_CONTROLLER_PORT = 8900
DEFAULT_ENGINE_PORT = 8000
DEFAULT_TOKEN_ENV = "INFERCTL_ADMIN_TOKEN"
ENGINE_KINDS = ("bundled", "vllm", "tgi", "llamacpp")
_FIELD_PREFIX = re.compile(r"^([a-z][a-z0-9_.]*(?:\[[0-9]+\][a-z0-9_.]*)*): ")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the field and the limit."""


class _Model(BaseModel):
    # every float must be finite: an infinite interval, timeout or hold is never meant
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True)


#: Seconds the engine may need after its shutdown grace: 2 x its flush time (5 s each) + 3 s
#: (engine/entrypoints/lifecycle.py, "Time from the signal to the exit").
GRACE_MARGIN_SECONDS = 13.0




class LaunchConfig(_Model):
    """How the controller starts (and supervises) a bundled engine it launches itself."""

    model: str | None = Field(None, description="model path (llama2.c .bin, HF directory or .gguf file); "
                                                "none = built-in demo model")
    port: int = Field(DEFAULT_ENGINE_PORT, ge=1, le=65535)
    host: BindHost = "127.0.0.1"
    memory_budget: str | None = Field(None, description="--memory-budget passed to the engine, e.g. 512MiB")
    args: list[str] = Field(default_factory=list, description="extra `inferctl engine serve` arguments")
    enable_prefix_caching: bool = Field(True, description="the engine's --enable-prefix-caching (false: "
                                        "--no-enable-prefix-caching)")
    repetition_stop: bool = Field(False, description="the engine's --repetition-stop: stop looping outputs of "
                                  "requests that do not say")
    log_format: Literal["text", "json"] = Field("text", description="the engine's --log-format (json: one JSON "
                                                "object per line with the request id)")
    speculative_config: dict | None = Field(None, description="the engine's --speculative-config (vLLM's JSON "
                                            "object, e.g. {method: ngram, num_speculative_tokens: 4}); checked "
                                            "at load")
    chat_template: ChatTemplateKey = Field(None, description="the engine's --chat-template: plain, roles, a Jinja "
                                           "template file or its text (compiled at load)")
    api_key: ApiKeyKey = Field(None, description="the engine's --api-key (/v1 then needs 'Authorization: Bearer "
                               "<key>'), given as $INFERCTL_API_KEY, never on its command line")
    api_key_env: str | None = Field(None, description="the env variable holding api_key (when api_key is not set)")
    health_timeout_seconds: float = Field(180.0, gt=0, description="wait for GET /health 200 after a start or"
                                          " restart (dequantizing a GGUF model takes tens of seconds on a busy CPU)")
    stop_timeout_seconds: float = Field(30.0, gt=0, description="SIGTERM to SIGKILL")
    shutdown_grace_seconds: float | None = Field(None, ge=0, description="the engine's --shutdown-grace-seconds;"
                                                 " None: stop_timeout_seconds - 13 (at least 0)")

    @field_validator("memory_budget", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        """Checked at load (the engine would refuse it only after its start)."""
        from inferctl.contract.units import SizeError, parse_size

        if v is None:
            return None
        try:
            parse_size(str(v), "memory_budget", min_bytes=1)
        except SizeError:
            raise ValueError(f"{v!r} is not a size: bytes or a number with a unit, e.g. 512MiB, 2GiB"
                             " (KiB/MiB/GiB powers of 1024, KB/MB/GB of 1000)") from None
        return str(v)

    @field_validator("speculative_config")
    @classmethod
    def _speculative(cls, v: Any) -> Any:
        """Checked at load with the engine's own parser (contract.speculative)."""
        from inferctl.contract.speculative import SpeculativeConfigError, parse_speculative_config

        try:
            parse_speculative_config(v)
        except SpeculativeConfigError as err:
            raise ValueError(str(err)) from None
        return v or None

    @model_validator(mode="after")
    def _grace_fits(self) -> "LaunchConfig":
        if self.shutdown_grace_seconds is not None and self.grace_seconds() + GRACE_MARGIN_SECONDS > \
                self.stop_timeout_seconds:
            raise ValueError(f"shutdown_grace_seconds: {self.shutdown_grace_seconds:g} + {GRACE_MARGIN_SECONDS:g}"
                             f" s must fit inside stop_timeout_seconds ({self.stop_timeout_seconds:g}): the"
                             " supervisor would SIGKILL a draining engine")
        return self

    def engine_args(self) -> list[str]:
        """The ``engine serve`` flags of the keys above, then ``args`` (given later, they win)."""
        flags = [] if self.enable_prefix_caching else ["--no-enable-prefix-caching"]
        if self.speculative_config:
            flags += ["--speculative-config", json.dumps(self.speculative_config)]
        flags += ["--log-format", self.log_format] if self.log_format != "text" else []
        flags += ["--chat-template", self.chat_template] if self.chat_template is not None else []
        return flags + (["--repetition-stop"] if self.repetition_stop else []) + list(self.args)

    def grace_seconds(self) -> float:
        """The engine's shutdown grace (s): ``shutdown_grace_seconds``, else ``stop_timeout_seconds``
        minus :data:`GRACE_MARGIN_SECONDS` (at least 0), so a draining engine exits before SIGKILL."""
        if self.shutdown_grace_seconds is not None:
            return self.shutdown_grace_seconds
        return max(0.0, self.stop_timeout_seconds - GRACE_MARGIN_SECONDS)


class EngineConfig(_Model):
    """One engine to watch (and steer, where its kind has an admin API)."""

    name: str
    kind: Literal["bundled", "vllm", "tgi", "llamacpp"] = "bundled"
    url: str | None = None
    admin_token: str | None = None
    admin_token_env: str | None = None
    launch: LaunchConfig | None = None
    gpu: int | None = Field(None, ge=0, description="index of the GPU this engine runs on (for reset/isolate)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 characters of letters, digits, '_', '.', '-', starting"
                             " with a letter or digit (it becomes a Prometheus label value)")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        return check_http_url(v).rstrip("/")

    @model_validator(mode="after")
    def _url_or_launch(self) -> "EngineConfig":
        if self.launch is not None and self.kind != "bundled":
            raise ValueError("launch: only a bundled engine can be launched by the controller")
        if self.url is None:
            if self.launch is None:
                raise ValueError("url: required for an engine the controller does not launch")
            self.url = f"http://{self.launch.host}:{self.launch.port}"
        return self

    def token(self) -> str | None:
        """The engine's admin token: ``admin_token``, else the env variable ``admin_token_env``."""
        if self.admin_token:
            return self.admin_token
        if self.admin_token_env:
            return os.environ.get(self.admin_token_env) or None
        return None


def gpu_source_option_names(kind: str) -> tuple[str, ...]:
    """The options a GPU source kind takes: its class's ``OPTIONS`` (``auto``: NVML's and the
    simulated GPU's) plus ``timeout_s``, every kind's call deadline (controller/runtime.py)."""
    from inferctl.controller.gpu.dcgm import DcgmGpuSource
    from inferctl.controller.gpu.nvml import NvmlGpuSource
    from inferctl.controller.gpu.replay import ReplayGpuSource
    from inferctl.controller.gpu.sim import SimGpuSource

    by_kind = {"nvml": NvmlGpuSource.OPTIONS, "dcgm": DcgmGpuSource.OPTIONS,
               "replay": ReplayGpuSource.OPTIONS, "sim": SimGpuSource.OPTIONS,
               "auto": NvmlGpuSource.OPTIONS + SimGpuSource.OPTIONS}
    return tuple(dict.fromkeys(by_kind[kind] + ("timeout_s",)))


class GpuConfig(_Model):
    """The GPU source: ``kind`` and the options of that kind (see controller/gpu/base.py and
    docs/gpu-telemetry.md). Unknown options are errors naming them; ``dcgm`` needs ``url`` and
    ``replay`` needs ``path``. The values are checked by the source when it is built."""

    kind: Literal["auto", "nvml", "dcgm", "replay", "sim"] = "auto"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _options_of_the_kind(self) -> "GpuConfig":
        allowed = gpu_source_option_names(self.kind)
        unknown = sorted(k for k in self.options if k not in allowed)
        if unknown:
            raise ValueError(f"options.{unknown[0]}: unknown option for gpu.kind {self.kind}"
                             f" (known: {', '.join(allowed)})")
        for key in ("url", "engine_stats_url"):
            if key in self.options:
                v = self.options[key]
                if not isinstance(v, str):
                    raise ValueError(f"options.{key}: must be a URL string, got {v!r}")
                try:
                    check_http_url(v)
                except ValueError as exc:
                    raise ValueError(f"options.{key}: {exc}") from None
        if self.kind == "dcgm" and not self.options.get("url"):
            raise ValueError("options.url: required for gpu.kind dcgm (the dcgm-exporter /metrics URL)")
        if self.kind == "replay" and "captures" not in self.options:
            path = self.options.get("path")
            if not isinstance(path, str) or not path:
                raise ValueError("options.path: required for gpu.kind replay (a trace .jsonl or a capture file)")
        return self


class PolicySection(BaseModel):
    """One policy's settings: ``enabled`` plus the keys of that policy's own config dataclass
    (``controller/policies``; e.g. precision ``hold_seconds``), passed through unchanged and
    validated by it, so the defaults and limits live in one place."""

    model_config = ConfigDict(extra="allow")
    enabled: bool = True

    def options(self) -> dict[str, Any]:
        """The keys for the policy's config dataclass (everything but ``enabled``)."""
        return dict(self.model_extra or {})


class HardwarePolicySection(PolicySection):
    xid_catalog_dir: str | None = Field(None, description="directory of NVIDIA's xid_catalog.csv;"
                                        " None: the built-in table of well-known Xids")


class PoliciesConfig(_Model):
    """Per-policy sections; see docs/policies.md for every key and default.

    The breaker needs ``light_model`` (the lightweight model the engine serves); without it the
    breaker is off.
    """

    precision: PolicySection = Field(default_factory=PolicySection)
    fragmentation: PolicySection = Field(default_factory=PolicySection)
    breaker: PolicySection = Field(default_factory=PolicySection)
    hardware: HardwarePolicySection = Field(default_factory=HardwarePolicySection)
    liveness: PolicySection = Field(default_factory=PolicySection)

    @model_validator(mode="after")
    def _validate_with_the_policies(self) -> "PoliciesConfig":
        from inferctl.controller.policies import (BreakerConfig, FragmentationConfig, HardwareConfig,
                                         PrecisionConfig)
        from inferctl.controller.policies.common import config_from_mapping
        from inferctl.controller.policies.liveness import LivenessConfig

        checks = [("liveness", LivenessConfig, self.liveness),
                  ("precision", PrecisionConfig, self.precision),
                  ("fragmentation", FragmentationConfig, self.fragmentation),
                  ("hardware", HardwareConfig, self.hardware)]
        if self.breaker_active():
            checks.append(("breaker", BreakerConfig, self.breaker))
        for name, cls, section in checks:
            try:
                config_from_mapping(cls, section.options())
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name}: {exc}") from None
        return self

    def breaker_active(self) -> bool:
        """True when the breaker is enabled and has a ``light_model`` to route to."""
        return self.breaker.enabled and bool(self.breaker.options().get("light_model"))


class RailsConfig(_Model):
    """Limits on the actions that touch hardware or processes."""

    reset_min_interval_seconds: float = Field(1800.0, ge=0)
    dry_run: bool = Field(False, description="GPU resets only report what they would run")
    nvidia_smi: str = "nvidia-smi"
    command_timeout_seconds: float = Field(120.0, gt=0)
    drain_timeout_seconds: float = Field(60.0, gt=0, description="wait for in-flight requests before a restart")
    max_unavailable: int = Field(1, ge=1, strict=True, description="replicas of one model out of rotation at once"
                                 " (rolling restarts, controller/fleet.py)")
    quiet_wait_seconds: float = Field(60.0, gt=0, description="how long a restart waits for the rails (a free"
                                      " slot, or a quiet moment of the last ready replica) before it is postponed")


class IntervalsConfig(_Model):
    """Loop timing. Each call's timeout must be shorter than every poll interval."""

    engine_poll_seconds: float = Field(1.0, gt=0)
    gpu_poll_seconds: float = Field(2.0, gt=0)
    reconcile_seconds: float = Field(1.0, gt=0)
    call_timeout_seconds: float = Field(0.8, gt=0)
    max_backoff_seconds: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _timeout_below_intervals(self) -> "IntervalsConfig":
        shortest = min(self.engine_poll_seconds, self.gpu_poll_seconds)
        if self.call_timeout_seconds >= shortest:
            raise ValueError(f"call_timeout_seconds: {self.call_timeout_seconds:g} must be shorter than"
                             f" every poll interval (shortest {shortest:g})")
        if self.max_backoff_seconds < max(self.engine_poll_seconds, self.gpu_poll_seconds):
            raise ValueError("max_backoff_seconds: must be at least the longest poll interval")
        return self


class ListenConfig(_Model):
    host: BindHost = "127.0.0.1"   # the API's bind address
    port: int = Field(DEFAULT_CONTROLLER_PORT, ge=0, le=65535)


class EventLogRetentionConfig(_Model):
    """Bounds of the event log (``controller/eventlog_retention.py``); null turns one off.
    Applied every ``check_interval_seconds`` on a job of its own, never in an action's way."""

    max_age_days: float | None = Field(90.0, gt=0, description="delete events older than this")
    max_rows: int | None = Field(1_000_000, ge=1, description="keep at most this many events")
    max_bytes: str | None = Field("256MiB", description="keep the pages in use at most this large (e.g. 256MiB)")
    check_interval_seconds: float = Field(300.0, gt=0)
    flush_interval_seconds: float = Field(5.0, gt=0, description="retry writing events buffered during a"
                                          " write outage this often (every append retries too)")

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> str | None:
        if isinstance(v, int) and not isinstance(v, bool):
            # a bare YAML number is a byte count; say what a valid value looks like
            if v < 1:
                raise ValueError(f"must be a size of at least 1 byte such as 256MiB, got {v}")
            v = str(v)
        if v is not None and not isinstance(v, str):
            raise ValueError(f"must be a size such as 256MiB, got {v!r}")
        if v is not None:
            from inferctl.contract.units import SizeError, parse_size
            try:
                parse_size(v, "max_bytes", decimal_si=False, min_bytes=1)
            except SizeError as exc:
                raise ValueError(str(exc).split(": ", 1)[-1]) from None
        return v

    def max_bytes_value(self) -> int | None:
        """``max_bytes`` in bytes (binary units: 1MB = 1 MiB), None when off."""
        if self.max_bytes is None:
            return None
        from inferctl.contract.units import parse_size
        return parse_size(self.max_bytes, "max_bytes", decimal_si=False, min_bytes=1)


class MaintenanceWindow(_Model):
    """A time when automatic actions are paused (decisions still computed and logged as "would
    have acted"). Either absolute ``start``/``end`` (ISO 8601 with a time zone), or weekly
    ``days`` (mon..sun) with ``from_time``/``to_time`` ("HH:MM", UTC; ``to_time`` before
    ``from_time`` crosses midnight)."""

    scope: str = Field("all", description="all, engine:NAME or gpu:N")
    reason: str = Field(..., min_length=1, max_length=200)
    start: Any = Field(None, description="ISO 8601 start, e.g. 2026-03-01T02:00:00Z")
    end: Any = Field(None, description="ISO 8601 end")
    days: list[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]] | None = None
    from_time: str | None = Field(None, description="HH:MM UTC")
    to_time: str | None = Field(None, description="HH:MM UTC")

    @field_validator("scope")
    @classmethod
    def _scope(cls, v: str) -> str:
        return check_scope(v)

    @field_validator("start", "end")
    @classmethod
    def _when(cls, v: Any) -> Any:
        import datetime as dt
        if v is None:
            return None
        if isinstance(v, str):
            try:
                v = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"{v!r} is not an ISO 8601 time such as 2026-03-01T02:00:00Z") from None
        if not isinstance(v, dt.datetime) or v.tzinfo is None:
            raise ValueError("needs a time zone (e.g. a trailing Z for UTC)")
        return v

    @model_validator(mode="after")
    def _one_form(self) -> "MaintenanceWindow":
        absolute = self.start is not None or self.end is not None
        weekly = self.days is not None or self.from_time is not None or self.to_time is not None
        if absolute == weekly:
            raise ValueError("give either start and end, or days with from_time and to_time")
        if absolute:
            if self.start is None or self.end is None or self.end <= self.start:
                raise ValueError("end: must be after start (both required)")
        else:
            for name in ("from_time", "to_time"):
                v = getattr(self, name)
                if v is None or not HHMM.match(v):
                    raise ValueError(f"{name}: {v!r} must be HH:MM (00:00..23:59, UTC)")
            if not self.days or self.from_time == self.to_time:
                raise ValueError("days: at least one day, and from_time != to_time")
        return self

    def active(self, now: float) -> bool:
        """Whether the window covers ``now`` (seconds since the epoch)."""
        import datetime as dt
        if self.start is not None:
            return self.start.timestamp() <= now < self.end.timestamp()
        t = dt.datetime.fromtimestamp(now, dt.timezone.utc)
        minute = t.hour * 60 + t.minute
        f = int(self.from_time[:2]) * 60 + int(self.from_time[3:])
        to = int(self.to_time[:2]) * 60 + int(self.to_time[3:])
        if f < to:
            return WEEKDAYS[t.weekday()] in self.days and f <= minute < to
        # crosses midnight: the part after midnight belongs to the previous day's window
        prev = WEEKDAYS[(t.weekday() - 1) % 7]
        return (WEEKDAYS[t.weekday()] in self.days and minute >= f) or (prev in self.days and minute < to)

    def began(self, now: float) -> float:
        """When the active occurrence began (seconds since the epoch); ``now`` if not active."""
        if self.start is not None:
            return self.start.timestamp() if self.active(now) else now
        t = now - now % 60
        while self.active(t - 60) and now - t < 8 * 86400:
            t -= 60
        return t if self.active(now) else now


class ControllerConfig(_Model):
    """The whole controller configuration."""

    listen: ListenConfig = Field(default_factory=ListenConfig)
    admin_token: str | None = None
    admin_token_env: str = DEFAULT_TOKEN_ENV
    event_log: str = Field("inferctl-events.db", min_length=1,
                           description="the event log's SQLite file (':memory:' keeps nothing)")
    event_log_retention: EventLogRetentionConfig = Field(default_factory=EventLogRetentionConfig)
    event_log_buffer_events: int = Field(10_000, ge=1, le=1_000_000, description="events kept in memory"
                                         " while the event log cannot be written (more are dropped, counted)")
    engines: list[EngineConfig] = Field(default_factory=list)
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    policies: PoliciesConfig = Field(default_factory=PoliciesConfig)
    rails: RailsConfig = Field(default_factory=RailsConfig)
    intervals: IntervalsConfig = Field(default_factory=IntervalsConfig)
    maintenance: list[MaintenanceWindow] = Field(default_factory=list, description="times when automatic"
                                                 " actions are paused (docs/policies.md 'Pause')")

    @model_validator(mode="after")
    def _unique_names(self) -> "ControllerConfig":
        names = [e.name for e in self.engines]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"engines: duplicate name(s) {', '.join(dup)}")
        ports = [e.launch.port for e in self.engines if e.launch is not None]
        if len(ports) != len(set(ports)):
            raise ValueError("engines: two launched engines use the same launch.port")
        known = set(names)
        for i, window in enumerate(self.maintenance):
            if window.scope.startswith("engine:") and window.scope[len("engine:"):] not in known:
                listed = ", ".join(sorted(known)) or "none"
                raise ValueError(f"maintenance[{i}].scope: {window.scope!r} names no configured engine"
                                 f" (engines: {listed})")
        return self

    def token(self) -> str | None:
        """The controller's admin token: ``admin_token``, else the env variable ``admin_token_env``."""
        return self.admin_token or os.environ.get(self.admin_token_env) or None


def user_path(loc: tuple | list) -> str:
    """A field's path as the user's YAML reads: ``("engines", 0, "launch", "model")`` →
    ``engines[0].launch.model``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def looks_like_hub_id(model: str) -> bool:
    """True for ``org/name`` (a Hugging Face hub id) that is no local path: one ``/``, no
    leading ``.``, ``/`` or ``~``, no model file suffix (``.bin``, ``.gguf`` …), nothing there on disk."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", model)) and not Path(model).exists() \
        and Path(model).suffix.lower() not in (".bin", ".gguf", ".pt", ".pth", ".safetensors", ".json")


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = user_path(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/configuration.md)"
        # a validator's "field: why" names a field below ``loc``: fold it into the path
        while (m := _FIELD_PREFIX.match(msg)) is not None:
            loc = f"{loc}.{m.group(1)}" if loc else m.group(1)
            msg = msg[m.end():]
        lines.append(f"{loc or '(top level)'}: {msg}")
    return "; ".join(lines)


def parse_config(data: Any) -> ControllerConfig:
    """Validate a mapping (parsed YAML) into a :class:`ControllerConfig`.

    Raises:
        ConfigError: naming each bad field, e.g. ``intervals.call_timeout_seconds: ...``.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"(top level): must be a mapping, got {type(data).__name__}")
    try:
        return ControllerConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format(err)) from None


def load_config(path: str | Path) -> ControllerConfig:
    """Read and validate a YAML configuration file.

    Raises:
        ConfigError: the file is missing, not YAML, holds a key twice in one mapping, nests too
            deeply (:func:`inferctl.contract.yamlfile.load_yaml`), or is invalid (the message
            names the field).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {p}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {p}: not UTF-8 text (byte {exc.start}: {exc.reason});"
                          " write it as UTF-8 YAML") from None
    try:
        data = load_yaml(text)   # refuses a key written twice (safe_load kept the last) and deep nesting
    except ValueError as exc:
        raise ConfigError(f"config file {p}: {exc}") from None
    try:
        return parse_config(data)
    except ConfigError as exc:
        raise ConfigError(f"config file {p}: {exc}") from None


def check_files(config: ControllerConfig) -> None:
    """Check the files the configuration names before anything starts: each launched engine's
    ``launch.model`` (a path, or none / ``demo`` for the built-in model), the replay source's
    ``gpu.options.path`` and ``policies.hardware.xid_catalog_dir`` (with ``xid_catalog.csv``).

    Raises:
        ConfigError: naming the field, e.g. ``engines[0].launch.model: /m.bin does not exist``.
    """
    for i, e in enumerate(config.engines):
        model = None if e.launch is None else e.launch.model
        if model and model != "demo" and not Path(model).exists():
            if looks_like_hub_id(model):
                raise ConfigError(f"engines[{i}].launch.model: {model!r} looks like a Hugging Face hub id: hub ids"
                                  " are not downloaded; give a local path (a llama2.c .bin, a Hugging Face"
                                  " directory or a .gguf file)")
            raise ConfigError(f"engines[{i}].launch.model: {model} does not exist (a llama2.c .bin,"
                              " a Hugging Face directory, a .gguf file, or leave it out for the demo model)")
        bad = launch_problem(e.launch)     # a chat template file, an api_key_env variable
        if bad is not None:
            raise ConfigError(f"engines[{i}].launch.{bad[0]}: {bad[1]}")
    path = config.gpu.options.get("path") if config.gpu.kind == "replay" else None
    if isinstance(path, str) and not Path(path).is_file():
        raise ConfigError(f"gpu.options.path: {path} is not a file (a replay trace or capture)")
    xid_dir = config.policies.hardware.xid_catalog_dir
    if xid_dir is not None and not (Path(xid_dir) / "xid_catalog.csv").is_file():
        raise ConfigError(f"policies.hardware.xid_catalog_dir: {xid_dir} has no xid_catalog.csv"
                          " (NVIDIA's Xid catalogue; leave the key out for the built-in table)")
