"""What the precision policy reads from a poll, as pure functions: an OOM fault's numbers,
the hardware evidence near an OOM, and the memory sample that decides a rollback.

Sizes are bytes (``int``/``float``), times seconds (``time.time()`` scale). ``None`` is "no
data" and never becomes 0. The rules are those of docs/policies.md ("Precision": faults,
hardware hand-off, rollback threshold).
"""

from __future__ import annotations

import math

from typing import Any, Mapping

from inferctl.controller.gpu.base import MEMORY_ROUNDING_TOLERANCE_BYTES
from inferctl.controller.policies.hardware_state import counter_increase, standing_faults
from inferctl.controller.signals import (InvalidSampleCounter, OomNumbers, format_bytes,
                                         parse_oom_message, validate_nonneg)
from inferctl.controller.types import EngineSnapshot, GpuSnapshot

#: Xids that do not mean the GPU is at fault (NVIDIA's Xid catalogue gives no action for 43,
#: 63, 92; docs/field-cases.md). Any other Xid near an OOM makes it a hardware fault.
BENIGN_XIDS = frozenset({43, 63, 92})

#: NVML field 230 (GPU recovery action) values that mean the GPU itself needs attention:
#: 1 reset, 2 node reboot, 4 drain and reset.
HARDWARE_RECOVERY_ACTIONS = frozenset({1, 2, 4})


def fault_numbers(fault: Mapping[str, Any]) -> tuple[OomNumbers, str]:
    """The fault's numbers (bytes): its own fields where present, else parsed from its
    message; and where they came from (``"fields"`` or ``"message"``)."""
    parsed = parse_oom_message(fault.get("message"))
    vals = {}
    for key in ("requested_bytes", "free_bytes", "total_bytes", "allocated_bytes",
                "reserved_unallocated_bytes"):
        v = validate_nonneg(fault.get(key)).value
        vals[key] = int(v) if v is not None else getattr(parsed, key)
    return OomNumbers(**vals), ("fields" if fault.get("requested_bytes") is not None
                                else "message")


def fault_inputs(fault: Mapping[str, Any], nums: OomNumbers, kind: str) -> dict[str, Any]:
    """The decision inputs of one fault: its id/time/kind, the numbers in bytes and in words
    (``"96.00 MiB"``), the engine's precision, source and message."""
    return {
        "fault_id": fault.get("id"), "fault_time": fault.get("time"), "kind": kind,
        "requested_bytes": nums.requested_bytes, "requested": format_bytes(nums.requested_bytes),
        "free_bytes": nums.free_bytes, "free": format_bytes(nums.free_bytes),
        "total_bytes": nums.total_bytes, "allocated_bytes": nums.allocated_bytes,
        "reserved_unallocated_bytes": nums.reserved_unallocated_bytes,
        "engine_precision": fault.get("precision"), "source": fault.get("source"),
        "prompt_len_bucket": fault.get("prompt_len_bucket"),
        "message": fault.get("message"),
        "request_id": fault.get("request_id"), "x_request_id": fault.get("x_request_id"),
    }


def hardware_evidence(now: float, gpu: GpuSnapshot | None, telemetry_ok: bool,
                      window_seconds: float, ecc_seen: dict[str, int]) -> list[str]:
    """Why the GPU snapshot points at the hardware, in words (empty: it does not): lost,
    uncorrectable ECC count grown since the last call (``ecc_seen`` keeps the count per GPU
    uuid and is updated; a decrease is a counter reset, not an error), a standing fault
    (``hardware_state.standing_faults``: uncorrectable ECC errors, volatile or aggregate, pages
    pending retirement, a pending or failed row remap), NVML recovery action 1/2/4, a lost
    report, or a non-benign Xid within ``window_seconds`` of ``now``. No GPU or telemetry down:
    no evidence."""
    if gpu is None or not telemetry_ok:
        return []
    ev: list[str] = []
    if gpu.lost or (gpu.health or "").lower() == "lost":
        ev.append(f"GPU {gpu.uuid} is lost")
    prev = ecc_seen.get(gpu.uuid)
    cur = validate_nonneg(gpu.ecc_uncorrected).value
    if cur is not None:
        inc, reset = counter_increase(prev, int(cur))
        if inc and not reset:
            ev.append(f"uncorrectable ECC errors grew {prev} -> {int(cur)}")
        ecc_seen[gpu.uuid] = int(cur)
    # the standing state, not only deltas: a GPU carrying any of these is faulty whatever grew
    ev += [f"standing fault: {words}" for words in standing_faults(gpu).values()]
    if gpu.recovery_action in HARDWARE_RECOVERY_ACTIONS:
        ev.append(f"NVML recovery action {gpu.recovery_action}")
    for x in gpu.xid_events:
        if getattr(x, "lost", False):
            ev.append(f"Xid {x.xid}: GPU fell off the bus")
        elif x.xid is not None and x.xid not in BENIGN_XIDS and \
                (not x.time or abs(now - x.time) <= window_seconds):
            ev.append(f"Xid {x.xid}: {x.message}")
    return ev


