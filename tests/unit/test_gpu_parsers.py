"""Every real capture in shared/fixtures/gpu parses to the numbers printed in the file (F10, F11)."""

from __future__ import annotations

import calendar
from pathlib import Path

import pytest

from inferctl.controller.gpu.base import memory_accounting_gap_bytes, memory_consistent, used_ratio
from inferctl.controller.gpu.capture import CaptureFormatError, parse_bytes, parse_recovery_action
from inferctl.controller.gpu.parsers import detect_capture_format, parse_capture
from inferctl.controller.gpu.smi_csv import parse_compute_apps_csv, parse_query_gpu_csv
from inferctl.controller.gpu.smi_text import parse_smi_q
from inferctl.controller.gpu.smi_xml import parse_smi_xml
from inferctl.controller.types import GpuSnapshot

MIB = 1024 * 1024
H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__"
MIG = "linux-x86_64__nvidia-h100-mig__590.48.01__"


def read(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / "gpu" / name).read_text(encoding="utf-8")


def mem_mib(s) -> tuple:
    return tuple(None if v is None else v / MIB for v in
                 (s.memory_total_bytes, s.memory_reserved_bytes, s.memory_used_bytes, s.memory_free_bytes))


def test_h100_load_q(fixtures_dir: Path) -> None:
    cap = parse_smi_q(read(fixtures_dir, H100 + "load__q.txt"))
    assert cap.driver_version == "590.48.01" and cap.cuda_version == "13.1"
    assert cap.timestamp == calendar.timegm((2026, 7, 14, 8, 12, 53, 0, 0, 0))
    [s] = cap.gpus
    assert s.uuid == "GPU-00000000-0000-0000-0000-000000000000" and s.index == 0
    assert s.name == "NVIDIA H100 80GB HBM3" and s.pci_bus_id == "0000:00:09.0"
    assert mem_mib(s) == (81559, 479, 19818, 61263)
    assert s.memory_total_bytes == 81559 * MIB
    # 479 + 19818 + 61263 = 81560: one MiB of rounding, not "used > total"
    assert memory_accounting_gap_bytes(s) == 1 * MIB and memory_consistent(s) is True
    assert s.utilization_ratio == 1.0 and s.memory_bandwidth_utilization_ratio == pytest.approx(0.11)
    assert (s.temperature_celsius, s.memory_temperature_celsius) == (59.0, 55.0)
    assert (s.power_watts, s.power_limit_watts) == (629.45, 700.0)
    assert (s.clocks_sm_mhz, s.clocks_mem_mhz, s.pstate) == (1980.0, 2619.0, "P0")
    assert s.fan_ratio is None
    assert (s.ecc_corrected, s.ecc_uncorrected) == (0, 0)
    assert (s.remapped_rows_pending, s.remapped_rows_failure) == (False, False)
    assert s.recovery_action == 0 and s.persistence_mode is True and s.mig_enabled is False
    assert [(p.pid, p.name, p.used_memory_bytes // MIB) for p in s.processes] == [
        (11327, "/root/tools/memhog", 2566), (11328, "/root/tools/memhog", 1542), (11345, "./gpu_burn", 15690)]


def test_h100_idle_q(fixtures_dir: Path) -> None:
    [s] = parse_smi_q(read(fixtures_dir, H100 + "idle__q.txt")).gpus
    assert mem_mib(s) == (81559, 479, 0, 81081)
    assert s.utilization_ratio == 0.0 and s.temperature_celsius == 41.0 and s.power_watts == 69.85
    assert s.clocks_sm_mhz == 345.0 and s.processes == []
    assert used_ratio(s) == 0.0
    assert used_ratio(s, count_reserved=True) == pytest.approx(479 / 81559)


def test_h100_load_query_gpu_csv(fixtures_dir: Path) -> None:
    cap = parse_query_gpu_csv(read(fixtures_dir, H100 + "load__querygpu.csv"))
    [s] = cap.gpus
    assert cap.driver_version == "590.48.01"
    assert s.uuid == "GPU-00000000-0000-0000-0000-000000000000" and s.index == 0
    assert mem_mib(s) == (81559, 479, 19818, 61263)
    assert s.utilization_ratio == 1.0 and s.memory_bandwidth_utilization_ratio == pytest.approx(0.11)
    assert (s.temperature_celsius, s.memory_temperature_celsius) == (59.0, 54.0)
    assert (s.power_watts, s.power_limit_watts) == (631.95, 700.0)
    assert (s.clocks_sm_mhz, s.clocks_mem_mhz, s.pstate) == (1980.0, 2619.0, "P0")
    assert s.fan_ratio is None                       # "[N/A]"
    assert (s.ecc_corrected, s.ecc_uncorrected) == (0, 0)
    assert (s.remapped_rows_pending, s.remapped_rows_failure) == (False, False)
    assert s.recovery_action == 0 and s.persistence_mode is True and s.mig_enabled is False


def test_h100_idle_query_gpu_csv(fixtures_dir: Path) -> None:
    [s] = parse_query_gpu_csv(read(fixtures_dir, H100 + "idle__querygpu.csv")).gpus
    assert mem_mib(s) == (81559, 479, 0, 81081)
    assert (s.temperature_celsius, s.power_watts, s.clocks_sm_mhz) == (41.0, 69.85, 345.0)


def test_h100_compute_apps(fixtures_dir: Path) -> None:
    load = parse_compute_apps_csv(read(fixtures_dir, H100 + "load__computeapps.csv"))
    procs = load.processes["GPU-00000000-0000-0000-0000-000000000000"]
    assert [(p.pid, p.used_memory_bytes // MIB) for p in procs] == [(11327, 2566), (11328, 1542), (11345, 15690)]
    assert procs[2].name == "./gpu_burn"
    assert parse_compute_apps_csv(read(fixtures_dir, H100 + "idle__computeapps.csv")).processes == {}


def test_h100_mig_load_q(fixtures_dir: Path) -> None:
    [s] = parse_smi_q(read(fixtures_dir, MIG + "load__q.txt")).gpus
    assert s.mig_enabled is True
    assert mem_mib(s) == (81559, 479, 11125, 69956)
    assert s.utilization_ratio is None and s.memory_bandwidth_utilization_ratio is None   # N/A under MIG
    assert s.remapped_rows_pending is None and s.remapped_rows_failure is None             # "Remapped Rows : N/A"
    assert [(m.gpu_instance_id, m.compute_instance_id) for m in s.mig_instances] == [(2, 0), (3, 0), (9, 0), (10, 0)]
    gi2 = s.mig_instances[0]
    assert mem_mib(gi2) == (40448, 0, 11091, 29357)
    assert [m.memory_total_bytes // MIB for m in s.mig_instances] == [40448, 20096, 9984, 9984]
    assert [(p.pid, p.gpu_instance_id, p.used_memory_bytes // MIB) for p in s.processes] == [
        (21180, 2, 2296), (21181, 2, 1272), (21198, 2, 7484)]


def test_h100_mig_idle_q(fixtures_dir: Path) -> None:
    [s] = parse_smi_q(read(fixtures_dir, MIG + "idle__q.txt")).gpus
    assert mem_mib(s) == (81559, 479, 59, 81022)
    assert [m.memory_used_bytes // MIB for m in s.mig_instances] == [26, 17, 9, 9]
    assert (s.temperature_celsius, s.power_watts) == (42.0, 71.27)


@pytest.mark.parametrize("phase,used,free,power", [("idle", 59, 81022, 71.15), ("load", 11125, 69956, 433.78)])
def test_h100_mig_query_gpu_csv(fixtures_dir: Path, phase: str, used: int, free: int, power: float) -> None:
    [s] = parse_query_gpu_csv(read(fixtures_dir, MIG + f"{phase}__querygpu.csv")).gpus
    assert mem_mib(s) == (81559, 479, used, free)
    assert s.mig_enabled is True and s.utilization_ratio is None and s.power_watts == power
    assert s.remapped_rows_pending is None


def test_h100_mig_compute_apps(fixtures_dir: Path) -> None:
    procs = parse_compute_apps_csv(read(fixtures_dir, MIG + "load__computeapps.csv")).processes
    assert [(p.pid, p.used_memory_bytes // MIB) for p in procs["GPU-00000000-0000-0000-0000-000000000000"]] == [
        (21180, 2296), (21181, 1272), (21198, 7484)]
    assert parse_compute_apps_csv(read(fixtures_dir, MIG + "idle__computeapps.csv")).processes == {}


def test_h100x8_q_with_reset_status(fixtures_dir: Path) -> None:
    cap = parse_smi_q(read(fixtures_dir, "nvsmi_q_h100x8_535.161.08.txt"))
    assert cap.driver_version == "535.161.08" and len(cap.gpus) == 8
    assert [g.pci_bus_id for g in cap.gpus] == [f"0000:{b}:00.0" for b in
                                               ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")]
    assert cap.gpus[0].uuid == "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"
    assert cap.gpus[7].uuid == "GPU-b0fe4996-1f7c-91f6-0ccd-08ae3b7e23c5"
    assert [g.index for g in cap.gpus] == list(range(8))
    assert [g.temperature_celsius for g in cap.gpus] == [29, 29, 30, 30, 31, 32, 32, 31]
    assert [g.power_watts for g in cap.gpus] == [67.74, 69.52, 70.55, 71.37, 70.33, 70.21, 71.05, 72.27]
    for g in cap.gpus:
        assert mem_mib(g) == (81559, 551, 0, 81007)
        assert memory_accounting_gap_bytes(g) == -1 * MIB
        assert g.recovery_action == 0            # Reset Required: No, Drain and Reset Recommended: No
        assert (g.remapped_rows_pending, g.remapped_rows_failure) == (False, False)
        assert g.utilization_ratio == 0.0 and g.clocks_sm_mhz == 86.0 and g.processes == []


def test_a100_mig_xml(fixtures_dir: Path) -> None:
    cap = parse_smi_xml(read(fixtures_dir, "nvsmi_qx_a100-sxm4-v12.xml"))
    assert cap.driver_version == "535.54.03"
    [s] = cap.gpus                                  # file says 4 attached but holds one <gpu>
    assert s.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298" and s.pci_bus_id == "0000:01:00.0"
    assert s.name == "NVIDIA A100-SXM4-80GB"
    assert mem_mib(s) == (81920, 869, 50, 80999)
    assert memory_accounting_gap_bytes(s) == -2 * MIB and memory_consistent(s)
    assert s.mig_enabled is True and s.persistence_mode is False
    assert [(m.gpu_instance_id, mem_mib(m)) for m in s.mig_instances] == [
        (gi, (19968, 0, 12, 19955)) for gi in (3, 4, 5, 6)]
    assert s.utilization_ratio is None               # N/A under MIG
    assert (s.temperature_celsius, s.memory_temperature_celsius) == (27.0, 44.0)
    assert (s.power_watts, s.power_limit_watts) == (67.03, 500.0)
    assert (s.clocks_sm_mhz, s.clocks_mem_mhz) == (1275.0, 1593.0)
    assert (s.ecc_corrected, s.ecc_uncorrected) == (0, 0)
    assert s.remapped_rows_pending is None and s.recovery_action == 0
    assert s.processes == []


def test_rtx3090_xml_many_na(fixtures_dir: Path) -> None:
    [s] = parse_smi_xml(read(fixtures_dir, "nvsmi_qx_rtx-3090-v12.xml")).gpus
    assert s.uuid == "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"
    assert mem_mib(s) == (24576, 316, 1, 24258)
    assert s.fan_ratio == 0.0 and s.pstate == "P8" and s.utilization_ratio == 0.0
    assert (s.power_watts, s.power_limit_watts) == (27.23, 200.0)
    assert (s.clocks_sm_mhz, s.clocks_mem_mhz) == (0.0, 405.0)
    # N/A stays no data: ECC (GeForce has none), memory temperature, remapped rows, recovery action
    assert s.ecc_corrected is None and s.ecc_uncorrected is None
    assert s.memory_temperature_celsius is None and s.remapped_rows_pending is None
    assert s.recovery_action is None and s.mig_enabled is None and s.persistence_mode is True


def test_every_fixture_is_detected_and_parses(fixtures_dir: Path) -> None:
    expect = {".txt": "q", "querygpu.csv": "query_gpu", "computeapps.csv": "compute_apps", ".xml": "qx"}
    files = sorted((fixtures_dir / "gpu").iterdir())
    assert len(files) == 15
    for f in files:
        text = f.read_text(encoding="utf-8")
        kind = next(v for k, v in expect.items() if f.name.endswith(k))
        assert detect_capture_format(text) == kind, f.name
        cap = parse_capture(text)
        for g in cap.gpus:
            assert memory_consistent(g) is True, f.name


def test_f10_query_gpu_row_with_not_supported() -> None:
    row = "GeForce GTX 770, [Not Supported], [Not Supported], 52, [Not Supported], [Not Supported], 52 %, P0"
    fields = "name,utilization.gpu,utilization.memory,temperature.gpu,power.draw,power.limit,fan.speed,pstate"
    [s] = parse_query_gpu_csv(row, fields).gpus
    assert s.name == "GeForce GTX 770"
    assert s.temperature_celsius == 52.0 and s.fan_ratio == 0.52 and s.pstate == "P0"
    assert s.utilization_ratio is None and s.memory_bandwidth_utilization_ratio is None
    assert s.power_watts is None and s.power_limit_watts is None


def test_query_gpu_header_units_nounits_and_na() -> None:
    text = ("name, utilization.gpu [%], memory.total [MiB], memory.used [MiB], power.draw [W]\n"
            "NVIDIA A10, 37, 23028, N/A, [N/A]\n")
    [s] = parse_query_gpu_csv(text).gpus
    assert s.utilization_ratio == 0.37 and s.memory_total_bytes == 23028 * MIB
    assert s.memory_used_bytes is None and s.power_watts is None


def test_query_gpu_row_length_mismatch_names_the_row() -> None:
    with pytest.raises(CaptureFormatError, match="row 1: 2 values for 3 fields"):
        parse_query_gpu_csv("a, 1\n", "name,temperature.gpu,pstate")


def test_f11_used_ratio_and_rounding() -> None:
    s = GpuSnapshot(uuid="GPU-3060", memory_total_bytes=12288 * MIB, memory_used_bytes=116 * MIB,
                    memory_free_bytes=11806 * MIB, memory_reserved_bytes=368 * MIB)
    assert used_ratio(s) == pytest.approx(0.0094, abs=5e-5)
    assert used_ratio(s, count_reserved=True) == pytest.approx(0.0394, abs=5e-5)
    assert memory_accounting_gap_bytes(s) == 2 * MIB          # 12290 vs 12288: rounding
    assert memory_consistent(s) is True
    # an idle baseline of a few hundred MiB leaves free memory high: what recovery detection reads
    assert s.memory_free_bytes / s.memory_total_bytes > 0.96
    broken = GpuSnapshot(uuid="x", memory_total_bytes=1000 * MIB, memory_used_bytes=1100 * MIB,
                         memory_free_bytes=0)
    assert used_ratio(broken) is None and memory_consistent(broken) is False
    assert used_ratio(GpuSnapshot(uuid="y", memory_total_bytes=None, memory_used_bytes=1)) is None


def test_scalar_helpers() -> None:
    assert parse_bytes("81559 MiB") == 81559 * MIB and parse_bytes("2 GiB") == 2048 * MIB
    assert parse_bytes("[N/A]") is None and parse_bytes("-5 MiB") is None
    assert parse_recovery_action("None") == 0 and parse_recovery_action("Drain and Reset") == 4
    assert parse_recovery_action("GPU Reset") == 1 and parse_recovery_action("[N/A]") is None


def test_unrecognised_capture_is_a_clear_error() -> None:
    with pytest.raises(CaptureFormatError, match="not recognised"):
        detect_capture_format("hello world")
    with pytest.raises(CaptureFormatError, match="no 'GPU <bus id>' section"):
        parse_smi_q("==============NVSMI LOG==============\nTimestamp : x\n")


def test_lifetime_ecc_and_pending_retirement_from_q_and_qx(fixtures_dir: Path) -> None:
    """The aggregate (InfoROM, never reset) ECC counts and pending page retirement are read from
    both capture layouts; "N/A" stays no data. The counts are changed in a copy of the real
    capture to prove each leaf is summed into the right kind."""
    [a100] = parse_smi_xml(read(fixtures_dir, "nvsmi_qx_a100-sxm4-v12.xml")).gpus
    assert (a100.ecc_corrected_aggregate, a100.ecc_uncorrected_aggregate) == (0, 0)
    assert a100.retired_pages_pending is None                        # N/A in the capture
    xml = read(fixtures_dir, "nvsmi_qx_a100-sxm4-v12.xml")
    agg = xml[xml.index("<aggregate>"):xml.index("</aggregate>")]
    changed = (agg.replace("<sram_correctable>0", "<sram_correctable>3")
               .replace("<dram_correctable>0", "<dram_correctable>4")
               .replace("<dram_uncorrectable>0", "<dram_uncorrectable>2"))
    xml = xml.replace(agg, changed).replace("<pending_retirement>N/A", "<pending_retirement>Yes")
    [s] = parse_smi_xml(xml).gpus
    assert (s.ecc_corrected_aggregate, s.ecc_uncorrected_aggregate) == (7, 2)
    assert (s.ecc_corrected, s.ecc_uncorrected) == (0, 0)             # volatile untouched
    assert s.retired_pages_pending is True

    text = read(fixtures_dir, "nvsmi_q_h100x8_535.161.08.txt")
    cap = parse_smi_q(text)
    assert [(g.ecc_corrected_aggregate, g.ecc_uncorrected_aggregate) for g in cap.gpus] == [(0, 0)] * 8
    assert {g.retired_pages_pending for g in cap.gpus} == {None}
    start = text.index("        Aggregate\n")
    block = text[start:text.index("SRAM Threshold Exceeded", start)]
    changed = block.replace("DRAM Correctable              : 0", "DRAM Correctable              : 5").replace(
        "SRAM Uncorrectable SEC-DED    : 0", "SRAM Uncorrectable SEC-DED    : 1")
    text = text[:start] + changed + text[start + len(block):]
    text = text.replace("Pending Page Blacklist            : N/A", "Pending Page Blacklist            : Yes", 1)
    first = parse_smi_q(text).gpus[0]
    assert (first.ecc_corrected_aggregate, first.ecc_uncorrected_aggregate) == (5, 1)
    assert (first.ecc_corrected, first.ecc_uncorrected) == (0, 0)
    assert first.retired_pages_pending is True
