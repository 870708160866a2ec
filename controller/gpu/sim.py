"""A simulated GPU whose memory is the bundled engine's own accounting.

Used where there is no NVIDIA driver (a laptop, CI), chosen by ``make_gpu_source("auto")`` with
a loud warning. One GPU, ``uuid="GPU-sim-0"``, ``name="inferctl simulated GPU"``:

- ``memory_total_bytes``    = the engine's ``memory.budget_bytes`` (its ``--memory-budget``)
- ``memory_used_bytes``     = the engine's ``memory.reserved_bytes`` (what its allocator holds)
- ``memory_free_bytes``     = total - used
- ``memory_reserved_bytes`` = 0 (there is no driver reserving anything)
- ``health="ok"`` always; no temperatures, power, clocks, ECC or Xid (``None``: no data).

When the engine cannot be read the reading is ``ok=False`` (no memory numbers), exactly like a
real sensor being down.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import httpx

from inferctl.controller.scrape.http import bounded_request
from inferctl.controller.gpu.base import GpuSource, down_reading
from inferctl.controller.types import GpuReading, GpuSnapshot

log = logging.getLogger(__name__)

SIM_UUID = "GPU-sim-0"
SIM_NAME = "inferctl simulated GPU"


class SimGpuSource(GpuSource):
    """``engine_stats_url``: the engine's ``/stats`` URL (e.g. ``http://127.0.0.1:8000/stats``),
    or ``stats_fn``: a callable returning the ``/stats`` dict (tests, in-process use; a callable
    passed as the first argument is taken as ``stats_fn``). Exactly one is required
    (``ValueError`` otherwise)."""

    name = "sim"
    simulated = True
    OPTIONS = ("engine_stats_url", "stats_fn", "timeout_s", "transport")

    def __init__(self, engine_stats_url: str | Callable[[], dict[str, Any]] | None = None, *,
                 stats_fn: Callable[[], dict[str, Any]] | None = None, timeout_s: float = 2.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        if callable(engine_stats_url) and stats_fn is None:
            engine_stats_url, stats_fn = None, engine_stats_url
        if (engine_stats_url is None) == (stats_fn is None):
            raise ValueError("simulated GPU needs exactly one of engine_stats_url or stats_fn")
        self._url = engine_stats_url
        self._fn = stats_fn
        self.timeout_s = float(timeout_s)
        self._client = httpx.Client(timeout=timeout_s, transport=transport) if engine_stats_url else None

    @property
    def engine_stats_url(self) -> str | None:
        """The engine ``/stats`` URL this source reads (None with ``stats_fn``)."""
        return self._url

    def _stats(self) -> dict[str, Any]:
        if self._fn is not None:
            return self._fn()
        if self._client is None or self._url is None:
            raise RuntimeError("simulated GPU has neither stats_fn nor engine_stats_url")
        resp = bounded_request(self._client, "GET", self._url, deadline_s=self.timeout_s)
        resp.raise_for_status()
        doc = resp.json()
        if not isinstance(doc, dict):
            raise ValueError("/stats body is not a JSON object")
        return doc

    def poll(self, now: float) -> GpuReading:
        try:
            stats = self._stats()
        except Exception as exc:  # any failure to read the engine is "telemetry down"
            return down_reading(self.name, now, f"simulated GPU: engine stats unavailable "
                                                f"({type(exc).__name__}: {exc})")
        mem = stats.get("memory") if isinstance(stats, dict) else None
        total = _nonneg_int(mem, "budget_bytes")
        used = _nonneg_int(mem, "reserved_bytes")
        if total is None or used is None:
            return down_reading(self.name, now, "simulated GPU: engine /stats lacks "
                                                "memory.budget_bytes or memory.reserved_bytes")
        snap = GpuSnapshot(uuid=SIM_UUID, index=0, name=SIM_NAME, time=now,
                           memory_total_bytes=total, memory_used_bytes=used,
                           memory_free_bytes=max(total - used, 0), memory_reserved_bytes=0,
                           health="ok", mig_enabled=False)
        return GpuReading(source=self.name, ok=True, gpus={SIM_UUID: snap}, time=now)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _nonneg_int(d: Any, key: str) -> int | None:
    if not isinstance(d, dict):
        return None
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        return None
    if isinstance(v, float) and v == float("inf"):
        return None
    return int(v)
