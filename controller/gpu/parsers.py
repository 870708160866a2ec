"""Parsers for recorded nvidia-smi captures -> GpuSnapshots.

Formats: ``nvidia-smi -q`` (text), ``nvidia-smi -q -x`` (XML), ``--query-gpu=... --format=csv``
(with or without header, with or without units), ``--query-compute-apps=... --format=csv``.
Memory is returned in bytes (MiB x 1048576), ratios in 0..1, power in W, clocks in MHz.

"No data" strings (``N/A``, ``[N/A]``, ``[Not Supported]``, ``Requested functionality has been
deprecated``, ``[Unknown Error]``, ``ERR!``, ``[GPU requires reset]``, ...) become ``None``,
never 0. Identifiers: snapshots are keyed by ``GPU UUID``; a capture without a UUID column gets
``row-<n>`` (its position). GPU ``index`` is the order of appearance (nvidia-smi's own order).
PCI bus ids are normalized to ``dddd:bb:dd.f`` (see :func:`controller.gpu.xid.normalize_pci_bus_id`).

MIG: per-instance memory ("MIG Device" / "Shared FB Memory Usage" in ``-q``, ``<mig_device>`` in
``-q -x``) goes to ``GpuSnapshot.mig_instances``; the parent keeps the whole GPU's numbers.
"""

from __future__ import annotations

import calendar
import csv
import io
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from inferctl.controller.gpu.xid import normalize_pci_bus_id
from inferctl.controller.types import GpuProcess, GpuSnapshot, MigInstance

MIB = 1024 * 1024
_UNIT_BYTES = {"b": 1, "kib": 1024, "kb": 1024, "mib": MIB, "mb": MIB, "gib": 1024 * MIB,
               "gb": 1024 * MIB}

_NO_DATA = {
    "", "n/a", "na", "not supported", "unknown error", "requested functionality has been deprecated",
    "err!", "gpu requires reset", "insufficient permissions", "not available", "unknown",
    "no permission", "not found", "gpu is lost",
}

_NUM_RE = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]*)\s*$")


class CaptureFormatError(ValueError):
    """A capture could not be parsed; the message names the format and what was wrong."""


@dataclass
class ParsedCapture:
    """One parsed capture: the GPUs it holds and what it says about itself."""

    kind: str                                 # "q", "qx", "query_gpu", "compute_apps", "dcgm"
    gpus: list[GpuSnapshot] = field(default_factory=list)
    timestamp: float | None = None            # capture time, UTC seconds, when it prints one
    driver_version: str | None = None
    cuda_version: str | None = None
    processes: dict[str, list[GpuProcess]] = field(default_factory=dict)  # compute_apps: by GPU uuid


# --------------------------------------------------------------------------- scalar values

def is_no_data(value: str | None) -> bool:
    """True for ``None`` and nvidia-smi's "no data" strings (brackets and case ignored)."""
    if value is None:
        return True
    v = value.strip().strip("[]").strip().lower()
    return v in _NO_DATA


def parse_number(value: str | None) -> float | None:
    """``"52 %"`` -> 52.0, ``"629.45 W"`` -> 629.45, ``"1980 MHz"`` -> 1980.0; "no data" -> None.
    Anything that is not a number with an optional unit -> None."""
    if is_no_data(value):
        return None
    m = _NUM_RE.match(value)  # type: ignore[arg-type]
    if not m:
        return None
    return float(m.group(1))


def parse_bytes(value: str | None, default_unit: str = "MiB") -> int | None:
    """``"81559 MiB"`` -> 85520809984; a bare number is read in ``default_unit``."""
    if is_no_data(value):
        return None
    m = _NUM_RE.match(value)  # type: ignore[arg-type]
    if not m:
        return None
    unit = (m.group(2) or default_unit).lower()
    if unit not in _UNIT_BYTES:
        return None
    n = float(m.group(1))
    if n < 0:
        return None
    return int(round(n * _UNIT_BYTES[unit]))


