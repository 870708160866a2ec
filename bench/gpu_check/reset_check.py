"""Check 5, the GPU reset rails, as a DRY RUN ONLY.

The product's :class:`controller.reset.GpuResetter` over the real ``nvml`` source, with
``dry_run=True`` on the resetter and on the call, and ``nvidia_smi`` set to a program that does
not exist (``GUARD``): even a broken dry-run path could not run a reset, change persistence
mode, MIG or clocks. Two runs against the real process list, while this process holds a CUDA
context: (a) this PID allowed -> the rails pass (outcome ``dry_run``, the planned argv listed);
(b) no PID allowed -> refused, naming this process's PID.
"""

from __future__ import annotations

import os
from typing import Any

GUARD = "/nonexistent/inferctl-gpu-check-never-runs-nvidia-smi"


def reset_dry_run(index: int = 0) -> tuple[dict, list[str]]:
    import torch

    from inferctl.controller.gpu.factory import make_gpu_source
    from inferctl.controller.reset import GpuResetter

    keep = torch.empty(1 << 20, dtype=torch.uint8, device=f"cuda:{index}")   # this PID is on the GPU
    src = make_gpu_source("nvml", timeout_s=5.0)
    problems: list[str] = []
    nums: dict[str, Any] = {"cuda_device": torch.cuda.get_device_name(index), "own_pid": os.getpid(),
                            "nvidia_smi_argv0": GUARD}
    try:
        reading = src.poll(__import__("time").time())
        snap = next((s for s in reading.gpus.values() if s.index == index), None)
        nums["process_list"] = [p.pid for p in snap.processes] if snap else None
        for name, allowed in (("own_pid_allowed", [os.getpid()]), ("nothing_allowed", [])):
            rs = GpuResetter(nvidia_smi=GUARD, gpu_source=src, dry_run=True, min_interval_seconds=0,
                             allowed_pids=lambda a=allowed: a)
            out = rs.reset(index, reason="bench.gpu_check dry run", dry_run=True, actor="gpu_check")
            nums[name] = {"outcome": out.outcome, "message": out.message,
                          "planned": [s.get("argv") for s in out.steps]}
            ran = [s for s in out.steps if s.get("returncode") is not None]
            if ran:
                problems.append(f"{name}: a dry run ran commands: {ran}")
        if nums["own_pid_allowed"]["outcome"] != "dry_run":
            problems.append(f"rails did not pass with this PID allowed: {nums['own_pid_allowed']['message']}")
        refused = nums["nothing_allowed"]
        if refused["outcome"] != "refused" or str(os.getpid()) not in refused["message"]:
            problems.append(f"rails did not refuse naming PID {os.getpid()}: {refused['message']}")
    finally:
        src.close()
        del keep
    return nums, problems
