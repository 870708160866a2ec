"""bench.gpu_check in its CPU mode (what CI can run): every GPU check is skipped with the reason
"no CUDA device" (never passed), the CPU halves pass with real numbers, both files are written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.gpu_check.engine_check import REFERENCE, compare, first_near_tie
from bench.gpu_check.report import NO_CUDA

ROOT = Path(__file__).resolve().parents[2]
GPU_CHECKS = {"nvml", "engine_cuda_reference", "engine_speed_cuda", "cuda_oom", "fragmentation_cuda",
              "reset_dry_run"}
CPU_CHECKS = {"engine_cpu_reference", "engine_speed_cpu", "fragmentation_cpu"}


def test_cpu_mode_skips_every_gpu_check_and_passes_the_cpu_halves(tmp_path, stories_dir):
    out = tmp_path / "gc"
    res = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(out), "--quick", "--device", "cpu",
                          "--threads", "1", "--stories", str(stories_dir)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    doc = json.loads((out / "gpu-check.json").read_text())
    md = (out / "gpu-check.md").read_text()
    checks = {c["name"]: c for c in doc["checks"]}
    assert set(checks) == GPU_CHECKS | CPU_CHECKS
    for name in GPU_CHECKS:
        assert checks[name]["gpu"] is True
        assert checks[name]["status"] == "skipped", checks[name]
        assert checks[name]["reason"].startswith(NO_CUDA)
        assert f"| {name} (" in md and "| skipped | skipped: no CUDA device" in md
    for name in CPU_CHECKS:
        assert checks[name]["status"] == "pass", checks[name]
    assert doc["summary"] == {"pass": 3, "fail": 0, "skipped": 6}
    ref = checks["engine_cpu_reference"]["numbers"]
    assert ref["text"].startswith(REFERENCE) and ref["tokens"] == 60 and ref["dtype"] == "float32"
    assert 0.01 < ref["min_top2_margin"] < 50 and ref["first_near_tie"] is None
    speed = checks["engine_speed_cpu"]["numbers"]["tok_s"]
    assert set(speed) == {"stories260K", "tiny-llama-random"}
    for rows in speed.values():
        for r in rows.values():
            assert r["engine_tok_s"] > 0 and r["hf_tok_s"] > 0
            assert abs(r["ratio"] - r["engine_tok_s"] / r["hf_tok_s"]) < 0.01
    frag = checks["fragmentation_cpu"]["numbers"]
    assert frag["engine_memory_source"] == "simulated" and frag["running_requests"] > 0
    assert 0 < frag["allocator_unallocated_bytes"] < frag["allocator_reserved_bytes"]
    assert frag["allocator_ratio"] == frag["engine_ratio"] == frag["controller_ratio"]
    assert abs(frag["allocator_ratio"] - frag["allocator_unallocated_bytes"] / frag["allocator_reserved_bytes"]) < 1e-12


def test_cuda_asked_without_cuda_is_a_usage_error(tmp_path, stories_dir):
    import torch

    if torch.cuda.is_available():
        return
    res = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(tmp_path), "--device", "cuda",
                          "--stories", str(stories_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--device cuda" in res.stderr
    assert not (tmp_path / "gpu-check.json").exists()


def test_near_tie_comparison():
    ref = {"ids": [5, 6, 7, 8, 9], "margins": [1.0, 0.5, 0.004, 2.0, 1.0]}
    assert first_near_tie(ref["margins"]) == 2
    # differing at the near-tie (index 2) or after it is allowed; before it is not
    assert compare(ref, {"ids": [5, 6, 1, 1, 1]})["equal_up_to_near_tie"] is True
    assert compare(ref, {"ids": [5, 1, 7, 8, 9]})["equal_up_to_near_tie"] is False
    assert compare(ref, {"ids": [5, 6, 7, 8, 9]})["first_difference"] is None
    no_tie = {"ids": [1, 2, 3], "margins": [1.0, 1.0, 1.0]}
    assert compare(no_tie, {"ids": [1, 2, 4]})["equal_up_to_near_tie"] is False


def test_deadline_check_over_a_fake_nvml():
    """The nvml check's deadline probe (the part that needs no GPU): the hung poll answers "down"
    within the deadline, the next at once, and the source reads again once the call returned."""
    from bench.gpu_check.nvml_check import deadline_holds, memory_tolerance
    from tests.gpu_helpers import FakeGpu, FakeNvml

    out = deadline_holds(timeout_s=0.3, hang_s=0.8, nvml=FakeNvml([FakeGpu("GPU-a")]))
    assert out["holds"] is True, out
    assert 0.25 <= out["hung_poll_returned_after_s"] <= 0.8
    assert "did not return" in out["hung_poll_error"] and out["after_recovery_ok"] is True
    # max(0.5 % of total, 64 MiB): 64 MiB on a 12 GiB card, 0.5 % (~704 MiB) on an H200's 140,800 MiB
    assert memory_tolerance(12 << 30) == 64 << 20
    assert memory_tolerance(140_800 << 20) == int((140_800 << 20) * 0.005)
