"""dcgm-exporter scrapes: every block of shared/fixtures/dcgm/metrics_samples.txt, blanks, MIG, HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferctl.controller.gpu.dcgm import DcgmGpuSource, is_dcgm_blank, parse_dcgm_text
from tests.gpu_helpers import TextServer

MIB = 1024 * 1024
L40S = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"


@pytest.fixture(scope="module")
def scrape(fixtures_dir: Path) -> str:
    return (fixtures_dir / "dcgm" / "metrics_samples.txt").read_text(encoding="utf-8")


def test_block_a_l40s_with_capital_hostname_label(scrape: str) -> None:
    gpus, info = parse_dcgm_text(scrape)
    s = gpus[L40S]
    assert (s.index, s.name, s.pci_bus_id) == (0, "NVIDIA L40S", "0000:00:07.0")
    assert (s.clocks_sm_mhz, s.clocks_mem_mhz) == (210.0, 405.0)
    assert (s.temperature_celsius, s.memory_temperature_celsius) == (32.0, 0.0)
    assert s.power_watts == pytest.approx(35.686)
    assert s.utilization_ratio == 0.0
    assert s.memory_bandwidth_utilization_ratio == 0.0     # MEM_COPY_UTIL wins over PROF_DRAM_ACTIVE
    assert s.memory_free_bytes == 45459 * MIB and s.memory_used_bytes == 0
    assert s.memory_reserved_bytes == 608 * MIB
    assert s.memory_total_bytes == (45459 + 0 + 608) * MIB
    assert s.remapped_rows_failure is False and s.mig_enabled is None
    assert "gpu1-wl8sg" in info.hostnames


def test_block_b_lowercase_hostname_and_mig_instances(scrape: str) -> None:
    gpus, info = parse_dcgm_text(scrape)
    assert "dcgm-exporter-wwwjh" in info.hostnames
    ada = gpus["GPU-fc60126e-514d-3522-2828-c5daa8e99d85"]
    assert (ada.index, ada.pci_bus_id) == (1, "0000:b1:00.0")
    assert ada.memory_free_bytes == 11275 * MIB and ada.temperature_celsius == 44.0
    assert ada.memory_used_bytes is None and ada.memory_total_bytes is None   # not in the excerpt
    a30 = gpus["GPU-63bc0b91-2265-1b94-831c-15c41fe92675"]
    assert a30.mig_enabled is True and a30.temperature_celsius == 45.0
    assert a30.memory_free_bytes is None                                      # only per-instance FB
    [gi3] = a30.mig_instances
    assert (gi3.gpu_instance_id, gi3.profile, gi3.memory_free_bytes) == (3, "1g.6gb", 2207 * MIB)
    other = gpus["GPU-9a63752e-af8d-fe52-7f0d-968bca6d52e3"]
    assert other.temperature_celsius == 50.0
    assert {m.gpu_instance_id: m.memory_used_bytes for m in other.mig_instances} == {3: None, 6: 3744 * MIB}


def test_block_c_masked_uuids_are_not_merged(scrape: str) -> None:
    gpus, _ = parse_dcgm_text(scrape)
    masked = {k: g for k, g in gpus.items() if k.startswith("GPU-********")}
    assert sorted(masked) == [f"GPU-********#gpu{i}" for i in range(4)]
    assert [masked[f"GPU-********#gpu{i}"].memory_temperature_celsius for i in range(4)] == [43, 42, 38, 41]
    gpu0 = masked["GPU-********#gpu0"]
    assert [(m.gpu_instance_id, m.profile) for m in gpu0.mig_instances] == [(1, "3g.40gb"), (2, "3g.40gb")]
    h100 = gpus["GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"]
    assert [(m.gpu_instance_id, m.utilization_ratio) for m in h100.mig_instances] == [(7, 0.0), (8, 0.0), (9, 0.0)]


def test_block_d_v100_without_pci_label(scrape: str) -> None:
    gpus, _ = parse_dcgm_text(scrape)
    assert gpus["GPU-a9079f15-493e-6c1c-c78c-73ec2b840cba"].power_limit_watts == 300.0
    assert gpus["GPU-bd94f0f5-8c2f-bc95-74ad-5f99fdc33d01"].power_limit_watts == 300.0
    v0 = gpus["GPU-a6158b59-2c1e-1e63-0068-9178c4298abd"]
    assert v0.utilization_ratio == 0.0 and v0.pci_bus_id is None and v0.name == "Tesla V100-SXM2-32GB"


def test_block_e_not_supported_sentinel_is_no_data(scrape: str) -> None:
    gpus, info = parse_dcgm_text(scrape)
    s = gpus["GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"]
    assert (s.clocks_sm_mhz, s.clocks_mem_mhz) == (139.0, 405.0)
    assert s.memory_temperature_celsius is None       # 9223372036854775794 = INT64 NOT_SUPPORTED
    assert info.blanks == ["DCGM_FI_DEV_MEMORY_TEMP{GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52}"]
    assert len(gpus) == 1 + 3 + 5 + 4 + 1 and info.bad_lines == []   # blocks A..E


@pytest.mark.parametrize("value", ["2147483632", "2147483635", "9223372036854775792",
                                   "9223372036854775795", "1.7976931348623157e+308", "NaN", "-1"])
def test_blank_sentinels_and_invalid_values_are_none(value: str) -> None:
    text = (f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="GPU-x"}} {value}\n'
            'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-x"} 1410\n')
    gpus, info = parse_dcgm_text(text)
    assert gpus["GPU-x"].temperature_celsius is None
    assert gpus["GPU-x"].clocks_sm_mhz == 1410.0
    assert info.blanks == ["DCGM_FI_DEV_GPU_TEMP{GPU-x}"]


def test_blank_threshold() -> None:
    assert is_dcgm_blank(2147483632.0) and not is_dcgm_blank(2147483631.0)


def test_counters_ecc_and_xid_from_a_typed_scrape() -> None:
    text = ('# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n'
            'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-a",Hostname="h"} 2\n'
            '# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter\n'
            'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="0",UUID="GPU-a",Hostname="h"} 17\n'
            'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a",err_code="48",err_msg="DBE"} 48\n')
    gpus, info = parse_dcgm_text(text)
    assert (gpus["GPU-a"].ecc_corrected, gpus["GPU-a"].ecc_uncorrected) == (17, 2)
    assert info.last_xid == {"GPU-a": (48, "DBE")}


@pytest.mark.e2e
def test_source_over_http_emits_xid_once_and_survives_outages(scrape: str) -> None:
    state = {"n": 0}
    xid_values = [0, 79, 79, 0, 13]

    def metrics(handler, body):
        i = state["n"]
        state["n"] += 1
        if i == 5:
            return 503, "text/plain", "busy"
        v = xid_values[min(i, 4)]
        return 200, "text/plain; version=0.0.4", scrape + (
            f'\nDCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="{L40S}",hostname="h"}} {v}\n')

    with TextServer({"/metrics": metrics}) as srv:
        src = DcgmGpuSource(srv.url + "/metrics", timeout_s=1.0, poll_interval_s=5.0)
        readings = [src.poll(float(t)) for t in range(6)]
        src.close()
    assert [r.ok for r in readings] == [True, True, True, True, True, False]
    assert readings[0].gpus[L40S].memory_reserved_bytes == 608 * MIB
    assert [[e.xid for e in r.gpus[L40S].xid_events] for r in readings[:5]] == [[], [79], [], [], [13]]
    assert readings[1].gpus[L40S].xid_events[0].pci_bus_id == "0000:00:07.0"
    assert "HTTP 503" in readings[5].error and readings[5].gpus == {}


def test_source_down_when_exporter_unreachable() -> None:
    src = DcgmGpuSource("http://127.0.0.1:9/metrics", timeout_s=0.5)
    r = src.poll(1.0)
    assert r.ok is False and r.gpus == {} and "ConnectError" in r.error
    with pytest.raises(ValueError, match="shorter than poll_interval_s"):
        DcgmGpuSource("http://x/metrics", timeout_s=3.0, poll_interval_s=2.0)
