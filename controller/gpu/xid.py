"""Xid errors: NVIDIA's catalogue (code -> recommended action), kernel-log parsing, de-duplication.

Sources:
- NVIDIA Xid catalogue (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html),
  read from ``xid_catalog.csv`` / ``xid_resolution_buckets.csv`` when a path is given; columns
  "Code", "Mnemonic", "Description", "Resolution Bucket (Immediate Action)", "Resolution Bucket
  (Investigatory Action)".
- A built-in table of the well-known codes so the product works without the file
  (:data:`inferctl.contract.xid.BUILTIN_ACTIONS`: 79 -> reboot the node; 48, 64, 95, 119, 120 ->
  reset the GPU; 13, 31, 94 -> restart the application; 43, 63, 92 -> no action).

Kernel lines understood:
``NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.`` and the newer driver's
``NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off
the bus and is not responding to commands.`` (reported as Xid 79, ``lost=True``).
"""

from __future__ import annotations

import csv
import io
import logging
import re
from dataclasses import dataclass
from pathlib import Path

# XidAction, the tables and XID_FALLEN_OFF_BUS are the contract's (one catalogue vocabulary for
# the controller, its policies and the alert rules); re-exported here for this module's users.
from inferctl.contract.xid import (BUCKET_ACTIONS, BUILTIN_ACTIONS, BUILTIN_MNEMONICS, XID_FALLEN_OFF_BUS,
                                   XidAction)
from inferctl.controller.types import XidEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class XidInfo:
    """What is known of one Xid code."""

    code: int
    action: XidAction
    mnemonic: str | None = None
    description: str | None = None
    immediate_bucket: str | None = None
    investigatory_bucket: str | None = None
    resolution: str | None = None        # the bucket's text from the resolution sheet
    source: str = "builtin"              # "catalog", "builtin" or "unknown"