def memory_sample(config: Any, engine: EngineSnapshot, gpu: GpuSnapshot | None,
                  telemetry_ok: bool, c: InvalidSampleCounter | None
                  ) -> tuple[dict[str, Any] | None, str]:
    """The rollback sample: ``({"free_bytes", "total_bytes", "extra_weights_bytes",
    "margin_bytes", "threshold_bytes", ... "memory_source"}, "")`` or ``(None, why)`` when
    there is no usable sample (engine down, telemetry down, GPU lost, a missing or
    inconsistent value). Threshold = (full − int8 weight bytes, or
    ``config.full_weights_extra_bytes``) + ``config.margin_bytes`` (else
    ``config.margin_ratio`` × total). Free memory is the GPU's, or without a GPU the engine's
    budget − reserved. Invalid values are recorded on ``c``."""
    if not engine.ok:
        return None, "engine did not answer (no data)"
    if gpu is not None or not telemetry_ok:
        if not telemetry_ok:
            return None, "GPU telemetry down (no data is not recovery)"
        if gpu.lost:
            return None, "GPU lost"
        free = validate_nonneg(gpu.memory_free_bytes, "gpu_memory_free_bytes", c)
        total = validate_nonneg(gpu.memory_total_bytes, "gpu_memory_total_bytes", c)
        src = "gpu"
    else:
        budget = validate_nonneg(engine.memory_budget_bytes, "engine_memory_budget_bytes", c)
        reserved = validate_nonneg(engine.memory_reserved_bytes,
                                   "engine_memory_reserved_bytes", c)
        if budget.value is None or reserved.value is None:
            bad = budget if budget.value is None else reserved
            return None, f"engine memory: {bad.reason}"
        free_v = budget.value - reserved.value
        if free_v < 0:
            if c is not None:
                c.record("engine_memory_free_bytes", "negative")
            return None, f"engine reserved {reserved.value:.0f} B > budget {budget.value:.0f} B"
        free = validate_nonneg(free_v)
        total = budget
        src = "engine budget - reserved"
    if free.value is None:
        return None, f"free memory: {free.reason}"
    if total.value is None or total.value == 0:
        return None, f"total memory: {total.reason or 'is 0'}"
    if free.value > total.value + MEMORY_ROUNDING_TOLERANCE_BYTES:
        if c is not None:
            c.record("gpu_memory_free_bytes" if src == "gpu" else "engine_memory_free_bytes",
                     "above_total")
        return None, (f"free memory {format_bytes(free.value)} > total {format_bytes(total.value)}"
                      " (an inconsistent sample is no data)")
    extra = config.full_weights_extra_bytes
    if extra is None:
        fw = validate_nonneg(engine.full_weights_bytes, "full_weights_bytes", c).value
        w = validate_nonneg(engine.weights_bytes, "weights_bytes", c).value
        if fw is None or w is None:
            return None, "full-precision weight size unknown (set full_weights_extra_bytes)"
        extra = max(0.0, fw - w)
    margin = (config.margin_bytes if config.margin_bytes is not None
              else config.margin_ratio * total.value)
    threshold = extra + margin
    reclaimable = reclaimable_bytes(engine)
    return {"free_bytes": free.value, "free": format_bytes(free.value),
            "reclaimable_bytes": reclaimable, "headroom_bytes": free.value + reclaimable,
            "headroom": format_bytes(free.value + reclaimable),
            "total_bytes": total.value, "extra_weights_bytes": extra,
            "margin_bytes": margin, "threshold_bytes": threshold,
            "threshold": format_bytes(threshold), "memory_source": src}, ""


def reclaimable_bytes(engine: EngineSnapshot) -> float:
    """Bytes the engine's own caching allocator holds but does not use (reserved − allocated),
    0 when either number is missing or inconsistent (never a guess in the rollback's favour).

    They count as headroom for the engine's own rollback: PyTorch's CUDA caching allocator
    frees its cached, unused blocks and retries before it raises an out-of-memory error
    (PyTorch docs, "CUDA semantics: memory management"), so the full-precision weights can
    use them. Without this, an engine under steady light load (never idle, so its cache is
    never emptied) would never read as recovered and would stay int8 for good."""
    reserved, allocated = engine.memory_reserved_bytes, engine.memory_allocated_bytes
    if not isinstance(reserved, (int, float)) or not isinstance(allocated, (int, float)):
        return 0.0
    if isinstance(reserved, bool) or isinstance(allocated, bool):
        return 0.0
    if not (math.isfinite(reserved) and math.isfinite(allocated)) or allocated < 0 or reserved < allocated:
        return 0.0
    return float(reserved - allocated)


def queue_backlog(engine: EngineSnapshot) -> int | None:
    """The engine's waiting requests (``EngineSnapshot.waiting``) when it reports more than none,
    else ``None`` (an empty queue, or no data: a count the engine does not report leaves the
    decision to memory alone, as before the count existed).

    Why a backlog defers a rollback: the free memory of the hold is measured between the engine's
    steps, and the allocator cache counted as headroom (:func:`reclaimable_bytes`) is the working
    memory the queued prompts' prefill will need again. The degrade's own backlog — the long
    prompts that ran out of memory in full precision, still queued when the pressure ended — then
    fails at once after a rollback (a drill under CI load: rollback with 9 waiting, a relapse OOM
    20 ms later). The hold keeps running meanwhile; the rollback comes on the first poll with an
    empty queue."""
    waiting = engine.waiting
    if isinstance(waiting, int) and not isinstance(waiting, bool) and waiting > 0:
        return waiting
    return None


def rollback_reason(sample: Mapping[str, Any], held: float, hold: float) -> str:
    """The rollback decision's reason text from a :func:`memory_sample` ``sample``, the seconds the
    condition ``held`` and the ``hold`` it needed."""
    return (f"free memory {sample['free']} (+ {format_bytes(sample['reclaimable_bytes'])} reusable allocator "
            f"cache) has stayed >= {sample['threshold']} (full-precision weights' extra "
            f"{format_bytes(sample['extra_weights_bytes'])} + margin {format_bytes(sample['margin_bytes'])}) "
            f"for {held:g} s >= hold {hold:g} s with no new OOM and no queue: switch back to full precision")
