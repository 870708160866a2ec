"""Parsers of nvidia-smi ``--query-gpu=... --format=csv`` and ``--query-compute-apps=...
--format=csv`` captures (with or without header, with or without units) -> GpuSnapshots and
processes.

A capture without a UUID column gets ``row-<n>`` keys (its position); PCI bus ids are
normalized as in :mod:`controller.gpu.smi_text`.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Iterator

from inferctl.controller.gpu.capture import (CaptureFormatError, ParsedCapture, is_no_data, parse_bool,
                                             parse_bytes, parse_int, parse_number, parse_ratio_percent,
                                             parse_recovery_action, parse_smi_timestamp, strip_comments)
from inferctl.controller.gpu.xid import normalize_pci_bus_id
from inferctl.controller.types import GpuProcess, GpuSnapshot


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
    body = strip_comments(text)
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

    docs/field-cases.md F10: ``GeForce GTX 770, [Not Supported], [Not Supported], 52, [Not Supported],
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