class XidCatalog:
    """Xid code -> :class:`XidInfo`. Build with :meth:`builtin` or :meth:`load`."""

    def __init__(self, entries: dict[int, XidInfo], buckets: dict[str, str] | None = None,
                 origin: str = "builtin") -> None:
        self._entries = dict(entries)
        self.buckets = dict(buckets or {})
        self.origin = origin

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def builtin(cls) -> "XidCatalog":
        """The small built-in table (12 well-known codes)."""
        return cls({code: XidInfo(code=code, action=action, description=BUILTIN_MNEMONICS.get(code))
                    for code, action in BUILTIN_ACTIONS.items()}, origin="builtin")

    @classmethod
    def load(cls, catalog_csv: str | Path, buckets_csv: str | Path | None = None) -> "XidCatalog":
        """Read NVIDIA's catalogue CSV (and optionally the resolution-bucket CSV).

        Lines starting with ``#`` before the header are provenance comments and skipped.
        Raises ``FileNotFoundError`` for a missing file and ``ValueError`` when the header lacks
        the "Code" or immediate-action column.
        """
        rows = _read_csv_rows(Path(catalog_csv))
        header = [_squash(h) for h in rows[0]]
        try:
            i_code = header.index("code")
            i_imm = next(i for i, h in enumerate(header) if "immediate" in h)
        except (ValueError, StopIteration):
            raise ValueError(f"{catalog_csv}: header {rows[0]!r} lacks 'Code' or the "
                             "'Resolution Bucket (Immediate Action)' column") from None
        i_mn = _find(header, "mnemonic")
        i_desc = _find(header, "description")
        i_inv = next((i for i, h in enumerate(header) if "investigatory" in h), None)
        buckets: dict[str, str] = {}
        if buckets_csv is not None:
            for row in _read_csv_rows(Path(buckets_csv))[1:]:
                if len(row) >= 2 and row[0].strip():
                    buckets[row[0].strip()] = row[1].strip()
        entries: dict[int, XidInfo] = {}
        for row in rows[1:]:
            if len(row) <= i_imm:
                continue
            try:
                code = int(row[i_code].strip())
            except ValueError:
                continue
            imm = row[i_imm].strip() or None
            action = BUCKET_ACTIONS.get(imm or "")
            if action is None:
                action = BUILTIN_ACTIONS.get(code, XidAction.UNKNOWN)
            entries[code] = XidInfo(
                code=code, action=action,
                mnemonic=_cell(row, i_mn), description=_cell(row, i_desc),
                immediate_bucket=imm, investigatory_bucket=_cell(row, i_inv),
                resolution=buckets.get(imm or ""), source="catalog")
        for code, action in BUILTIN_ACTIONS.items():   # a catalogue lacking a well-known code
            entries.setdefault(code, XidInfo(code=code, action=action,
                                             description=BUILTIN_MNEMONICS.get(code)))
        return cls(entries, buckets, origin=str(catalog_csv))

    @classmethod
    def from_dir(cls, xid_dir: str | Path | None) -> "XidCatalog":
        """Load ``xid_catalog.csv`` (+ ``xid_resolution_buckets.csv``) from ``xid_dir``; fall back
        to :meth:`builtin` (logged once, at WARNING) when the directory or file is missing or
        unreadable. ``None`` means the built-in table."""
        if xid_dir is None:
            return cls.builtin()
        d = Path(xid_dir)
        cat, buckets = d / "xid_catalog.csv", d / "xid_resolution_buckets.csv"
        try:
            return cls.load(cat, buckets if buckets.exists() else None)
        except (OSError, ValueError) as exc:
            log.warning("Xid catalogue not loaded from %s (%s); using the built-in table of %d codes",
                        d, exc, len(BUILTIN_ACTIONS))
            return cls.builtin()

    def lookup(self, code: int | None) -> XidInfo:
        """The entry for ``code``; an UNKNOWN entry for codes not in the table (or ``None``)."""
        if code is None:
            return XidInfo(code=-1, action=XidAction.UNKNOWN, source="unknown")
        info = self._entries.get(int(code))
        if info is None:
            return XidInfo(code=int(code), action=XidAction.UNKNOWN, source="unknown")
        return info

    def action(self, code: int | None) -> XidAction:
        """The action for ``code`` (``XidAction.UNKNOWN`` for a code the table lacks)."""
        return self.lookup(code).action


def _read_csv_rows(path: Path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8-sig")
    lines = text.splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].lstrip().startswith("#"):
        start += 1
    rows = [r for r in csv.reader(io.StringIO("".join(lines[start:]))) if any(c.strip() for c in r)]
    if not rows:
        raise ValueError(f"{path}: no CSV rows")
    return rows


def _squash(header: str) -> str:
    return " ".join(header.replace("\n", " ").split()).lower()


def _find(header: list[str], name: str) -> int | None:
    return header.index(name) if name in header else None


def _cell(row: list[str], i: int | None) -> str | None:
    if i is None or i >= len(row):
        return None
    v = " ".join(row[i].split())
    return v or None


# --------------------------------------------------------------------------- PCI addresses

_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"(?:\.(?P<fn>[0-7]))?$")


def normalize_pci_bus_id(value: str | None) -> str | None:
    """``"00000000:44:00.0"``, ``"0000:44:00"``, ``"PCI:0000:44:00"``, ``"44:00.0"`` ->
    ``"0000:44:00.0"`` (4-digit domain, lower-case hex, function 0 when absent). ``None`` for
    anything else."""
    if value is None:
        return None
    v = value.strip()
    if v.upper().startswith("PCI:"):
        v = v[4:]
    m = _PCI_RE.match(v)
    if not m:
        return None
    domain = int(m.group("domain") or "0", 16)
    if domain > 0xFFFF:
        return None
    return (f"{domain:04x}:{int(m.group('bus'), 16):02x}:{int(m.group('dev'), 16):02x}."
            f"{int(m.group('fn') or '0')}")


# --------------------------------------------------------------------------- kernel log lines

