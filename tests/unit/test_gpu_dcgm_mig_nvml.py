"""Standing hardware state and per-MIG-instance memory from NVML (fake pynvml): aggregate ECC,
pending page retirement, one MigInstance per MIG device with its own memory."""

from __future__ import annotations

import pynvml

from inferctl.controller.gpu.nvml import NvmlGpuSource
from tests.gpu_helpers import MIB, FakeGpu, FakeMig, FakeNvml


def test_nvml_reads_aggregate_ecc_and_pending_retirement() -> None:
    g = FakeGpu(uuid="GPU-a", ecc=(0, 0), ecc_aggregate=(12, 3), retired_pending=1)
    s = NvmlGpuSource(FakeNvml([g]), timeout_s=1.0).poll(0.0).gpus["GPU-a"]
    assert (s.ecc_corrected, s.ecc_uncorrected) == (0, 0)
    assert (s.ecc_corrected_aggregate, s.ecc_uncorrected_aggregate) == (12, 3)
    assert s.retired_pages_pending is True


def test_nvml_retirement_not_supported_is_no_data() -> None:
    g = FakeGpu(uuid="GPU-h", overrides={"nvmlDeviceGetRetiredPagesPendingStatus": pynvml.NVMLError_NotSupported()})
    s = NvmlGpuSource(FakeNvml([g]), timeout_s=1.0).poll(0.0).gpus["GPU-h"]
    assert s.retired_pages_pending is None


def test_nvml_mig_devices_carry_their_own_memory() -> None:
    migs = [FakeMig(uuid="MIG-1", gi=1, ci=0, total_mib=40192, used_mib=1000, reserved_mib=0),
            FakeMig(uuid="MIG-2", gi=2, ci=0, total_mib=20096, used_mib=19000, reserved_mib=0)]
    g = FakeGpu(uuid="GPU-m", mig=migs, mig_slots=7)
    s = NvmlGpuSource(FakeNvml([g]), timeout_s=1.0).poll(0.0).gpus["GPU-m"]
    assert s.mig_enabled is True
    got = [(m.gpu_instance_id, m.uuid, m.memory_total_bytes, m.memory_used_bytes, m.memory_free_bytes)
           for m in s.mig_instances]
    assert got == [(1, "MIG-1", 40192 * MIB, 1000 * MIB, 39192 * MIB),
                   (2, "MIG-2", 20096 * MIB, 19000 * MIB, 1096 * MIB)]
    assert s.memory_total_bytes == 81920 * MIB           # the parent stays whole-GPU
