"""Recorded nvidia-smi captures -> GpuSnapshots: detect a capture's format and parse it.

Formats: ``nvidia-smi -q`` (text, :mod:`.smi_text`), ``nvidia-smi -q -x`` (XML, :mod:`.smi_xml`),
``--query-gpu=... --format=csv`` (with or without header, with or without units) and
``--query-compute-apps=... --format=csv`` (:mod:`.smi_csv`), dcgm-exporter text
(:mod:`.dcgm`); the shared value readers are in :mod:`.capture`. Memory is returned in bytes
(MiB x 1048576), ratios in 0..1, power in W, clocks in MHz.

"No data" strings (``N/A``, ``[N/A]``, ``[Not Supported]``, ``Requested functionality has been
deprecated``, ``[Unknown Error]``, ``ERR!``, ``[GPU requires reset]``, ...) become ``None``,
never 0. Identifiers: snapshots are keyed by ``GPU UUID``; a capture without a UUID column gets
``row-<n>`` (its position). GPU ``index`` is the order of appearance (nvidia-smi's own order).
PCI bus ids are normalized to ``dddd:bb:dd.f`` (see :func:`controller.gpu.xid.normalize_pci_bus_id`).

MIG: per-instance memory ("MIG Device" / "Shared FB Memory Usage" in ``-q``, ``<mig_device>`` in
``-q -x``) goes to ``GpuSnapshot.mig_instances``; the parent keeps the whole GPU's numbers.
"""

from __future__ import annotations

import re

from inferctl.controller.gpu.capture import CaptureFormatError, ParsedCapture, strip_comments
from inferctl.controller.gpu.dcgm import parse_dcgm_text
from inferctl.controller.gpu.smi_csv import QUERY_GPU_FIELDS, parse_compute_apps_csv, parse_query_gpu_csv
from inferctl.controller.gpu.smi_text import parse_smi_q
from inferctl.controller.gpu.smi_xml import parse_smi_xml

#: The format parsers are re-exported: ``parsers`` is the one entry point for any capture.
__all__ = [
    "CaptureFormatError", "ParsedCapture", "QUERY_GPU_FIELDS", "detect_capture_format", "parse_capture",
    "parse_compute_apps_csv", "parse_dcgm_text", "parse_query_gpu_csv", "parse_smi_q", "parse_smi_xml",
]


def detect_capture_format(text: str) -> str:
    """Guess a capture's format: ``"qx"``, ``"q"``, ``"dcgm"``, ``"compute_apps"``,
    ``"query_gpu"`` or ``"trace"`` (JSON lines). Raises :class:`CaptureFormatError` otherwise."""
    body = strip_comments(text).lstrip()
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
        gpus, _ = parse_dcgm_text(text)
        return ParsedCapture(kind="dcgm", gpus=list(gpus.values()))
    raise CaptureFormatError(f"capture kind {kind!r} is not a single capture")


def _strip_comments_xml(text: str) -> str:
    return text.lstrip()