_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+),\s*(?P<msg>.*)$")
_FELL_OFF_RE = re.compile(
    r"NVRM: The NVIDIA GPU (?P<pci>[0-9a-fA-F:.]+)\s*(?:\(PCI ID: [0-9a-fA-F:]+\))?\s*"
    r"installed in this system has fallen off the bus(?P<rest>.*)$")
_GPU_AT_RE = re.compile(r"NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F:.]+):\s*(?:(?P<uuid>GPU-[0-9a-fA-F-]+):?)?"
                        r"\s*GPU has fallen off the bus")


def parse_kernel_line(line: str, time: float = 0.0) -> XidEvent | None:
    """One kernel log line -> an :class:`XidEvent` (``source="kernel"``), or ``None`` when the line
    is not an Xid report. The PCI address is normalized (:func:`normalize_pci_bus_id`);
    "fallen off the bus" lines give ``xid=79`` and ``lost=True``."""
    m = _XID_RE.search(line)
    if m:
        xid = int(m.group("xid"))
        msg = m.group("msg").strip()
        lost = xid == XID_FALLEN_OFF_BUS or "fallen off the bus" in msg
        return XidEvent(xid=xid, pci_bus_id=normalize_pci_bus_id(m.group("pci")), message=msg,
                        time=time, source="kernel", lost=lost)
    m = _FELL_OFF_RE.search(line)
    if m:
        msg = line[m.start():].strip()
        return XidEvent(xid=XID_FALLEN_OFF_BUS, pci_bus_id=normalize_pci_bus_id(m.group("pci")),
                        message=msg, time=time, source="kernel", lost=True)
    m = _GPU_AT_RE.search(line)
    if m:
        return XidEvent(xid=XID_FALLEN_OFF_BUS, pci_bus_id=normalize_pci_bus_id(m.group("pci")),
                        message=line[m.start():].strip(), time=time, source="kernel",
                        gpu_uuid=m.group("uuid"), lost=True)
    return None


def parse_kernel_log(text: str, time: float = 0.0) -> list[XidEvent]:
    """Every Xid report in a block of kernel log text (``dmesg``/``journalctl -k``), in order."""
    out = []
    for line in text.splitlines():
        ev = parse_kernel_line(line, time)
        if ev is not None:
            out.append(ev)
    return out


class XidDeduper:
    """Collapses repeated reports of one Xid on one GPU within ``window_seconds`` (default 300).

    Key: (normalized PCI address, or GPU UUID when the address is unknown; Xid code). An event is
    admitted when no event with the same key was admitted in the last ``window_seconds``; so the
    old-style "Xid 79" line and the newer "has fallen off the bus" line for one address within
    5 minutes make one event (docs/field-cases.md F09), and a condition still reported after the window is reported
    again. State is per instance (no globals).
    """

    def __init__(self, window_seconds: float = 300.0) -> None:
        if not window_seconds >= 0:
            raise ValueError(f"window_seconds must be >= 0, got {window_seconds!r}")
        self.window_seconds = float(window_seconds)
        self._last: dict[tuple[str, int | None], float] = {}

    @staticmethod
    def key(event: XidEvent) -> tuple[str, int | None]:
        where = normalize_pci_bus_id(event.pci_bus_id) or (event.gpu_uuid or "?")
        return (where, event.xid)

    def admit(self, event: XidEvent) -> bool:
        """True if ``event`` is new (and remember it); False if it repeats one within the window."""
        k = self.key(event)
        last = self._last.get(k)
        if last is not None and 0 <= event.time - last < self.window_seconds:
            return False
        self._last[k] = event.time
        self._prune(event.time)
        return True

    def filter(self, events: list[XidEvent]) -> list[XidEvent]:
        """The admitted events of ``events``, in order."""
        return [e for e in events if self.admit(e)]

    def _prune(self, now: float) -> None:
        horizon = now - 2 * self.window_seconds
        for k in [k for k, t in self._last.items() if t < horizon]:
            del self._last[k]
