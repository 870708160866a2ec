"""Xid catalogue (NVIDIA's CSV and the built-in table), kernel-log parsing, de-duplication (F09)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferctl.controller.gpu.xid import (
    XidAction, XidCatalog, XidDeduper, normalize_pci_bus_id, parse_kernel_line, parse_kernel_log)
from inferctl.controller.types import XidEvent

OLD_LINE = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus."
NEW_LINE = ("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen "
            "off the bus and is not responding to commands.")


def test_catalogue_from_fixtures(fixtures_dir: Path) -> None:
    cat = XidCatalog.from_dir(fixtures_dir / "xid")
    assert len(cat) == 172 and cat.origin.endswith("xid_catalog.csv")
    fell = cat.lookup(79)
    assert fell.action is XidAction.REBOOT_NODE and fell.immediate_bucket == "RESTART_BM"
    assert fell.mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" and fell.source == "catalog"
    assert cat.action(8) is XidAction.RESTART_ENGINE          # RESTART_APP, not in the built-in table
    assert cat.action(64) is XidAction.RESET_GPU
    assert cat.lookup(64).resolution.startswith("Refer to https://docs.nvidia.com/deploy/gpu-debug-guidelines")
    assert cat.action(48) is XidAction.RESET_GPU              # WORKFLOW_XID_48 ("Solo: RESET_GPU")
    assert cat.lookup(48).immediate_bucket == "WORKFLOW_XID_48"
    assert cat.action(1) is XidAction.UNKNOWN                 # CONTACT_SUPPORT: a person decides
    assert cat.action(74) is XidAction.UNKNOWN                # WORKFLOW_NVLINK_ERR
    assert cat.action(123456) is XidAction.UNKNOWN and cat.lookup(123456).source == "unknown"


@pytest.mark.parametrize("code,action", [
    (79, XidAction.REBOOT_NODE), (48, XidAction.RESET_GPU), (64, XidAction.RESET_GPU),
    (95, XidAction.RESET_GPU), (119, XidAction.RESET_GPU), (120, XidAction.RESET_GPU),
    (13, XidAction.RESTART_ENGINE), (31, XidAction.RESTART_ENGINE), (94, XidAction.RESTART_ENGINE),
    (43, XidAction.IGNORE), (63, XidAction.IGNORE), (92, XidAction.IGNORE), (8, XidAction.UNKNOWN)])
def test_builtin_table(code: int, action: XidAction) -> None:
    assert XidCatalog.builtin().action(code) is action


def test_builtin_and_file_agree_on_well_known_codes(fixtures_dir: Path) -> None:
    file_cat, builtin = XidCatalog.from_dir(fixtures_dir / "xid"), XidCatalog.builtin()
    for code in (13, 31, 43, 48, 63, 64, 79, 92, 94, 95, 119, 120):
        assert file_cat.action(code) is builtin.action(code), code


def test_missing_catalogue_falls_back_to_builtin(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cat = XidCatalog.from_dir(tmp_path / "nope")
    assert cat.origin == "builtin" and len(cat) == 12 and cat.action(79) is XidAction.REBOOT_NODE
    assert any("built-in table" in r.getMessage() for r in caplog.records)
    bad = tmp_path / "xid_catalog.csv"
    bad.write_text("A,B\n1,2\n")
    with pytest.raises(ValueError, match="lacks 'Code'"):
        XidCatalog.load(bad)


def test_kernel_lines_old_and_new_driver() -> None:
    old = parse_kernel_line("[12345.678] " + OLD_LINE, time=10.0)
    assert (old.xid, old.pci_bus_id, old.lost, old.source, old.time) == (79, "0000:44:00.0", True, "kernel", 10.0)
    assert old.message == "GPU has fallen off the bus."
    new = parse_kernel_line("kernel: " + NEW_LINE, time=11.0)
    assert (new.xid, new.pci_bus_id, new.lost) == (79, "0000:b3:00.0", True)
    x13 = parse_kernel_line("NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, Graphics Exception on GPC 0")
    assert (x13.xid, x13.pci_bus_id, x13.lost) == (13, "0000:3b:00.0", False)
    assert parse_kernel_line("usb 1-1: new high-speed USB device") is None
    log = "\n".join(["boot", OLD_LINE, "noise", NEW_LINE])
    assert [e.pci_bus_id for e in parse_kernel_log(log)] == ["0000:44:00.0", "0000:b3:00.0"]


@pytest.mark.parametrize("raw,norm", [
    ("0000:44:00", "0000:44:00.0"), ("0000:44:00.0", "0000:44:00.0"), ("00000000:44:00.0", "0000:44:00.0"),
    ("PCI:0000:B3:00", "0000:b3:00.0"), ("44:00.0", "0000:44:00.0"), ("0000:44:00.1", "0000:44:00.1"),
    ("nonsense", None), (None, None)])
def test_pci_normalization(raw: str | None, norm: str | None) -> None:
    assert normalize_pci_bus_id(raw) == norm


def test_f09_both_lines_for_one_address_within_five_minutes_make_one_event() -> None:
    d = XidDeduper(window_seconds=300)
    a = parse_kernel_line("NVRM: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus.", time=1000.0)
    b = parse_kernel_line(NEW_LINE, time=1120.0)            # same GPU, 2 minutes later, newer wording
    other = parse_kernel_line(OLD_LINE, time=1130.0)        # a different GPU
    assert [d.admit(e) for e in (a, b, other)] == [True, False, True]
    later = XidEvent(xid=79, pci_bus_id="0000:B3:00", message="again", time=1000.0 + 301)
    assert d.admit(later) is True                           # outside the window: reported again
    assert d.filter([XidEvent(xid=13, pci_bus_id="0000:b3:00.0", message="", time=1500.0)]) != []


def test_deduper_rejects_negative_window() -> None:
    with pytest.raises(ValueError, match="window_seconds"):
        XidDeduper(window_seconds=-1)
