"""DCGM blanks are the documented sentinels only (dcgm_structs.h): a real counter at or above
2**31 is a value; the standing-fault fields (aggregate ECC, pending page retirement) parse."""

from __future__ import annotations

import pytest

from inferctl.controller.gpu.dcgm import is_dcgm_blank, parse_dcgm_text


def _one(metric: str, value: str) -> tuple:
    text = f'{metric}{{gpu="0",UUID="GPU-x"}} {value}\nDCGM_FI_DEV_SM_CLOCK{{gpu="0",UUID="GPU-x"}} 1410\n'
    gpus, info = parse_dcgm_text(text)
    return gpus["GPU-x"], info


@pytest.mark.parametrize("value", [2**31, 2**31 + 5, 2147483636, 2**40, 140737488355328])
def test_large_ecc_counters_are_values_not_blanks(value: int) -> None:
    # 2**31 = 2147483648 is above the INT32 sentinels (0x7ffffff0..0x7ffffff3): a real count
    snap, info = _one("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", str(value))
    assert snap.ecc_corrected == value
    assert info.blanks == []


@pytest.mark.parametrize("value", ["2147483632", "2147483633", "2147483634", "2147483635",
                                   "9223372036854775792", "9223372036854775795"])
def test_documented_integer_sentinels_are_blanks(value: str) -> None:
    snap, info = _one("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", value)
    assert snap.ecc_uncorrected is None
    assert info.blanks == ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{GPU-x}"]


def test_fp64_fields_use_the_fp64_blank() -> None:
    snap, info = _one("DCGM_FI_DEV_POWER_USAGE", "140737488355329")      # DCGM_FP64_NOT_FOUND
    assert snap.power_watts is None and info.blanks == ["DCGM_FI_DEV_POWER_USAGE{GPU-x}"]
    snap, info = _one("DCGM_FI_DEV_POWER_USAGE", "2147483632")           # an INT32 sentinel is a real double
    assert snap.power_watts == 2147483632.0 and info.blanks == []


def test_is_dcgm_blank_by_family() -> None:
    assert is_dcgm_blank(float(0x7FFFFFF3)) and not is_dcgm_blank(float(0x7FFFFFF4))
    assert not is_dcgm_blank(float(2**31)) and is_dcgm_blank(float(2**63))
    assert is_dcgm_blank(2.0**47, fp64=True) and not is_dcgm_blank(2.0**47 - 1, fp64=True)
    assert is_dcgm_blank(float("nan")) and is_dcgm_blank(float("inf"), fp64=True)


def test_standing_fault_fields_parse() -> None:
    text = ('# TYPE DCGM_FI_DEV_ECC_DBE_AGG_TOTAL counter\n'
            'DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu="0",UUID="GPU-a"} 3\n'
            'DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu="0",UUID="GPU-a"} 2147483650\n'
            'DCGM_FI_DEV_RETIRED_PENDING{gpu="0",UUID="GPU-a"} 2\n'
            'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-a"} 0\n'
            'DCGM_FI_DEV_RETIRED_PENDING{gpu="1",UUID="GPU-b"} 0\n')
    gpus, info = parse_dcgm_text(text)
    a, b = gpus["GPU-a"], gpus["GPU-b"]
    assert (a.ecc_uncorrected_aggregate, a.ecc_corrected_aggregate) == (3, 2147483650)
    assert a.retired_pages_pending is True and a.ecc_uncorrected == 0
    assert b.retired_pages_pending is False and b.ecc_uncorrected_aggregate is None
