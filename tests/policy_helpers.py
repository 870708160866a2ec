"""Builders for policy tests: engine and GPU snapshots, OOM faults, TTFT histograms."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from inferctl.controller.types import EngineSnapshot, GpuReading, GpuSnapshot, XidEvent

MiB = 1 << 20
GiB = 1 << 30

#: A small bundled engine on CPU: budget 1,000,000 B; full weights 400,000 B, int8 weights
#: 100,000 B → rollback needs 300,000 B extra + 10 % of the budget = 400,000 B free.
BUDGET = 1_000_000
FULL_W = 400_000
INT8_W = 100_000
THRESHOLD = (FULL_W - INT8_W) + BUDGET // 10


def acts(decisions: Iterable) -> list:
    """The decisions' actions in order (None for a refusal or a note)."""
    return [d.action for d in decisions]


def actions(decisions: Iterable) -> list:
    """The decisions' actions in order, refusals and notes (action None) left out."""
    return [d.action for d in decisions if d.action is not None]


def engine(t: float = 0.0, *, name: str = "e0", precision: str | None = "full",
           faults: Sequence[dict] = (), reserved: int | None = 500_000,
           allocated: int | None = None, ok: bool = True, **kw: Any) -> EngineSnapshot:
    """A bundled-engine snapshot at time ``t``; ``reserved`` sets free = budget − reserved."""
    weights = INT8_W if precision == "int8" else FULL_W
    fields = dict(memory_budget_bytes=BUDGET, memory_reserved_bytes=reserved,
                  memory_allocated_bytes=allocated, full_weights_bytes=FULL_W,
                  weights_bytes=weights)
    fields.update(kw)
    return EngineSnapshot(name=name, kind="bundled", ok=ok, time=t, precision=precision,
                          faults=list(faults), **fields)


def free_of(free_bytes: int) -> int:
    """The ``reserved`` that leaves ``free_bytes`` of the budget free."""
    return BUDGET - free_bytes


def oom(fid: int, t: float, kind: str | None = "exhaustion", *, requested: int | None = 96 * MiB,
        free: int | None = 10 * MiB, message: str = "CUDA out of memory.", **kw: Any) -> dict:
    f = {"id": fid, "time": t, "kind": kind, "requested_bytes": requested, "free_bytes": free,
         "message": message, "precision": "full", "source": "cuda"}
    f.update(kw)
    return f


def gpu(uuid: str = "GPU-0", index: int = 0, *, free: int | None = 10 * GiB,
        total: int | None = 16 * GiB, used: int | None = None, lost: bool = False,
        xids: Iterable[XidEvent] = (), **kw: Any) -> GpuSnapshot:
    if used is None and free is not None and total is not None:
        used = total - free
    return GpuSnapshot(uuid=uuid, index=index, pci_bus_id=f"0000:{0x40 + index:02x}:00.0",
                       memory_total_bytes=total, memory_free_bytes=free, memory_used_bytes=used,
                       lost=lost, xid_events=list(xids), **kw)


def reading(*gpus: GpuSnapshot, ok: bool = True, t: float = 0.0,
            error: str | None = None) -> GpuReading:
    return GpuReading(source="replay", ok=ok, gpus={g.uuid: g for g in gpus} if ok else {},
                      error=error, time=t)


LATENCY_LES = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def ttft_hist(latencies: Iterable[float], les: Sequence[float] = LATENCY_LES,
              base: dict | None = None) -> dict:
    """A cumulative TTFT histogram document of ``latencies`` (added to ``base`` if given)."""
    lat = list(latencies)
    counts = [sum(1 for x in lat if x <= le) for le in les] + [len(lat)]
    if base is not None:
        prev = [c for _, c in base["buckets"]]
        counts = [a + b for a, b in zip(counts, prev)]
    total_sum = sum(lat) + (base["sum"] if base else 0.0)
    return {"buckets": [(le, c) for le, c in zip(list(les) + ["+Inf"], counts)],
            "sum": total_sum, "count": counts[-1]}
