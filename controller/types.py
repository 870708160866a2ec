"""Snapshots and decisions shared inside the controller.

A value of ``None`` always means "no data" (unsupported, blank, missing, invalid) and is
never replaced by 0. Memory is in bytes, ratios in 0..1, temperatures in °C, power in W,
times in seconds since the epoch (``time.time()``).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any


@dataclass
class XidEvent:
    """One Xid report: ``xid`` code, GPU ``pci_bus_id`` (e.g. ``0000:44:00.0``) and message."""

    xid: int | None
    pci_bus_id: str | None
    message: str
    time: float = 0.0
    source: str | None = None      # nvml, kernel, dcgm, replay
    gpu_uuid: str | None = None    # when the source names the GPU by UUID
    lost: bool = False             # the report says the GPU fell off the bus / is lost


@dataclass
class GpuProcess:
    pid: int
    name: str | None = None
    used_memory_bytes: int | None = None
    gpu_instance_id: int | None = None     # MIG GPU instance the process runs on, if any


@dataclass
class MigInstance:
    """One MIG GPU instance of a physical GPU (memory is the instance's own share).

    Keyed by ``gpu_instance_id``; ``uuid`` is the MIG device UUID where the source gives one.
    """

    gpu_instance_id: int | None
    compute_instance_id: int | None = None
    profile: str | None = None             # e.g. "1g.10gb"
    uuid: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    utilization_ratio: float | None = None


@dataclass
class GpuSnapshot:
    """One GPU at one instant, keyed by ``uuid``. Every numeric field may be ``None`` (no data)."""

    uuid: str
    index: int | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    time: float = 0.0
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None      # NVML v2 "used": allocations, excluding reserved
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None  # NVML v2 "reserved": driver/firmware
    utilization_ratio: float | None = None
    memory_bandwidth_utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    fan_ratio: float | None = None
    pstate: str | None = None
    clocks_sm_mhz: float | None = None
    clocks_mem_mhz: float | None = None
    ecc_corrected: int | None = None          # volatile: since the last driver load (may reset)
    ecc_uncorrected: int | None = None        # volatile uncorrectable (double-bit) count
    ecc_corrected_aggregate: int | None = None    # lifetime (InfoROM) counts: never reset
    ecc_uncorrected_aggregate: int | None = None
    retired_pages_pending: bool | None = None  # pages waiting to be retired at the next reset/reload
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # NVML field 230: 0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain and reset
    recovery_action: int | None = None
    persistence_mode: bool | None = None
    processes: list[GpuProcess] = field(default_factory=list)
    xid_events: list[XidEvent] = field(default_factory=list)
    lost: bool = False
    mig_enabled: bool | None = None
    mig_instances: list[MigInstance] = field(default_factory=list)
    health: str | None = None      # the source's own verdict where it gives one ("ok", "lost"); None = no verdict


@dataclass
class GpuReading:
    """What a GPU source returns for one poll: the snapshots, and whether telemetry worked."""

    source: str
    ok: bool
    gpus: dict[str, GpuSnapshot] = field(default_factory=dict)   # by uuid
    error: str | None = None
    time: float = 0.0


@dataclass
class EngineSnapshot:
    """One engine at one instant, whatever its kind (bundled, vLLM, TGI, llama.cpp).

    ``missing`` names the fields the engine did not report (e.g. an old vLLM without
    ``num_requests_running``): they stay ``None`` and are listed there, never read as 0.
    """

    name: str
    kind: str
    ok: bool
    time: float = 0.0
    error: str | None = None
    precision: str | None = None
    draining: bool | None = None
    running: int | None = None
    waiting: int | None = None
    kv_usage_ratio: float | None = None
    kv_waste_ratio: float | None = None
    memory_budget_bytes: int | None = None
    memory_allocated_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    memory_free_bytes: int | None = None
    full_weights_bytes: int | None = None
    weights_bytes: int | None = None
    steps_total: float | None = None
    step_sequences_total: float | None = None
    real_tokens_total: float | None = None
    padded_tokens_total: float | None = None
    preemptions_total: float | None = None
    oom_total: float | None = None
    faults: list[dict] = field(default_factory=list)      # the engine's recent OOM faults, newest last
    recent_requests: list[dict] = field(default_factory=list)
    # {"buckets": [(le, cumulative count)...], "sum": s, "count": c}
    ttft_histogram: dict[str, Any] | None = None
    e2e_histogram: dict[str, Any] | None = None
    finished_total: float | None = None
    by_finish_reason: dict[str, float] | None = None
    itl_histogram: dict[str, Any] | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    model: str | None = None
    per_engine: dict[str, dict[str, Any]] = field(default_factory=dict)  # vLLM data-parallel: by `engine` label
    missing: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    raw: dict[str, Any] | None = None
    # TTFT histograms by served model name, same shape as ``ttft_histogram``, where the engine
    # labels them by model (the latency breaker judges the main model apart from the light one).
    ttft_histogram_by_model: dict[str, dict[str, Any]] = field(default_factory=dict)


#: Every EngineSnapshot field in declaration order with its default (None for the fields that
#: have none or a default factory: :func:`engine_snapshot` fills those).
_SNAPSHOT_DEFAULTS: dict[str, Any] = {f.name: None if f.default is MISSING else f.default
                                      for f in fields(EngineSnapshot)}
_SNAPSHOT_FACTORY_FIELDS = frozenset(f.name for f in fields(EngineSnapshot) if f.default_factory is not MISSING)
assert _SNAPSHOT_FACTORY_FIELDS == {"faults", "recent_requests", "per_engine", "missing", "invalid",
                                    "ttft_histogram_by_model"}


def engine_snapshot(name: str, kind: str, ok: bool, time: float, error: str | None = None,
                    raw: dict[str, Any] | None = None) -> EngineSnapshot:
    """``EngineSnapshot(name=..., kind=..., ok=..., time=..., error=..., raw=...)``, equal to it
    attribute for attribute (fresh empty lists and dicts, the defaults elsewhere), built as one
    dict (a copy of the defaults) instead of the generated ``__init__``'s 42 keyword parameters
    and assignments: about half the CPU, for every engine every poll
    (tests/unit/test_tick_snapshot_builders.py checks the equality)."""
    s = object.__new__(EngineSnapshot)
    d = _SNAPSHOT_DEFAULTS.copy()
    d["name"] = name
    d["kind"] = kind
    d["ok"] = ok
    d["time"] = time
    d["error"] = error
    d["raw"] = raw
    d["faults"] = []
    d["recent_requests"] = []
    d["per_engine"] = {}
    d["missing"] = []
    d["invalid"] = []
    d["ttft_histogram_by_model"] = {}
    s.__dict__ = d
    return s


@dataclass
class Decision:
    """What a policy decided in one tick: an ``action`` (or ``None`` for a pure transition),
    the state transition it made, the ``reason`` in words and the ``inputs`` it used."""

    policy: str
    target: str                 # engine name or GPU uuid
    # degrade, rollback, drain_restart, reset_gpu, isolate_gpu, reboot_node, route_light, ...
    action: str | None
    from_state: str | None
    to_state: str | None
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)
    severity: str = "info"      # info, warning, critical

    @property
    def kind(self) -> str:
        """How the loop records and routes it: ``transition`` (the state changed),
        ``decision`` (an action in the same state) or ``observation`` (neither)."""
        if self.from_state != self.to_state:
            return "transition"
        return "decision" if self.action else "observation"

    @property
    def handoff(self) -> str | None:
        """The GPU policy this decision is handed to (``inputs["handoff"]``, e.g. ``"hardware"``
        for an engine fault that points at the GPU), None when it stays with its policy."""
        target = (self.inputs or {}).get("handoff")
        return target if isinstance(target, str) and target else None
