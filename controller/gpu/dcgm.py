"""GPU source that scrapes a dcgm-exporter ``/metrics`` endpoint.

Mapping (dcgm-exporter default counters; DCGM field docs):

=====================================  ==========================================
DCGM_FI_DEV_FB_USED / FREE / RESERVED  memory used / free / reserved (MiB -> bytes)
DCGM_FI_DEV_FB_TOTAL (if exported)     memory total; else used + free (+ reserved)
DCGM_FI_DEV_GPU_UTIL                   utilization_ratio (% -> 0..1)
DCGM_FI_DEV_MEM_COPY_UTIL              memory_bandwidth_utilization_ratio (% -> 0..1);
                                       DCGM_FI_PROF_DRAM_ACTIVE (0..1) when MEM_COPY_UTIL is absent
DCGM_FI_DEV_GPU_TEMP / MEMORY_TEMP     temperature_celsius / memory_temperature_celsius
DCGM_FI_DEV_POWER_USAGE                power_watts
DCGM_FI_DEV_ENFORCED_POWER_LIMIT,      power_limit_watts
  DCGM_FI_DEV_POWER_MGMT_LIMIT
DCGM_FI_DEV_SM_CLOCK / MEM_CLOCK       clocks_sm_mhz / clocks_mem_mhz
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL          ecc_corrected
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL          ecc_uncorrected
DCGM_FI_DEV_ECC_SBE/DBE_AGG_TOTAL      ecc_corrected_aggregate / ecc_uncorrected_aggregate
DCGM_FI_DEV_RETIRED_PENDING            retired_pages_pending (count > 0)
DCGM_FI_DEV_ROW_REMAP_PENDING/FAILURE  remapped_rows_pending / remapped_rows_failure
DCGM_FI_DEV_XID_ERRORS                 the last Xid (an XidEvent when it changes to a non-zero code)
=====================================  ==========================================

Labels: GPU identity from ``UUID`` (``uuid`` in the exporter's old-namespace mode), ``gpu``
(index), ``pci_bus_id``, ``modelName``; the host label is ``Hostname`` before dcgm-exporter
commit d5e5f51 and ``hostname`` after: both are accepted (neither is needed for the mapping).
When one UUID appears with several ``gpu`` indexes (UUIDs masked in a capture), the key becomes
``<uuid>#gpu<index>`` so distinct GPUs are not merged.

MIG: series carrying ``GPU_I_ID`` belong to a GPU instance. FB_* and PROF_GR_ENGINE_ACTIVE from
such series go to ``GpuSnapshot.mig_instances`` (one :class:`MigInstance` per ``GPU_I_ID``, with
``GPU_I_PROFILE``); device-wide fields (temperatures, power, clocks, ECC, Xid) are taken from any
series of the GPU, preferring whole-GPU series. The parent's memory stays ``None`` unless the
exporter also sends whole-GPU FB_* series (dcgm-exporter issue #512).

Blank values (DCGM's ``dcgm_structs.h``, "DCGM_BLANK_VALUES"; the same constants are
go-dcgm's ``DCGM_FT_INT32_BLANK`` / ``DCGM_FT_INT64_BLANK`` / ``DCGM_FT_FP64_BLANK`` that
dcgm-exporter skips): ``DCGM_INT32_BLANK`` = 0x7ffffff0, ``DCGM_INT64_BLANK`` =
0x7ffffffffffffff0 and ``DCGM_FP64_BLANK`` = 2**47, each +1..+3 for not-found /
not-supported / not-permissioned. Only these sentinels are "no data" (None):

* integer fields (DCGM_FT_INT64: counters, temperatures, clocks, FB, Xid): the four INT32
  sentinels exactly (go-dcgm compares an int64 value against both families), and any value
  ``>= DCGM_INT64_BLANK`` (``DCGM_INT64_IS_BLANK``; in the float of the text format the four
  INT64 sentinels all read 2**63, above any real int64);
* double fields (DCGM_FT_DOUBLE: power, PROF_*): ``>= DCGM_FP64_BLANK``
  (``DCGM_FP64_IS_BLANK``), which also covers DBL_MAX;
* NaN, infinities and negative values are invalid (None) for every field.

A real large counter (an ECC count of 2**31 or 2**40) is a value, never a blank.

Standing hardware state (docs/policies.md "Hardware"): ``DCGM_FI_DEV_ECC_SBE/DBE_AGG_TOTAL``
→ ``ecc_corrected_aggregate`` / ``ecc_uncorrected_aggregate``; ``DCGM_FI_DEV_RETIRED_PENDING``
(pages pending retirement, a count) → ``retired_pages_pending`` (count > 0).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field

import httpx

from inferctl.controller.scrape.http import bounded_request
from inferctl.controller.scrape.promtext import PromSample, parse_prometheus_text
from inferctl.controller.gpu.base import GpuSource, down_reading
from inferctl.controller.gpu.xid import normalize_pci_bus_id
from inferctl.controller.types import GpuReading, GpuSnapshot, MigInstance, XidEvent

log = logging.getLogger(__name__)

MIB = 1024 * 1024
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0


#: The INT32 family: blank, not found, not supported, not permissioned (dcgm_structs.h).
DCGM_INT32_SENTINELS = frozenset(float(DCGM_INT32_BLANK + i) for i in range(4))
#: DCGM fields of type DCGM_FT_DOUBLE among those mapped here (dcgm_fields.h); the rest are INT64.
FP64_FIELDS = frozenset({"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
                         "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_PROF_DRAM_ACTIVE",
                         "DCGM_FI_PROF_GR_ENGINE_ACTIVE"})


def is_dcgm_blank(value: float, fp64: bool = False) -> bool:
    """True for DCGM's documented "no data" sentinels (module docstring), NaN and infinities.

    ``fp64``: the field is DCGM_FT_DOUBLE (blank at or above ``DCGM_FP64_BLANK``); otherwise
    it is an integer field: blank for the four INT32 sentinels exactly or at or above
    ``DCGM_INT64_BLANK``. Any other value, however large, is data."""
    if math.isnan(value) or math.isinf(value):
        return True
    if fp64:
        return value >= DCGM_FP64_BLANK
    return value in DCGM_INT32_SENTINELS or value >= float(DCGM_INT64_BLANK)


_GAUGES: dict[str, tuple[str, float]] = {
    # metric -> (snapshot attribute, scale)
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_ratio", 0.01),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("memory_bandwidth_utilization_ratio", 0.01),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_celsius", 1.0),
    "DCGM_FI_DEV_MEMORY_TEMP": ("memory_temperature_celsius", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_watts", 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_watts", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_watts", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("clocks_sm_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("clocks_mem_mhz", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("memory_bandwidth_utilization_ratio", 1.0),
}
_INTS = {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_corrected",
         "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_uncorrected",
         "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_corrected_aggregate",
         "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_uncorrected_aggregate"}
_BOOLS = {"DCGM_FI_DEV_ROW_REMAP_PENDING": "remapped_rows_pending",
          "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remapped_rows_failure",
          "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending"}
_MEM = {"DCGM_FI_DEV_FB_USED": "used", "DCGM_FI_DEV_FB_FREE": "free",
        "DCGM_FI_DEV_FB_RESERVED": "reserved", "DCGM_FI_DEV_FB_TOTAL": "total"}
_RATIO_ATTRS = {"utilization_ratio", "memory_bandwidth_utilization_ratio"}
#: lower number = preferred source for an attribute filled by several metrics
_PRIORITY = {"DCGM_FI_DEV_MEM_COPY_UTIL": 0, "DCGM_FI_PROF_DRAM_ACTIVE": 1,
             "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 0, "DCGM_FI_DEV_POWER_MGMT_LIMIT": 1}
_KNOWN = (set(_GAUGES) | set(_INTS) | set(_BOOLS) | set(_MEM)
          | {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_XID_ERRORS"})


def _metric_name(sample_name: str) -> str:
    """prometheus-client appends ``_total`` to samples of families typed ``counter``
    (e.g. DCGM_FI_DEV_ECC_DBE_VOL_TOTAL): undo that for the names mapped here."""
    if sample_name.endswith("_total") and sample_name[:-6] in _KNOWN:
        return sample_name[:-6]
    return sample_name


@dataclass
class DcgmParse:
    """Result of parsing one scrape."""

    gpus: dict[str, GpuSnapshot]
    last_xid: dict[str, tuple[int, str]] = field(default_factory=dict)  # key -> (xid, err_msg)
    blanks: list[str] = field(default_factory=list)     # "METRIC{uuid}" that held a blank/invalid value
    bad_lines: list[str] = field(default_factory=list)  # lines the Prometheus parser rejected
    hostnames: set[str] = field(default_factory=set)


def _uuid(s: PromSample) -> str | None:
    return s.labels.get("UUID") or s.labels.get("uuid")


def _mig_order(item: tuple[tuple[str, str], dict]) -> tuple[str, int]:
    """Sort key of a MIG instance: (GPU key, GPU instance id as a number; 0 when not one)."""
    (key, gi), _ = item
    return key, int(gi) if gi.isdigit() else 0


def parse_dcgm_text(text: str, now: float = 0.0) -> tuple[dict[str, GpuSnapshot], DcgmParse]:
    """Parse dcgm-exporter text -> ``(snapshots by key, details)``. See the module docstring for
    the mapping, MIG handling and blank sentinels. Series without a UUID label are ignored."""
    samples, bad = parse_prometheus_text(text)
    samples = [s for s in samples if s.name.startswith("DCGM_FI_") and _uuid(s)]
    # masked / duplicate UUIDs: key by uuid + gpu index when a uuid spans several indexes
    indexes: dict[str, set[str]] = defaultdict(set)
    for s in samples:
        indexes[_uuid(s)].add(s.labels.get("gpu", ""))  # type: ignore[index]

    def key_of(s: PromSample) -> str:
        u = _uuid(s)
        return f"{u}#gpu{s.labels.get('gpu', '')}" if len(indexes[u]) > 1 else u  # type: ignore[return-value]

    out = DcgmParse(gpus={}, bad_lines=bad)
    chosen: dict[tuple[str, str], tuple[int, int]] = {}   # (key, attr) -> (is_instance, priority)
    mem: dict[tuple[str, str | None], dict[str, int]] = defaultdict(dict)
    mig_meta: dict[tuple[str, str], dict[str, object]] = defaultdict(dict)
    for s in samples:
        key = key_of(s)
        host = s.labels.get("Hostname") or s.labels.get("hostname")
        if host:
            out.hostnames.add(host)
        snap = out.gpus.get(key)
        if snap is None:
            gpu = s.labels.get("gpu")
            snap = GpuSnapshot(uuid=key, index=int(gpu) if gpu and gpu.isdigit() else None,
                               name=s.labels.get("modelName"),
                               pci_bus_id=normalize_pci_bus_id(s.labels.get("pci_bus_id")), time=now)
            out.gpus[key] = snap
        gi = s.labels.get("GPU_I_ID")
        if gi is not None:
            snap.mig_enabled = True
            meta = mig_meta[(key, gi)]
            if s.labels.get("GPU_I_PROFILE"):
                meta["profile"] = s.labels["GPU_I_PROFILE"]
        name = _metric_name(s.name)
        if name not in _KNOWN:
            continue
        v = s.value
        if v < 0 or is_dcgm_blank(v, name in FP64_FIELDS):
            out.blanks.append(f"{name}{{{key}{'/' + gi if gi else ''}}}")
            continue
        if name in _MEM:
            mem[(key, gi)][_MEM[name]] = int(round(v * MIB))
            continue
        if name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
            if gi is not None and v <= 1.0:
                mig_meta[(key, gi)]["util"] = v
            continue
        if name == "DCGM_FI_DEV_XID_ERRORS":
            out.last_xid[key] = (int(v), s.labels.get("err_msg", ""))
            continue
        if name in _GAUGES:
            attr, scale = _GAUGES[name]
            val = v * scale
            if attr in _RATIO_ATTRS and val > 1.0:
                out.blanks.append(f"{name}{{{key}}}")
                continue
        elif name in _INTS:
            attr, val = _INTS[name], int(v)
        else:
            attr, val = _BOOLS[name], bool(v)
        rank = (1 if gi is not None else 0, _PRIORITY.get(name, 0))
        prev = chosen.get((key, attr))
        if prev is None or rank < prev:
            setattr(snap, attr, val)
            chosen[(key, attr)] = rank
    for (key, gi), m in mem.items():
        total = m.get("total")
        if total is None and "used" in m and "free" in m:
            total = m["used"] + m["free"] + m.get("reserved", 0)
        if gi is None:
            snap = out.gpus[key]
            snap.memory_used_bytes = m.get("used")
            snap.memory_free_bytes = m.get("free")
            snap.memory_reserved_bytes = m.get("reserved")
            snap.memory_total_bytes = total
        else:
            meta = mig_meta[(key, gi)]
            meta.update({"used": m.get("used"), "free": m.get("free"),
                         "reserved": m.get("reserved"), "total": total})
    for (key, gi), meta in sorted(mig_meta.items(), key=_mig_order):
        out.gpus[key].mig_instances.append(MigInstance(
            gpu_instance_id=int(gi) if gi.isdigit() else None,
            profile=meta.get("profile"),  # type: ignore[arg-type]
            memory_total_bytes=meta.get("total"), memory_used_bytes=meta.get("used"),  # type: ignore[arg-type]
            memory_free_bytes=meta.get("free"), memory_reserved_bytes=meta.get("reserved"),  # type: ignore[arg-type]
            utilization_ratio=meta.get("util")))  # type: ignore[arg-type]
    return out.gpus, out


class DcgmGpuSource(GpuSource):
    """Scrapes ``url`` (a dcgm-exporter ``/metrics``, e.g. ``http://node:9400/metrics``).

    ``timeout_s`` bounds each scrape; when ``poll_interval_s`` is given it must be larger than
    ``timeout_s`` (``ValueError`` otherwise). Xid: the exporter reports the *last* Xid as a
    gauge; this source emits an :class:`XidEvent` (``source="dcgm"``) when that value changes to
    a non-zero code (including the first scrape that shows one).
    """

    name = "dcgm"
    OPTIONS = ("url", "timeout_s", "poll_interval_s", "transport")

    def __init__(self, url: str, *, timeout_s: float = 2.0, poll_interval_s: float | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        if not url or not url.startswith(("http://", "https://")):
            raise ValueError(f"dcgm url {url!r} must start with http:// or https://")
        if not timeout_s > 0:
            raise ValueError(f"dcgm timeout_s must be > 0, got {timeout_s!r}")
        if poll_interval_s is not None and not timeout_s < poll_interval_s:
            raise ValueError(f"dcgm timeout_s ({timeout_s}) must be shorter than poll_interval_s "
                             f"({poll_interval_s})")
        self.url = url
        self.timeout_s = float(timeout_s)
        self._client = httpx.Client(timeout=timeout_s, transport=transport)
        self._last_xid: dict[str, int] = {}

    def poll(self, now: float) -> GpuReading:
        try:
            resp = bounded_request(self._client, "GET", self.url, deadline_s=self.timeout_s)
        except httpx.HTTPError as exc:
            return down_reading(self.name, now, f"GET {self.url}: {type(exc).__name__}: {exc}")
        if resp.status_code != 200:
            return down_reading(self.name, now, f"GET {self.url}: HTTP {resp.status_code}")
        try:
            gpus, info = parse_dcgm_text(resp.text, now)
        except Exception as exc:  # a parser bug must not stop the loop
            log.exception("dcgm: could not parse scrape of %s", self.url)
            return down_reading(self.name, now, f"dcgm scrape not understood: {exc}")
        if not gpus:
            return down_reading(self.name, now, f"{self.url}: no DCGM_FI_* series with a UUID label")
        for key, (xid, msg) in info.last_xid.items():
            if xid != 0 and self._last_xid.get(key) != xid:
                snap = gpus[key]
                snap.xid_events.append(XidEvent(xid=xid, pci_bus_id=snap.pci_bus_id, message=msg,
                                                time=now, source="dcgm", gpu_uuid=key))
            self._last_xid[key] = xid
        return GpuReading(source=self.name, ok=True, gpus=gpus, time=now)

    def close(self) -> None:
        self._client.close()