def parse_ratio_percent(value: str | None) -> float | None:
    """``"52 %"`` -> 0.52; values outside 0..100 % are invalid -> None."""
    n = parse_number(value)
    if n is None or n < 0 or n > 100:
        return None
    return n / 100.0


def parse_bool(value: str | None) -> bool | None:
    """Enabled/Yes/Active/True/1 -> True; Disabled/No/Not Active/False/0 -> False; else None."""
    if is_no_data(value):
        return None
    v = value.strip().strip("[]").strip().lower()  # type: ignore[union-attr]
    if v in ("enabled", "yes", "active", "true", "1", "on"):
        return True
    if v in ("disabled", "no", "not active", "false", "0", "off"):
        return False
    return None


def parse_int(value: str | None) -> int | None:
    n = parse_number(value)
    return None if n is None else int(n)


_RECOVERY = {"none": 0, "gpureset": 1, "reset": 1, "nodereboot": 2, "reboot": 2, "drainp2p": 3,
             "drainandreset": 4}


def parse_recovery_action(value: str | None) -> int | None:
    """nvidia-smi "GPU Recovery Action" -> NVML field 230 value: None->0, GPU Reset->1,
    Node Reboot->2, Drain P2P->3, Drain and Reset->4; a number is taken as is."""
    if value is None or is_no_data(value):
        return None
    n = parse_number(value)
    if n is not None:
        return int(n)
    key = re.sub(r"[^a-z0-9]", "", value.lower())
    return _RECOVERY.get(key)


def recovery_from_reset_status(reset_required: str | None, drain_and_reset: str | None) -> int | None:
    """Older drivers' "GPU Reset Status" -> field-230 vocabulary: drain-and-reset recommended -> 4,
    reset required -> 1, both "No" -> 0, no data -> None."""
    rr, dr = parse_bool(reset_required), parse_bool(drain_and_reset)
    if dr:
        return 4
    if rr:
        return 1
    if rr is False or dr is False:
        return 0
    return None


