"""GPU source on NVML through nvidia-ml-py (``import pynvml``).

What it reads, per GPU (NVML API reference, https://docs.nvidia.com/deploy/nvml-api/):
memory with ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`` (``used`` excludes the
driver's ``reserved``; falls back to v1 where v2 is unsupported, and then ``reserved`` is None
and ``used`` includes it), utilization (``gpu`` -> utilization_ratio, ``memory`` -> memory
bandwidth), temperature, power (mW -> W), enforced power limit, fan, P-state, SM/memory clocks,
volatile ECC totals, remapped rows, persistence mode, MIG mode, compute processes, GPU recovery
action (field 230, ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``) and Xid events
(``nvmlEventTypeXidCriticalError``, one event set per GPU, drained with
``nvmlEventSetWait_v2(set, 0)`` each poll).

Faults, each handled where it belongs:

- Every poll's NVML calls run on a worker thread under a deadline (``timeout_s``, shorter than
  the poll interval). A hung call marks telemetry down for that poll; while the call stays hung
  later polls return "down" at once instead of piling up threads. The loop never stalls.
- ``NVMLError_NotSupported`` (and other per-field errors) -> that field is ``None``, logged once
  per (GPU, field) for the source's lifetime (docs/field-cases.md F10), never per poll.
- ``NVMLError_GpuIsLost`` on one GPU -> that GPU's snapshot has ``lost=True``, ``health="lost"``
  and no numbers; the other GPUs keep reporting (docs/field-cases.md F09).
- Library-level failures (``nvmlInit`` raising ``NVMLError_Unknown`` in a container after a
  cgroup change, driver unloaded, library/driver mismatch, ``Unknown`` from a core call) ->
  ``ok=False``, no GPUs, so no memory numbers and no false "memory recovered" (docs/field-cases.md F08); NVML is
  shut down and re-initialised with exponential backoff (``backoff_initial_s`` doubling up to
  ``backoff_max_s``), and readings resume when it works again.

Standing hardware state (docs/policies.md "Hardware"): aggregate (lifetime) ECC totals
(``NVML_AGGREGATE_ECC``) and pending page retirement
(``nvmlDeviceGetRetiredPagesPendingStatus``: ``NVML_FEATURE_ENABLED`` = pages wait for the next
reset/reload; NotSupported on GPUs that remap rows instead, then None).

MIG: when MIG mode is on, each MIG device (``nvmlDeviceGetMaxMigDeviceCount`` slots,
``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot raises NotFound) becomes a
:class:`MigInstance` with its GPU/compute instance ids (``nvmlDeviceGetGpuInstanceId`` /
``nvmlDeviceGetComputeInstanceId``), MIG UUID and its own memory (``nvmlDeviceGetMemoryInfo`` on
the MIG handle). The parent GPU's numbers stay whole-GPU.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from inferctl.controller.gpu.base import GpuSource, down_reading
from inferctl.controller.gpu.xid import normalize_pci_bus_id
from inferctl.controller.types import GpuProcess, GpuReading, GpuSnapshot, MigInstance, XidEvent

log = logging.getLogger(__name__)

FIELD_RECOVERY_ACTION = 230          # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h)
PSTATE_UNKNOWN = 32                  # NVML_PSTATE_UNKNOWN
MAX_XID_EVENTS_PER_POLL = 64

# union member of c_nvmlValue_t for each NVML_VALUE_TYPE_* (nvml.h: nvmlValueType_t)
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class _GpuLost(Exception):
    pass


class _LibraryDown(Exception):
    pass


class _Hung(Exception):
    pass


def _load_pynvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def probe_nvml(nvml: Any = None, timeout_s: float = 5.0) -> str | None:
    """``None`` if ``nvmlInit()`` works here (then shut down again), else the reason in words.
    Bounded by ``timeout_s`` (a hung driver is a reason too)."""
    try:
        mod = nvml if nvml is not None else _load_pynvml()
    except ImportError as exc:
        return f"nvidia-ml-py is not installed ({exc})"
    box: dict[str, Any] = {}

    def attempt() -> None:
        try:
            mod.nvmlInit()
            try:
                mod.nvmlShutdown()
            except Exception:  # shutdown failure does not make NVML unusable
                pass
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            box["error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=attempt, name="nvml-probe", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return f"nvmlInit did not answer within {timeout_s:g} s"
    return box.get("error")


@dataclass
class _Device:
    index: int
    handle: Any = None
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    event_set: Any = None
    memory_v1: bool = False          # v2 memory info unsupported: use v1


@dataclass
class _State:
    initialized: bool = False
    devices: list[_Device] = field(default_factory=list)


class NvmlGpuSource(GpuSource):
    """NVML GPU source.

    ``nvml``: the pynvml module (default: ``import pynvml``); tests inject a fake module object
    that raises pynvml's real exception classes. ``timeout_s``: deadline for one poll's NVML
    calls (must be < ``poll_interval_s`` when that is given; ``ValueError`` otherwise).
    ``backoff_initial_s`` / ``backoff_max_s``: re-initialisation backoff after NVML failed.
    ``xid_events``: register for Xid critical-error events.
    """

    name = "nvml"
    OPTIONS = ("nvml", "timeout_s", "poll_interval_s", "backoff_initial_s", "backoff_max_s",
               "xid_events")

    def __init__(self, nvml: Any = None, *, timeout_s: float = 2.0,
                 poll_interval_s: float | None = None, backoff_initial_s: float = 1.0,
                 backoff_max_s: float = 60.0, xid_events: bool = True) -> None:
        if not timeout_s > 0:
            raise ValueError(f"nvml timeout_s must be > 0, got {timeout_s!r}")
        if poll_interval_s is not None and not timeout_s < poll_interval_s:
            raise ValueError(f"nvml timeout_s ({timeout_s}) must be shorter than poll_interval_s "
                             f"({poll_interval_s})")
        if not 0 < backoff_initial_s <= backoff_max_s:
            raise ValueError(f"nvml backoff must satisfy 0 < backoff_initial_s ({backoff_initial_s}) "
                             f"<= backoff_max_s ({backoff_max_s})")
        self._nvml = nvml if nvml is not None else _load_pynvml()
        self.timeout_s = float(timeout_s)
        self.backoff_initial_s = float(backoff_initial_s)
        self.backoff_max_s = float(backoff_max_s)
        self.xid_events = xid_events
        self._state = _State()
        self._uuid_by_index: dict[int, str] = {}
        self._logged: set[tuple[str, str]] = set()
        self._backoff = self.backoff_initial_s
        self._next_init_at: float | None = None
        self._last_error: str | None = None
        self._hung: threading.Thread | None = None
        self._hung_since: float | None = None
        self._codes = self._error_codes()

    # ------------------------------------------------------------------ public
    @property
    def next_retry_at(self) -> float | None:
        """When NVML will next be (re)initialised, while it is down; else None."""
        return None if self._state.initialized else self._next_init_at

    def poll(self, now: float) -> GpuReading:
        if self._hung is not None:
            if self._hung.is_alive():
                return down_reading(self.name, now, f"NVML call hung since {self._hung_since:.3f} "
                                                    f"(> {self.timeout_s:g} s); telemetry down")
            self._hung = None
        if not self._state.initialized:
            if self._next_init_at is not None and now < self._next_init_at:
                return down_reading(self.name, now, f"{self._last_error}; next NVML retry in "
                                                    f"{self._next_init_at - now:.1f} s")
            try:
                self._deadline(self._init, now)
            except _Hung:
                return down_reading(self.name, now, f"nvmlInit did not return within {self.timeout_s:g} s")
            except Exception as exc:
                return self._library_down(now, f"NVML init failed: {_describe(exc)}")
        try:
            gpus = self._deadline(lambda: self._collect(now), now)
        except _Hung:
            return down_reading(self.name, now, f"NVML poll did not return within {self.timeout_s:g} s; "
                                                "telemetry down")
        except _LibraryDown as exc:
            self._shutdown_quietly()
            return self._library_down(now, f"NVML failed: {exc}")
        except Exception as exc:  # anything unexpected: telemetry down, never a crash
            log.exception("nvml: unexpected error while polling")
            self._shutdown_quietly()
            return self._library_down(now, f"NVML poll failed: {_describe(exc)}")
        self._backoff = self.backoff_initial_s
        self._next_init_at = None
        self._last_error = None
        return GpuReading(source=self.name, ok=True, gpus=gpus, time=now)

    def close(self) -> None:
        if self._state.initialized and (self._hung is None or not self._hung.is_alive()):
            try:
                self._deadline(self._shutdown, 0.0)
            except Exception:  # closing must not raise
                pass
        self._state = _State()

    # ------------------------------------------------------------------ deadline worker
    def _deadline(self, fn: Callable[[], Any], now: float) -> Any:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = fn()
            except BaseException as exc:  # re-raised in the caller's thread
                box["error"] = exc

        t = threading.Thread(target=target, name="nvml-call", daemon=True)
        t.start()
        t.join(self.timeout_s)
        if t.is_alive():
            self._hung, self._hung_since = t, now
            log.warning("nvml: call did not return within %.3g s; telemetry marked down", self.timeout_s)
            raise _Hung()
        if "error" in box:
            raise box["error"]
        return box.get("result")

    # ------------------------------------------------------------------ lifecycle
    def _library_down(self, now: float, error: str) -> GpuReading:
        self._state = _State()
        self._next_init_at = now + self._backoff
        if error != self._last_error:
            log.warning("nvml: %s; telemetry down, retrying with backoff (next in %.3g s)",
                        error, self._backoff)
        self._backoff = min(self._backoff * 2, self.backoff_max_s)
        self._last_error = error
        return down_reading(self.name, now, error)

    def _init(self) -> None:
        nv = self._nvml
        nv.nvmlInit()
        count = nv.nvmlDeviceGetCount()
        devices = []
        for i in range(count):
            dev = _Device(index=i)
            self._open_device(dev)
            devices.append(dev)
        self._state = _State(initialized=True, devices=devices)

    def _open_device(self, dev: _Device) -> None:
        """Handle, identity and Xid event set of one device; a lost device stays handle-less."""
        nv = self._nvml
        label = f"GPU {dev.index}"
        try:
            dev.handle = self._call(label, "handle", "nvmlDeviceGetHandleByIndex", dev.index, core=True)
            dev.uuid = _text(self._call(label, "uuid", "nvmlDeviceGetUUID", dev.handle, core=True))
            dev.name = _text(self._call(label, "name", "nvmlDeviceGetName", dev.handle))
            pci = self._call(label, "pci_bus_id", "nvmlDeviceGetPciInfo", dev.handle)
            dev.pci_bus_id = normalize_pci_bus_id(_text(getattr(pci, "busId", None))) if pci else None
        except _GpuLost:
            dev.handle = None
            return
        if dev.uuid:
            self._uuid_by_index[dev.index] = dev.uuid
        if self.xid_events and dev.handle is not None:
            try:
                es = self._call(self._label(dev), "xid_events", "nvmlEventSetCreate")
                if es is not None and es is not _FAILED:
                    ok = self._call(self._label(dev), "xid_events", "nvmlDeviceRegisterEvents",
                                    dev.handle, nv.nvmlEventTypeXidCriticalError, es, ret_none_ok=True)
                    if ok is _FAILED:
                        self._call(self._label(dev), "xid_events", "nvmlEventSetFree", es, quiet=True)
                    dev.event_set = es if ok is not _FAILED else None
            except _GpuLost:
                dev.event_set = None

    def _shutdown(self) -> None:
        nv = self._nvml
        for dev in self._state.devices:
            if dev.event_set is not None:
                try:
                    nv.nvmlEventSetFree(dev.event_set)
                except Exception:  # freeing a set on a broken driver may fail; nothing to do
                    pass
        nv.nvmlShutdown()

    def _shutdown_quietly(self) -> None:
        try:
            self._deadline(self._shutdown, 0.0)
        except Exception:  # NVML is already broken; shutdown is best effort
            pass
        self._state = _State()

    # ------------------------------------------------------------------ reading
    def _label(self, dev: _Device) -> str:
        return f"GPU {dev.index} ({dev.uuid or '?'})"

    def _collect(self, now: float) -> dict[str, GpuSnapshot]:
        out: dict[str, GpuSnapshot] = {}
        for dev in self._state.devices:
            if dev.handle is None:          # lost at init or earlier: try again each poll
                self._open_device(dev)
            uuid = dev.uuid or self._uuid_by_index.get(dev.index) or f"GPU-unknown-index-{dev.index}"
            snap = GpuSnapshot(uuid=uuid, index=dev.index, name=dev.name, pci_bus_id=dev.pci_bus_id,
                               time=now)
            if dev.handle is None:
                self._mark_lost(snap, "no handle (GPU is lost)")
            else:
                try:
                    self._read(dev, snap, now)
                except _GpuLost as exc:
                    snap = GpuSnapshot(uuid=uuid, index=dev.index, name=dev.name,
                                       pci_bus_id=dev.pci_bus_id, time=now)
                    self._mark_lost(snap, str(exc))
            out[uuid] = snap
        return out

    def _mark_lost(self, snap: GpuSnapshot, why: str) -> None:
        snap.lost = True
        snap.health = "lost"
        key = (snap.uuid, "lost")
        if key not in self._logged:
            self._logged.add(key)
            log.error("nvml: GPU %s (%s) is lost: %s; the other GPUs keep reporting",
                      snap.index, snap.uuid, why)

    def _read(self, dev: _Device, s: GpuSnapshot, now: float) -> None:
        nv, h, lab = self._nvml, dev.handle, self._label(dev)
        c = self._call
        mem = None
        if not dev.memory_v1:
            mem = c(lab, "memory_v2", "nvmlDeviceGetMemoryInfo", h, version=nv.nvmlMemory_v2,
                    core=True, quiet=True)
            if mem is _FAILED:
                dev.memory_v1 = True
                self._log_once(lab, "memory_reserved_bytes",
                               "memory info v2 unsupported; using v1 (used includes reserved)")
        if dev.memory_v1:
            mem = c(lab, "memory", "nvmlDeviceGetMemoryInfo", h, core=True)
            if mem is not _FAILED and mem is not None:
                s.memory_total_bytes, s.memory_free_bytes = int(mem.total), int(mem.free)
                s.memory_used_bytes = int(mem.used)
        elif mem is not None and mem is not _FAILED:
            s.memory_total_bytes, s.memory_free_bytes = int(mem.total), int(mem.free)
            s.memory_used_bytes, s.memory_reserved_bytes = int(mem.used), int(mem.reserved)
        util = c(lab, "utilization", "nvmlDeviceGetUtilizationRates", h)
        if util is not _FAILED and util is not None:
            s.utilization_ratio = _pct(getattr(util, "gpu", None))
            s.memory_bandwidth_utilization_ratio = _pct(getattr(util, "memory", None))
        s.temperature_celsius = _num(c(lab, "temperature_celsius", "nvmlDeviceGetTemperature", h,
                                       nv.NVML_TEMPERATURE_GPU))
        s.power_watts = _milli(c(lab, "power_watts", "nvmlDeviceGetPowerUsage", h))
        s.power_limit_watts = _milli(c(lab, "power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", h))
        s.fan_ratio = _pct(c(lab, "fan_ratio", "nvmlDeviceGetFanSpeed", h))
        ps = _num(c(lab, "pstate", "nvmlDeviceGetPerformanceState", h))
        s.pstate = None if ps is None or int(ps) == PSTATE_UNKNOWN else f"P{int(ps)}"
        s.clocks_sm_mhz = _num(c(lab, "clocks_sm_mhz", "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM))
        s.clocks_mem_mhz = _num(c(lab, "clocks_mem_mhz", "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM))
        s.ecc_corrected = _int(c(lab, "ecc_corrected", "nvmlDeviceGetTotalEccErrors", h,
                                 nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC))
        s.ecc_uncorrected = _int(c(lab, "ecc_uncorrected", "nvmlDeviceGetTotalEccErrors", h,
                                   nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))
        s.ecc_corrected_aggregate = _int(c(lab, "ecc_corrected_aggregate", "nvmlDeviceGetTotalEccErrors", h,
                                           nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC))
        s.ecc_uncorrected_aggregate = _int(c(lab, "ecc_uncorrected_aggregate", "nvmlDeviceGetTotalEccErrors", h,
                                             nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC))
        pend = _num(c(lab, "retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", h))
        s.retired_pages_pending = None if pend is None else int(pend) == nv.NVML_FEATURE_ENABLED
        rows = c(lab, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
        if rows is not _FAILED and rows is not None:
            s.remapped_rows_pending, s.remapped_rows_failure = bool(rows[2]), bool(rows[3])
        pm = _num(c(lab, "persistence_mode", "nvmlDeviceGetPersistenceMode", h))
        s.persistence_mode = None if pm is None else pm == nv.NVML_FEATURE_ENABLED
        mig = c(lab, "mig_enabled", "nvmlDeviceGetMigMode", h)
        if mig is not _FAILED and mig is not None:
            s.mig_enabled = int(mig[0]) == 1
            if s.mig_enabled:
                s.mig_instances = self._mig_instances(lab, h)
        s.recovery_action = self._recovery_action(lab, h)
        procs = c(lab, "processes", "nvmlDeviceGetComputeRunningProcesses", h)
        if procs is not _FAILED and procs is not None:
            s.processes = [self._process(p) for p in procs]
        if dev.event_set is not None:
            s.xid_events = self._drain_xids(dev, now)

    def _mig_instances(self, lab: str, h: Any) -> list[MigInstance]:
        """The MIG devices of a GPU in MIG mode, each with its own memory (bytes); a slot that
        is empty (NotFound) or unreadable is skipped; memory not readable stays None."""
        c = self._call
        count = _int(c(lab, "mig_instances", "nvmlDeviceGetMaxMigDeviceCount", h))
        out: list[MigInstance] = []
        for i in range(count or 0):
            mh = c(lab, "mig_instances", "nvmlDeviceGetMigDeviceHandleByIndex", h, i, quiet=True)
            if mh is _FAILED or mh is None:
                continue
            gi = _int(c(lab, "mig_gpu_instance_id", "nvmlDeviceGetGpuInstanceId", mh))
            ci = _int(c(lab, "mig_compute_instance_id", "nvmlDeviceGetComputeInstanceId", mh))
            uuid = c(lab, "mig_uuid", "nvmlDeviceGetUUID", mh)
            mem = c(lab, "mig_memory", "nvmlDeviceGetMemoryInfo", mh)
            m = MigInstance(gpu_instance_id=gi, compute_instance_id=ci,
                            uuid=None if uuid is _FAILED or uuid is None else _text(uuid))
            if mem is not _FAILED and mem is not None:
                m.memory_total_bytes, m.memory_free_bytes = int(mem.total), int(mem.free)
                m.memory_used_bytes = int(mem.used)
            out.append(m)
        return out

    def _recovery_action(self, lab: str, h: Any) -> int | None:
        vals = self._call(lab, "recovery_action", "nvmlDeviceGetFieldValues", h,
                          [FIELD_RECOVERY_ACTION])
        if vals is _FAILED or vals is None or len(vals) < 1:
            return None
        v = vals[0]
        ret = getattr(v, "nvmlReturn", 0)
        if ret != 0:
            self._log_once(lab, "recovery_action", f"field {FIELD_RECOVERY_ACTION} returned NVML error {ret}")
            return None
        member = _VALUE_MEMBERS.get(int(getattr(v, "valueType", 1)), "uiVal")
        raw = getattr(getattr(v, "value", None), member, None)
        return None if raw is None else int(raw)

    def _process(self, p: Any) -> GpuProcess:
        mem = getattr(p, "usedGpuMemory", None)
        gi = getattr(p, "gpuInstanceId", None)
        name = None
        get_name = getattr(self._nvml, "nvmlSystemGetProcessName", None)
        if get_name is not None:
            try:
                name = _text(get_name(p.pid))
            except Exception:  # the process may have exited; the name is optional
                name = None
        return GpuProcess(pid=int(p.pid), name=name,
                          used_memory_bytes=int(mem) if isinstance(mem, int) and mem >= 0 else None,
                          gpu_instance_id=int(gi) if isinstance(gi, int) and gi < 0xFFFFFFFF else None)

    def _drain_xids(self, dev: _Device, now: float) -> list[XidEvent]:
        nv = self._nvml
        events: list[XidEvent] = []
        for _ in range(MAX_XID_EVENTS_PER_POLL):
            try:
                data = nv.nvmlEventSetWait_v2(dev.event_set, 0)
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == self._codes.get("TIMEOUT"):
                    break                       # no (more) events
                if code == self._codes.get("GPU_IS_LOST"):
                    raise _GpuLost("Xid event wait: GPU is lost") from None
                self._log_once(self._label(dev), "xid_events", _describe(exc))
                break
            xid = int(getattr(data, "eventData", 0))
            events.append(XidEvent(xid=xid, pci_bus_id=dev.pci_bus_id,
                                   message=f"Xid {xid} reported by NVML event", time=now,
                                   source="nvml", gpu_uuid=dev.uuid,
                                   lost=xid == 79))
        return events

    # ------------------------------------------------------------------ error handling
    def _error_codes(self) -> dict[str, int]:
        names = ("UNINITIALIZED", "NOT_SUPPORTED", "DRIVER_NOT_LOADED", "TIMEOUT", "LIBRARY_NOT_FOUND",
                 "FUNCTION_NOT_FOUND", "GPU_IS_LOST", "LIB_RM_VERSION_MISMATCH", "UNKNOWN",
                 "ARGUMENT_VERSION_MISMATCH")
        return {n: getattr(self._nvml, f"NVML_ERROR_{n}") for n in names
                if hasattr(self._nvml, f"NVML_ERROR_{n}")}

    def _call(self, label: str, field: str, fn_name: str, *args: Any, core: bool = False,
              quiet: bool = False, ret_none_ok: bool = False, **kwargs: Any) -> Any:
        """Call the NVML function ``fn_name``. Returns its result, or ``_FAILED`` for a per-field
        failure (logged once per (GPU, field) unless ``quiet``): an NVML error other than the
        ones below, a function this nvidia-ml-py lacks, or any other exception from the binding.
        Raises ``_GpuLost`` for GpuIsLost and ``_LibraryDown`` for library-level errors (and for
        Unknown on ``core`` calls)."""
        codes = self._codes
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            if core:
                raise _LibraryDown(f"{fn_name} is missing from this nvidia-ml-py")
            if not quiet:
                self._log_once(label, field, f"{fn_name} is missing from this nvidia-ml-py")
            return _FAILED
        try:
            result = fn(*args, **kwargs)
            return True if (ret_none_ok and result is None) else result
        except self._nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == codes.get("GPU_IS_LOST"):
                raise _GpuLost(f"{fn_name}: {_describe(exc)}") from None
            library = {codes.get(k) for k in ("UNINITIALIZED", "DRIVER_NOT_LOADED", "LIBRARY_NOT_FOUND",
                                              "LIB_RM_VERSION_MISMATCH")}
            if code in library or (core and code == codes.get("UNKNOWN")):
                raise _LibraryDown(f"{fn_name} on {label}: {_describe(exc)}") from None
            why = _describe(exc)
        except (TypeError, ValueError, AttributeError, OSError) as exc:   # binding-level surprises
            why = f"{fn_name}: {_describe(exc)}"
        if not quiet:
            self._log_once(label, field, why)
        return _FAILED

    def _log_once(self, label: str, field: str, why: str) -> None:
        key = (label, field)
        if key in self._logged:
            return
        self._logged.add(key)
        log.info("nvml: %s: %s not available (%s); reported as no data (logged once)", label, field, why)


class _Failed:
    def __repr__(self) -> str:
        return "<failed>"


_FAILED: Any = _Failed()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _text(v: Any) -> str | None:
    if v is None or v is _FAILED:
        return None
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    v = str(v).strip()
    return v or None


def _num(v: Any) -> float | None:
    if v is None or v is _FAILED or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None


def _int(v: Any) -> int | None:
    f = _num(v)
    return None if f is None or f < 0 else int(f)


def _pct(v: Any) -> float | None:
    f = _num(v)
    if f is None or f < 0 or f > 100:
        return None
    return f / 100.0


def _milli(v: Any) -> float | None:
    """NVML power is in milliwatts: 219000 mW -> 219.0 W."""
    f = _num(v)
    return None if f is None or f < 0 else f / 1000.0
