"""Parser of ``nvidia-smi -q -x`` XML captures (DTD v10-v12) -> GpuSnapshots.

Keys, indexes, PCI bus ids and MIG instances as in :mod:`controller.gpu.smi_text`
(``<mig_device>`` entries go to ``GpuSnapshot.mig_instances``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from inferctl.controller.gpu.capture import (CaptureFormatError, ParsedCapture, ecc_counts, is_no_data,
                                             parse_bool, parse_bytes, parse_int, parse_number,
                                             parse_ratio_percent, parse_recovery_action,
                                             parse_smi_timestamp, recovery_from_reset_status)
from inferctl.controller.gpu.xid import normalize_pci_bus_id
from inferctl.controller.types import GpuProcess, GpuSnapshot, MigInstance


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
    for section, fields in (("volatile", ("ecc_corrected", "ecc_uncorrected")),
                            ("aggregate", ("ecc_corrected_aggregate", "ecc_uncorrected_aggregate"))):
        node = g.find(f"ecc_errors/{section}")
        if node is None:
            continue
        bit_totals = None
        if node.find("single_bit") is not None or node.find("double_bit") is not None:
            # older DTDs: <section>/single_bit/total and <section>/double_bit/total
            bit_totals = (_xt(node, "single_bit/total"), _xt(node, "double_bit/total"))
        corrected, uncorrected = ecc_counts(bit_totals, ((leaf.tag, leaf.text) for leaf in node))
        setattr(s, fields[0], corrected)
        setattr(s, fields[1], uncorrected)
    rp = g.find("retired_pages")
    if rp is not None:
        # "pending_retirement" (newer DTDs) or "pending_blacklist" (older): Yes/No, N/A = no data
        s.retired_pages_pending = parse_bool(_xt(rp, "pending_retirement") or _xt(rp, "pending_blacklist"))
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
