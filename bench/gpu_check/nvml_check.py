"""Check 1, NVML readings through the product's ``nvml`` GPU source
(``controller.gpu.factory.make_gpu_source("nvml")``) against ``torch.cuda.mem_get_info`` and
``nvidia-smi --query-gpu`` taken in the same second.

Memory (total, used, free, reserved = NVML memory v2) must agree within
``max(0.5 % of total, 64 MiB)``: the three read at different instants and nvidia-smi rounds to
MiB; the spread seen is reported. Also compared or required present: utilisation, temperature
(within 5 °C), power, ECC mode and volatile counters (equal to nvidia-smi's), remapped rows,
clocks, compute processes (this process, which holds a CUDA context, must be listed), the Xid
event set (registered, drained without error), and the per-call deadline (an NVML call made to
hang past ``timeout_s`` gives a "telemetry down" reading within the deadline, never a stall).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

MIB = 1 << 20
SMI_CORE = ("memory.total", "memory.used", "memory.free", "utilization.gpu", "temperature.gpu", "power.draw",
            "clocks.sm", "clocks.mem", "ecc.mode.current", "ecc.errors.corrected.volatile.total",
            "ecc.errors.uncorrected.volatile.total", "persistence_mode", "pci.bus_id")
#: queried one by one: an unknown field fails the whole query on older drivers
SMI_EXTRA = ("memory.reserved", "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure")


def memory_tolerance(total_bytes: int) -> int:
    """max(0.5 % of total, 64 MiB) in bytes (the issue's bound)."""
    return max(int(total_bytes * 0.005), 64 * MIB)


def smi_query(fields: tuple[str, ...], index: int = 0, timeout: float = 10.0) -> dict[str, str | None]:
    """``nvidia-smi -i N --query-gpu=...`` as {field: text}; ``[N/A]``/``[Not Supported]`` -> None.
    Raises RuntimeError with nvidia-smi's output when it fails."""
    res = subprocess.run(["nvidia-smi", "-i", str(index), f"--query-gpu={','.join(fields)}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"nvidia-smi exit {res.returncode}: {(res.stdout + res.stderr).strip()[:300]}")
    vals = [v.strip() for v in res.stdout.strip().splitlines()[0].split(",")]
    return {f: (None if v.startswith("[") or v == "" else v) for f, v in zip(fields, vals)}


def smi_extra(index: int = 0) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for f in SMI_EXTRA:
        try:
            out[f] = smi_query((f,), index)[f]
        except RuntimeError as exc:
            out[f] = f"unavailable: {exc}"
    return out


def smi_compute_pids(index: int = 0) -> list[int]:
    res = subprocess.run(["nvidia-smi", "-i", str(index), "--query-compute-apps=pid",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    return [int(x) for x in res.stdout.split() if x.strip().isdigit()]


def _f(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except ValueError:
        return None


class _HangingNvml:
    """The real pynvml, except that the first ``nvmlDeviceGetTemperature`` call sleeps ``hang_s``."""

    def __init__(self, real: Any, hang_s: float) -> None:
        self._real, self._hang_s, self._hung = real, hang_s, False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name != "nvmlDeviceGetTemperature":
            return attr

        def slow(*a: Any, **k: Any) -> Any:
            if not self._hung:
                self._hung = True
                time.sleep(self._hang_s)
            return attr(*a, **k)
        return slow


def deadline_holds(timeout_s: float = 0.5, hang_s: float = 2.0, nvml: Any = None) -> dict:
    """Poll a source whose first temperature call hangs ``hang_s``: that poll must return within
    ``timeout_s`` + 0.5 s with ``ok=False`` ("did not return"), the next one at once (< 0.2 s) while
    the call is still hung, and a poll after the call came back must be ``ok`` again. ``nvml``:
    the module under the wrapper (default the real ``pynvml``; tests give a fake)."""
    from inferctl.controller.gpu.factory import make_gpu_source

    if nvml is None:
        import pynvml as nvml
    src = make_gpu_source("nvml", nvml=_HangingNvml(nvml, hang_s), timeout_s=timeout_s)
    t0 = time.perf_counter()
    first = src.poll(time.time())
    took = time.perf_counter() - t0
    t1 = time.perf_counter()
    second = src.poll(time.time())
    took2 = time.perf_counter() - t1
    time.sleep(hang_s)               # the hung call returns
    third = src.poll(time.time())
    src.close()
    return {"timeout_s": timeout_s, "hang_s": hang_s, "hung_poll_returned_after_s": round(took, 3),
            "hung_poll_error": first.error, "next_poll_returned_after_s": round(took2, 3),
            "next_poll_error": second.error, "after_recovery_ok": third.ok,
            "holds": (not first.ok and took <= timeout_s + 0.5 and "did not return" in (first.error or "")
                      and not second.ok and took2 < 0.2 and third.ok)}


def nvml_readings(index: int = 0) -> tuple[dict, list[str]]:
    """One comparison (module doc). Needs CUDA (this process takes a context first), pynvml and
    nvidia-smi."""
    import torch

    from inferctl.controller.gpu.factory import make_gpu_source

    problems: list[str] = []
    keep = torch.empty(256 * MIB, dtype=torch.uint8, device=f"cuda:{index}")   # a context + memory in use
    torch.cuda.synchronize()
    src = make_gpu_source("nvml", timeout_s=5.0)
    src.poll(time.time())            # init and register the Xid event sets
    t0 = time.time()
    reading = src.poll(t0)
    free_t, total_t = torch.cuda.mem_get_info(index)
    smi = smi_query(SMI_CORE, index)
    t1 = time.time()
    extra = smi_extra(index)
    smi_pids = smi_compute_pids(index)
    registered = [d.event_set is not None for d in getattr(src, "_state").devices]
    src.close()
    del keep
    if not reading.ok:
        return {"error": reading.error}, [f"nvml source reading not ok: {reading.error}"]
    snap = next((s for s in reading.gpus.values() if s.index == index), None)
    if snap is None:
        return {"gpus": list(reading.gpus)}, [f"nvml source has no GPU index {index}"]
    total = snap.memory_total_bytes or total_t
    tol = memory_tolerance(total)
    smi_b = {k: None if _f(smi.get(f"memory.{k}")) is None else int(_f(smi[f"memory.{k}"]) * MIB)
             for k in ("total", "used", "free")}
    res_smi = _f(extra.get("memory.reserved"))
    mem = {"total": {"nvml": snap.memory_total_bytes, "torch": total_t, "smi": smi_b["total"]},
           "used": {"nvml": snap.memory_used_bytes, "torch_total_minus_free_minus_reserved":
                    (total_t - free_t - snap.memory_reserved_bytes) if snap.memory_reserved_bytes is not None
                    else None, "smi": smi_b["used"]},
           "free": {"nvml": snap.memory_free_bytes, "torch": free_t, "smi": smi_b["free"]},
           "reserved": {"nvml": snap.memory_reserved_bytes, "smi": None if res_smi is None else int(res_smi * MIB)}}
    spreads = {}
    for what, vals in mem.items():
        got = [v for v in vals.values() if v is not None]
        if len(got) < 2 or vals.get("nvml") is None:
            problems.append(f"memory {what}: fewer than two sources or none from NVML ({vals})")
            continue
        spreads[what] = max(got) - min(got)
        if spreads[what] > tol:
            problems.append(f"memory {what}: spread {spreads[what] / MIB:.1f} MiB > {tol / MIB:.1f} MiB ({vals})")
    nums: dict[str, Any] = {"cuda_device": torch.cuda.get_device_name(index), "gpu_uuid": snap.uuid,
                            "sample_span_seconds": round(t1 - t0, 3), "memory_bytes": mem,
                            "memory_spread_bytes": spreads, "memory_tolerance_bytes": tol}
    if t1 - t0 > 1.0:
        problems.append(f"the three readings took {t1 - t0:.2f} s, not within one second")
    # utilisation, temperature, power, clocks
    temp_smi = _f(smi.get("temperature.gpu"))
    nums["nvml"] = {k: getattr(snap, k) for k in (
        "utilization_ratio", "memory_bandwidth_utilization_ratio", "temperature_celsius", "power_watts",
        "power_limit_watts", "clocks_sm_mhz", "clocks_mem_mhz", "ecc_corrected", "ecc_uncorrected",
        "remapped_rows_pending", "remapped_rows_failure", "persistence_mode", "mig_enabled", "pstate",
        "recovery_action")}
    nums["smi"] = {**smi, **extra}
    for k in ("utilization_ratio", "temperature_celsius", "power_watts", "clocks_sm_mhz", "clocks_mem_mhz"):
        if getattr(snap, k) is None:
            problems.append(f"{k}: no data from the nvml source")
    if snap.utilization_ratio is not None and not 0 <= snap.utilization_ratio <= 1:
        problems.append(f"utilization_ratio {snap.utilization_ratio} outside 0..1")
    if temp_smi is not None and snap.temperature_celsius is not None and abs(temp_smi - snap.temperature_celsius) > 5:
        problems.append(f"temperature: nvml {snap.temperature_celsius} vs nvidia-smi {temp_smi} °C")
    # ECC and remapped rows
    ecc_mode = (smi.get("ecc.mode.current") or "").lower()
    nums["ecc_mode"] = ecc_mode or None
    if ecc_mode == "enabled":
        for k, f in (("ecc_corrected", "ecc.errors.corrected.volatile.total"),
                     ("ecc_uncorrected", "ecc.errors.uncorrected.volatile.total")):
            v, s = getattr(snap, k), _f(smi.get(f))
            if v is None or (s is not None and int(s) != v):
                problems.append(f"{k}: nvml {v} vs nvidia-smi {smi.get(f)}")
        if snap.remapped_rows_pending is None:
            problems.append("remapped rows: no data from the nvml source")
    # processes
    nvml_pids = [p.pid for p in snap.processes]
    nums["processes"] = {"own_pid": os.getpid(), "nvml_pids": nvml_pids, "smi_pids": smi_pids}
    if os.getpid() not in nvml_pids:
        problems.append(f"own PID {os.getpid()} not among the nvml source's compute processes {nvml_pids}"
                        f" (nvidia-smi lists {smi_pids})")
    # Xid and deadline
    nums["xid"] = {"event_sets_registered": registered, "events_this_poll": len(snap.xid_events)}
    if not registered or not all(registered):
        problems.append(f"Xid event set not registered on every GPU ({registered})")
    nums["deadline"] = deadline_holds()
    if not nums["deadline"]["holds"]:
        problems.append(f"per-call deadline did not hold: {nums['deadline']}")
    return nums, problems


def nvml_available() -> str | None:
    """Why the NVML check cannot run here, or None."""
    from inferctl.controller.gpu.nvml import probe_nvml

    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found on PATH"
    return probe_nvml()