def parse_smi_timestamp(value: str | None) -> float | None:
    """``"Tue Jul 14 08:12:53 2026"`` or ``"2026/07/14 08:12:53.500"`` -> seconds since the epoch,
    read as UTC (nvidia-smi prints local time without a zone; captures are compared relatively)."""
    if is_no_data(value):
        return None
    v = " ".join(value.split())  # type: ignore[union-attr]
    for fmt in ("%a %b %d %H:%M:%S %Y", "%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            frac = 0.0
            if fmt.endswith(".%f"):
                head, _, tail = v.partition(".")
                frac = float("0." + tail) if tail.isdigit() else 0.0
                st = time.strptime(head, fmt[:-3])
            else:
                st = time.strptime(v, fmt)
            return calendar.timegm(st) + frac
        except ValueError:
            continue
    return None


def _strip_comments(text: str) -> str:
    """Drop leading ``#`` provenance lines (fixture headers) before the capture itself."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and (lines[i].lstrip().startswith("#") or not lines[i].strip()):
        i += 1
    return "\n".join(lines[i:])


# --------------------------------------------------------------------------- nvidia-smi -q

@dataclass
class _Node:
    key: str
    value: str | None
    children: list["_Node"] = field(default_factory=list)

    def find(self, *names: str) -> "_Node | None":
        """First child whose key matches one of ``names`` (case-insensitive)."""
        wanted = [n.lower() for n in names]
        for c in self.children:
            if c.key.lower() in wanted:
                return c
        return None

    def get(self, *path: str) -> str | None:
        """Value at ``path``; each path element may list alternatives separated by ``|``."""
        node: _Node | None = self
        for part in path:
            if node is None:
                return None
            node = node.find(*part.split("|"))
        return None if node is None else node.value

    def all(self, name: str) -> list["_Node"]:
        return [c for c in self.children if c.key.lower() == name.lower()]


_KV_RE = re.compile(r"^(?P<key>[^:]*?)\s+:\s?(?P<value>.*)$")


def _parse_q_tree(text: str) -> _Node:
    root = _Node("root", None)
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.strip().startswith("=") or raw.lstrip().startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        m = _KV_RE.match(line)
        if m:
            node = _Node(m.group("key").strip(), m.group("value").strip())
        else:
            node = _Node(line.rstrip(":").strip(), None)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def parse_smi_q(text: str) -> ParsedCapture:
    """Parse ``nvidia-smi -q`` text (drivers 470 -> 590 layouts). Raises
    :class:`CaptureFormatError` when no ``GPU <bus id>`` section is found."""
    root = _parse_q_tree(_strip_comments(text))
    gpu_nodes = [c for c in root.children if c.value is None and c.key.startswith("GPU ")]
    if not gpu_nodes:
        raise CaptureFormatError("nvidia-smi -q: no 'GPU <bus id>' section found")
    ts = parse_smi_timestamp(root.get("Timestamp"))
    gpus = [_q_gpu(node, i, ts) for i, node in enumerate(gpu_nodes)]
    return ParsedCapture(kind="q", gpus=gpus, timestamp=ts, driver_version=root.get("Driver Version"),
                         cuda_version=root.get("CUDA Version"))


def _q_gpu(g: _Node, index: int, ts: float | None) -> GpuSnapshot:
    bus = g.get("PCI", "Bus Id") or g.key[4:].strip()
    uuid = g.get("GPU UUID") or f"row-{index}"
    fb = g.find("FB Memory Usage")
    s = GpuSnapshot(uuid=uuid, index=index, name=g.get("Product Name"),
                    pci_bus_id=normalize_pci_bus_id(bus), time=ts or 0.0)
    if fb is not None:
        s.memory_total_bytes = parse_bytes(fb.get("Total"))
        s.memory_used_bytes = parse_bytes(fb.get("Used"))
        s.memory_free_bytes = parse_bytes(fb.get("Free"))
        s.memory_reserved_bytes = parse_bytes(fb.get("Reserved"))
    s.utilization_ratio = parse_ratio_percent(g.get("Utilization", "GPU|Gpu"))
    s.memory_bandwidth_utilization_ratio = parse_ratio_percent(g.get("Utilization", "Memory"))
    s.temperature_celsius = parse_number(g.get("Temperature", "GPU Current Temp"))
    s.memory_temperature_celsius = parse_number(g.get("Temperature", "Memory Current Temp"))
    pr = g.find("GPU Power Readings", "Power Readings")
    if pr is not None:
        s.power_watts = _first_number(pr, "Power Draw", "Average Power Draw", "Instantaneous Power Draw")
        s.power_limit_watts = _first_number(pr, "Current Power Limit", "Enforced Power Limit",
                                            "Power Limit")
    s.fan_ratio = parse_ratio_percent(g.get("Fan Speed"))
    s.pstate = None if is_no_data(g.get("Performance State")) else g.get("Performance State")
    s.clocks_sm_mhz = parse_number(g.get("Clocks", "SM"))
    s.clocks_mem_mhz = parse_number(g.get("Clocks", "Memory"))
    vol = g.find("ECC Errors")
    vol = vol.find("Volatile") if vol is not None else None
    if vol is not None:
        s.ecc_corrected, s.ecc_uncorrected = _ecc_sums(vol)
    rr = g.find("Remapped Rows")
    if rr is not None and rr.children:
        s.remapped_rows_pending = parse_bool(rr.get("Pending"))
        s.remapped_rows_failure = parse_bool(rr.get("Remapping Failure Occurred"))
    if g.find("GPU Recovery Action") is not None:
        s.recovery_action = parse_recovery_action(g.get("GPU Recovery Action"))
    elif g.find("GPU Reset Status") is not None:
        s.recovery_action = recovery_from_reset_status(
            g.get("GPU Reset Status", "Reset Required"),
            g.get("GPU Reset Status", "Drain and Reset Recommended"))
    s.persistence_mode = parse_bool(g.get("Persistence Mode"))
    s.mig_enabled = parse_bool(g.get("MIG Mode", "Current"))
    for mig in g.all("MIG Device"):
        mem = mig.find("Shared FB Memory Usage", "FB Memory Usage")
        inst = MigInstance(gpu_instance_id=parse_int(mig.get("GPU Instance ID")),
                           compute_instance_id=parse_int(mig.get("Compute Instance ID")))
        if mem is not None:
            inst.memory_total_bytes = parse_bytes(mem.get("Total"))
            inst.memory_used_bytes = parse_bytes(mem.get("Used"))
            inst.memory_free_bytes = parse_bytes(mem.get("Free"))
            inst.memory_reserved_bytes = parse_bytes(mem.get("Reserved"))
        s.mig_instances.append(inst)
    procs = g.find("Processes")
    if procs is not None:
        s.processes = _q_processes(procs)
    return s


def _first_number(node: _Node, *keys: str) -> float | None:
    for k in keys:
        n = parse_number(node.get(k))
        if n is not None:
            return n
    return None


def _ecc_sums(vol: _Node) -> tuple[int | None, int | None]:
    """Volatile ECC of ``nvidia-smi -q``: "Single Bit/Double Bit > Total" (older layouts), else
    the "... Correctable" and "... Uncorrectable ..." leaves (535+ layout); see
    :func:`_ecc_counts`."""
    single, double = vol.find("Single Bit"), vol.find("Double Bit")
    bit_totals = None
    if single is not None or double is not None:
        bit_totals = tuple(None if n is None else n.get("Total") for n in (single, double))
    return _ecc_counts(bit_totals, ((leaf.key, leaf.value) for leaf in vol.children))


def _ecc_counts(bit_totals: tuple[str | None, str | None] | None,
                leaves: Iterable[tuple[str, str | None]]) -> tuple[int | None, int | None]:
    """``(corrected, uncorrected)`` volatile ECC error counts, from either layout of
    ``nvidia-smi -q`` and ``-q -x``. ``bit_totals``: the raw single-bit and double-bit totals
    of the older layouts (an absent one None), or None for the 535+ layout, whose ``leaves``
    are ``(name, raw value)``: a name with "uncorrectable" counts as uncorrected, another with
    "correctable" as corrected (``leaves`` is read only then). A kind with no number -> None."""
    corr: list[int] = []
    unc: list[int] = []
    if bit_totals is not None:
        for raw, acc in zip(bit_totals, (corr, unc)):
            v = parse_int(raw)
            if v is not None:
                acc.append(v)
    else:
        for key, raw in leaves:
            v = parse_int(raw)
            if v is None:
                continue
            k = key.lower()
            if "uncorrectable" in k:
                unc.append(v)
            elif "correctable" in k:
                corr.append(v)
    return (sum(corr) if corr else None, sum(unc) if unc else None)


def _q_processes(procs: _Node) -> list[GpuProcess]:
    out: list[GpuProcess] = []
    gi: int | None = None
    for c in procs.children:
        k = c.key.lower()
        if k == "gpu instance id":
            gi = parse_int(c.value)
        elif k == "process id":
            pid = parse_int(c.value)
            if pid is None:
                continue
            name = c.get("Name")
            out.append(GpuProcess(pid=pid, name=None if is_no_data(name) else name,
                                  used_memory_bytes=parse_bytes(c.get("Used GPU Memory")),
                                  gpu_instance_id=gi))
    return out


# --------------------------------------------------------------------------- nvidia-smi -q -x

def parse_smi_xml(text: str) -> ParsedCapture:
    """Parse ``nvidia-smi -q -x`` XML (DTD v10-v12). Raises :class:`CaptureFormatError` on
    malformed XML or when the root is not ``<nvidia_smi_log>``."""
    try:
        root = ET.fromstring(text.encode("utf-8") if isinstance(text, str) else text)
    except ET.ParseError as exc:
        raise CaptureFormatError(f"nvidia-smi -q -x: malformed XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise CaptureFormatError(f"nvidia-smi -q -x: root element is <{root.tag}>, "
                                 "expected <nvidia_smi_log>")
    ts = parse_smi_timestamp(_xt(root, "timestamp"))
    gpus = [_x_gpu(g, i, ts) for i, g in enumerate(root.findall("gpu"))]
    return ParsedCapture(kind="qx", gpus=gpus, timestamp=ts, driver_version=_xt(root, "driver_version"),
                         cuda_version=_xt(root, "cuda_version"))


def _xt(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _x_gpu(g: ET.Element, index: int, ts: float | None) -> GpuSnapshot:
    uuid = _xt(g, "uuid") or f"row-{index}"
    bus = _xt(g, "pci/pci_bus_id") or g.get("id")
    s = GpuSnapshot(uuid=uuid, index=index, name=_xt(g, "product_name"),
                    pci_bus_id=normalize_pci_bus_id(bus), time=ts or 0.0)
    s.memory_total_bytes = parse_bytes(_xt(g, "fb_memory_usage/total"))
    s.memory_used_bytes = parse_bytes(_xt(g, "fb_memory_usage/used"))
    s.memory_free_bytes = parse_bytes(_xt(g, "fb_memory_usage/free"))
    s.memory_reserved_bytes = parse_bytes(_xt(g, "fb_memory_usage/reserved"))
    s.utilization_ratio = parse_ratio_percent(_xt(g, "utilization/gpu_util"))
    s.memory_bandwidth_utilization_ratio = parse_ratio_percent(_xt(g, "utilization/memory_util"))
    s.temperature_celsius = parse_number(_xt(g, "temperature/gpu_temp"))
    s.memory_temperature_celsius = parse_number(_xt(g, "temperature/memory_temp"))
    power = g.find("gpu_power_readings")
    if power is None:
        power = g.find("power_readings")
    s.power_watts = _x_first(power, "power_draw", "average_power_draw", "instant_power_draw")
    s.power_limit_watts = _x_first(power, "current_power_limit", "enforced_power_limit", "power_limit")
    s.fan_ratio = parse_ratio_percent(_xt(g, "fan_speed"))
    ps = _xt(g, "performance_state")
    s.pstate = None if is_no_data(ps) else ps
    s.clocks_sm_mhz = parse_number(_xt(g, "clocks/sm_clock"))
    s.clocks_mem_mhz = parse_number(_xt(g, "clocks/mem_clock"))
    vol = g.find("ecc_errors/volatile")
    if vol is not None:
        bit_totals = None
        if vol.find("single_bit") is not None or vol.find("double_bit") is not None:
            # older DTDs: volatile/single_bit/total and volatile/double_bit/total
            bit_totals = (_xt(vol, "single_bit/total"), _xt(vol, "double_bit/total"))
        s.ecc_corrected, s.ecc_uncorrected = _ecc_counts(
            bit_totals, ((leaf.tag, leaf.text) for leaf in vol))
    rr = g.find("remapped_rows")
    if rr is not None and len(rr):
        s.remapped_rows_pending = parse_bool(_xt(rr, "remapped_row_pending"))
        s.remapped_rows_failure = parse_bool(_xt(rr, "remapped_row_failure"))
    if g.find("gpu_recovery_action") is not None:
        s.recovery_action = parse_recovery_action(_xt(g, "gpu_recovery_action"))
    elif g.find("gpu_reset_status") is not None:
        s.recovery_action = recovery_from_reset_status(
            _xt(g, "gpu_reset_status/reset_required"),
            _xt(g, "gpu_reset_status/drain_and_reset_recommended"))
    s.persistence_mode = parse_bool(_xt(g, "persistence_mode"))
    s.mig_enabled = parse_bool(_xt(g, "mig_mode/current_mig"))
    for mig in g.findall("mig_devices/mig_device"):
        s.mig_instances.append(MigInstance(
            gpu_instance_id=parse_int(_xt(mig, "gpu_instance_id")),
            compute_instance_id=parse_int(_xt(mig, "compute_instance_id")),
            memory_total_bytes=parse_bytes(_xt(mig, "fb_memory_usage/total")),
            memory_used_bytes=parse_bytes(_xt(mig, "fb_memory_usage/used")),
            memory_free_bytes=parse_bytes(_xt(mig, "fb_memory_usage/free")),
            memory_reserved_bytes=parse_bytes(_xt(mig, "fb_memory_usage/reserved"))))
    for p in g.findall("processes/process_info"):
        pid = parse_int(_xt(p, "pid"))
        if pid is None:
            continue
        name = _xt(p, "process_name")
        s.processes.append(GpuProcess(pid=pid, name=None if is_no_data(name) else name,
                                      used_memory_bytes=parse_bytes(_xt(p, "used_memory")),
                                      gpu_instance_id=parse_int(_xt(p, "gpu_instance_id"))))
    return s


def _x_first(el: ET.Element | None, *paths: str) -> float | None:
    for p in paths:
        n = parse_number(_xt(el, p))
        if n is not None:
            return n
    return None


# --------------------------------------------------------------------------- --query-gpu CSV

def _mib(v: str | None) -> int | None:
    return parse_bytes(v, "MiB")


def _w(v: str | None) -> float | None:
    n = parse_number(v)
    return None if n is None or n < 0 else n


def _pstate(v: str | None) -> str | None:
    return None if is_no_data(v) else v.strip()  # type: ignore[union-attr]


def _text(v: str | None) -> str | None:
    return None if is_no_data(v) else v.strip()  # type: ignore[union-attr]


#: query field -> (snapshot attribute, converter), in priority order: when two fields fill one
#: attribute (aliases nvidia-smi accepts, enforced vs requested power limit) the first with data wins.
QUERY_GPU_FIELDS: dict[str, tuple[str, object]] = {
    "uuid": ("uuid", _text),
    "gpu_uuid": ("uuid", _text),
    "index": ("index", parse_int),
    "name": ("name", _text),
    "gpu_name": ("name", _text),
    "pci.bus_id": ("pci_bus_id", lambda v: normalize_pci_bus_id(_text(v))),
    "gpu_bus_id": ("pci_bus_id", lambda v: normalize_pci_bus_id(_text(v))),
    "memory.total": ("memory_total_bytes", _mib),
    "memory.used": ("memory_used_bytes", _mib),
    "memory.free": ("memory_free_bytes", _mib),
    "memory.reserved": ("memory_reserved_bytes", _mib),
    "utilization.gpu": ("utilization_ratio", parse_ratio_percent),
    "utilization.memory": ("memory_bandwidth_utilization_ratio", parse_ratio_percent),
    "temperature.gpu": ("temperature_celsius", parse_number),
    "temperature.memory": ("memory_temperature_celsius", parse_number),
    "power.draw": ("power_watts", _w),
    "enforced.power.limit": ("power_limit_watts", _w),
    "power.limit": ("power_limit_watts", _w),
    "fan.speed": ("fan_ratio", parse_ratio_percent),
    "pstate": ("pstate", _pstate),
    "clocks.current.sm": ("clocks_sm_mhz", parse_number),
    "clocks.sm": ("clocks_sm_mhz", parse_number),
    "clocks.current.memory": ("clocks_mem_mhz", parse_number),
    "clocks.mem": ("clocks_mem_mhz", parse_number),
    "ecc.errors.corrected.volatile.total": ("ecc_corrected", parse_int),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected", parse_int),
    "remapped_rows.pending": ("remapped_rows_pending", parse_bool),
    "remapped_rows.failure": ("remapped_rows_failure", parse_bool),
    "gpu_recovery_action": ("recovery_action", parse_recovery_action),
    "persistence_mode": ("persistence_mode", parse_bool),
    "mig.mode.current": ("mig_enabled", parse_bool),
}

_HEADER_UNIT_RE = re.compile(r"\s*\[[^\]]*\]\s*$")


def _field_name(header_cell: str) -> str:
    """``"memory.total [MiB]"`` -> ``"memory.total"``; lower-cased, stripped."""
    return _HEADER_UNIT_RE.sub("", header_cell).strip().lower()


def _csv_rows(text: str) -> list[list[str]]:
    body = _strip_comments(text)
    return [r for r in csv.reader(io.StringIO(body), skipinitialspace=True) if any(c.strip() for c in r)]


def _csv_table(text: str, fields: list[str] | str | None,
               what: str) -> tuple[list[str], list[list[str]]]:
    """The field names and data rows of an nvidia-smi ``--query-*`` CSV. ``fields`` is the
    query list (a list or the comma-separated ``--query-*=`` string), needed for ``noheader``
    output; a header row that matches it is skipped; without it the first row is the header.
    ``what`` names the query in errors. Raises :class:`CaptureFormatError` for an empty
    capture without ``fields``."""
    rows = _csv_rows(text)
    if isinstance(fields, str):
        fields = fields.split(",")
    if fields is not None:
        names = [_field_name(f) for f in fields]
        if rows and [_field_name(c) for c in rows[0]] == names:
            rows = rows[1:]
    else:
        if not rows:
            raise CaptureFormatError(f"{what} CSV: empty (no header row)")
        names = [_field_name(c) for c in rows[0]]
        rows = rows[1:]
    return names, rows


def _csv_checked_rows(names: list[str], rows: list[list[str]],
                      what: str) -> Iterator[tuple[int, list[str]]]:
    """``(row number from 0, cells)`` for each row; raises :class:`CaptureFormatError` on
    reaching a row whose length differs from ``names``'."""
    for n, row in enumerate(rows):
        if len(row) != len(names):
            raise CaptureFormatError(f"{what} CSV row {n + 1}: {len(row)} values for "
                                     f"{len(names)} fields")
        yield n, row


def parse_query_gpu_csv(text: str, fields: list[str] | str | None = None) -> ParsedCapture:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]``.

    ``fields``: the query list, needed for ``noheader`` output (a list or the comma-separated
    string passed to ``--query-gpu``); without it the first row is the header. Header cells may
    carry units (``"memory.total [MiB]"``), values too (``"81559 MiB"``, ``"52 %"``).
    Unknown fields are ignored. Raises :class:`CaptureFormatError` when a row's length differs
    from the header's.

    F10: ``GeForce GTX 770, [Not Supported], [Not Supported], 52, [Not Supported],
    [Not Supported], 52 %, P0`` -> temperature 52, fan 0.52, pstate P0, the rest None.
    """
    names, rows = _csv_table(text, fields, "--query-gpu")
    gpus: list[GpuSnapshot] = []
    ts: float | None = None
    for n, row in _csv_checked_rows(names, rows, "--query-gpu"):
        values = dict(zip(names, row))
        s = GpuSnapshot(uuid=f"row-{n}", index=n)
        seen: set[str] = set()
        for name, (attr, conv) in QUERY_GPU_FIELDS.items():   # in priority order
            if name not in values or attr in seen:
                continue
            val = conv(values[name])  # type: ignore[operator]
            if val is None:
                continue
            setattr(s, attr, val)
            seen.add(attr)
        if "timestamp" in values:
            t = parse_smi_timestamp(values["timestamp"])
            ts = t if t is not None else ts
            s.time = t or 0.0
        gpus.append(s)
    return ParsedCapture(kind="query_gpu", gpus=gpus, timestamp=ts,
                         driver_version=_text(rows[0][names.index("driver_version")])
                         if rows and "driver_version" in names else None)


def parse_compute_apps_csv(text: str, fields: list[str] | str | None = None) -> ParsedCapture:
    """Parse ``nvidia-smi --query-compute-apps=... --format=csv`` -> processes by GPU uuid
    (``ParsedCapture.processes``); a header-only capture means no processes. Needs a
    ``gpu_uuid`` column to attribute processes (else they go under ``"?"``)."""
    names, rows = _csv_table(text, fields, "--query-compute-apps")
    out: dict[str, list[GpuProcess]] = {}
    ts = None
    for _, row in _csv_checked_rows(names, rows, "--query-compute-apps"):
        v = dict(zip(names, row))
        pid = parse_int(v.get("pid"))
        if pid is None:
            continue
        uuid = _text(v.get("gpu_uuid")) or "?"
        name = _text(v.get("process_name") or v.get("name"))
        mem = v.get("used_gpu_memory", v.get("used_memory"))
        out.setdefault(uuid, []).append(GpuProcess(pid=pid, name=name, used_memory_bytes=_mib(mem)))
        if "timestamp" in v:
            ts = parse_smi_timestamp(v["timestamp"]) or ts
    return ParsedCapture(kind="compute_apps", processes=out, timestamp=ts)


# --------------------------------------------------------------------------- detection

def detect_capture_format(text: str) -> str:
    """Guess a capture's format: ``"qx"``, ``"q"``, ``"dcgm"``, ``"compute_apps"``,
    ``"query_gpu"`` or ``"trace"`` (JSON lines). Raises :class:`CaptureFormatError` otherwise."""
    body = _strip_comments(text).lstrip()
    head = body[:4096]
    if head.startswith("<?xml") or "<nvidia_smi_log" in head:
        return "qx"
    if "NVSMI LOG" in head or re.search(r"^GPU [0-9A-Fa-f]{4,8}:", head, re.M):
        return "q"
    if head.startswith("{"):
        return "trace"
    if "DCGM_FI_" in text[:65536]:
        return "dcgm"
    first = head.splitlines()[0].lower() if head else ""
    if "pid" in first and ("used_gpu_memory" in first or "used_memory" in first):
        return "compute_apps"
    if "," in first or first.strip():
        if any(k in first for k in ("memory.", "uuid", "name", "utilization", "temperature", "index")):
            return "query_gpu"
    raise CaptureFormatError("capture format not recognised (expected nvidia-smi -q, -q -x, "
                             "--query-gpu CSV, --query-compute-apps CSV, dcgm-exporter text or "
                             "an inferctl JSON-lines trace)")


def parse_capture(text: str, kind: str | None = None) -> ParsedCapture:
    """Parse any supported capture (format detected when ``kind`` is None). ``"trace"`` is not a
    single capture: use :mod:`controller.gpu.replay` for JSON-lines traces."""
    kind = kind or detect_capture_format(text)
    if kind == "q":
        return parse_smi_q(text)
    if kind == "qx":
        return parse_smi_xml(_strip_comments_xml(text))
    if kind == "query_gpu":
        return parse_query_gpu_csv(text)
    if kind == "compute_apps":
        return parse_compute_apps_csv(text)
    if kind == "dcgm":
        from inferctl.controller.gpu.dcgm import parse_dcgm_text

        gpus, _ = parse_dcgm_text(text)
        return ParsedCapture(kind="dcgm", gpus=list(gpus.values()))
    raise CaptureFormatError(f"capture kind {kind!r} is not a single capture")


def _strip_comments_xml(text: str) -> str:
    return text.lstrip()
