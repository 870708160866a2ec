"""Parser of ``nvidia-smi -q`` text captures (driver 470 -> 590 layouts) -> GpuSnapshots.

Snapshots are keyed by ``GPU UUID``; a GPU without one gets ``row-<n>`` (its position). GPU
``index`` is the order of appearance. PCI bus ids are normalized to ``dddd:bb:dd.f`` (see
:func:`controller.gpu.xid.normalize_pci_bus_id`). MIG: per-instance memory ("MIG Device" /
"Shared FB Memory Usage") goes to ``GpuSnapshot.mig_instances``; the parent keeps the whole
GPU's numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from inferctl.controller.gpu.capture import (CaptureFormatError, ParsedCapture, ecc_counts, is_no_data,
                                             parse_bool, parse_bytes, parse_int, parse_number,
                                             parse_ratio_percent, parse_recovery_action,
                                             parse_smi_timestamp, recovery_from_reset_status,
                                             strip_comments)
from inferctl.controller.gpu.xid import normalize_pci_bus_id
from inferctl.controller.types import GpuProcess, GpuSnapshot, MigInstance


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
    root = _parse_q_tree(strip_comments(text))
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
    ecc = g.find("ECC Errors")
    vol = ecc.find("Volatile") if ecc is not None else None
    if vol is not None:
        s.ecc_corrected, s.ecc_uncorrected = _ecc_sums(vol)
    agg = ecc.find("Aggregate") if ecc is not None else None
    if agg is not None:      # lifetime (InfoROM) counts
        s.ecc_corrected_aggregate, s.ecc_uncorrected_aggregate = _ecc_sums(agg)
    rp = g.find("Retired Pages")
    if rp is not None:
        # "Pending Page Blacklist" (older drivers) / "Pending Retirement": Yes/No, N/A = no data
        s.retired_pages_pending = parse_bool(rp.get("Pending Retirement") or rp.get("Pending Page Blacklist"))
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
    :func:`~controller.gpu.capture.ecc_counts`."""
    single, double = vol.find("Single Bit"), vol.find("Double Bit")
    bit_totals = None
    if single is not None or double is not None:
        bit_totals = tuple(None if n is None else n.get("Total") for n in (single, double))
    return ecc_counts(bit_totals, ((leaf.key, leaf.value) for leaf in vol.children))


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
