"""The controller's last readings: one object that the source jobs write and the loop, the
status document, the exporter and the actions read.

Built once, before the :class:`~inferctl.controller.actions.Actions` executor and the
:class:`~inferctl.controller.loop.Controller`, and handed to both at construction. Every field
is guarded by :attr:`ControllerState.lock` (re-entrant: the reconcile holds it while it calls
back into readers).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Iterable, Mapping

from inferctl.controller.types import EngineSnapshot, GpuReading, GpuSnapshot


class ControllerState:
    """The last engine snapshots and GPU reading, and what the reconcile has already seen.

    Args:
        engines: the configured engine names.
        engine_gpu: the configured GPU index of each engine (None: no GPU known), e.g. from
            ``{e.name: e.gpu for e in config.engines}``.

    ``latest``/``prev``: the last and the one before, per engine. ``reading``: the last GPU
    reading (impossible values already cleaned by the source job). Sequence numbers tell the
    reconcile which of them it has not seen yet (:meth:`take_engines`, :meth:`take_reading`).
    """

    def __init__(self, engines: Iterable[str], engine_gpu: Mapping[str, int | None] | None = None) -> None:
        names = list(engines)
        self.lock = threading.RLock()
        self.engine_gpu: dict[str, int | None] = dict(engine_gpu or {})
        self.latest: dict[str, EngineSnapshot] = {}
        self.prev: dict[str, EngineSnapshot] = {}
        self._seq: dict[str, int] = {n: 0 for n in names}
        self._done_seq: dict[str, int] = {n: 0 for n in names}
        self.reading: GpuReading | None = None
        # gpu_of's index -> snapshot map of one reading's ``gpus`` dict (that dict, its size, the map):
        # a scan per engine made the tick quadratic (1,024 engines x 256 GPUs)
        self._by_index: tuple[Any, int, dict[int, GpuSnapshot]] | None = None
        self._reading_seq = 0
        self._reading_done = 0

    @classmethod
    def for_config(cls, config: Any) -> "ControllerState":
        """The state for a :class:`~inferctl.controller.config.ControllerConfig`'s engines."""
        return cls([e.name for e in config.engines], {e.name: e.gpu for e in config.engines})

    # ------------------------------------------------------------------ writers (source jobs)
    def record_engine(self, name: str, snap: EngineSnapshot) -> EngineSnapshot | None:
        """Store a new snapshot of engine ``name``; returns the previous one (None: first)."""
        with self.lock:
            if name in self.latest:
                self.prev[name] = self.latest[name]
            self.latest[name] = snap
            self._seq[name] = self._seq.get(name, 0) + 1
            return self.prev.get(name)

    def record_reading(self, reading: GpuReading) -> GpuReading:
        """Store a new GPU reading and return it as stored: the Xid events of a previous
        reading that no reconcile has seen yet are carried into it (:func:`carry_xids`)."""
        with self.lock:
            if self.reading is not None and self._reading_seq != self._reading_done:
                reading = carry_xids(self.reading, reading)
            self.reading = reading
            self._reading_seq += 1
            return reading

    # ------------------------------------------------------------------ readers (reconcile)
    def take_reading(self) -> GpuReading | None:
        """The GPU reading if the reconcile has not seen it yet (then marked seen), else None."""
        with self.lock:
            if self.reading is None or self._reading_seq == self._reading_done:
                return None
            self._reading_done = self._reading_seq
            return self.reading

    def take_engines(self) -> list[tuple[str, EngineSnapshot]]:
        """The engines' snapshots that the reconcile has not seen yet (then marked seen)."""
        with self.lock:
            fresh = []
            for name, snap in self.latest.items():
                if self._seq.get(name, 0) == self._done_seq.get(name, 0):
                    continue
                self._done_seq[name] = self._seq.get(name, 0)
                fresh.append((name, snap))
            return fresh

    def telemetry_ok(self) -> bool:
        """Whether the last GPU reading is a good one."""
        reading = self.reading
        return bool(reading is not None and reading.ok)

    def known_gpu_indices(self) -> set[int]:
        """GPU indices the controller knows: those in the last GPU reading, plus the GPUs the
        configuration assigns engines to (so a GPU stays known while telemetry is down)."""
        with self.lock:
            found = {g for g in self.engine_gpu.values() if isinstance(g, int)}
            if self.reading is not None:
                found |= {s.index for s in self.reading.gpus.values() if isinstance(s.index, int)}
            return found

    def gpu_of(self, engine: str, reading: GpuReading | None = None) -> GpuSnapshot | None:
        """The snapshot of ``engine``'s configured GPU in ``reading`` (default: the last one);
        None when the engine has no GPU, telemetry is down or the GPU is not in the reading."""
        reading = self.reading if reading is None else reading
        index = self.engine_gpu.get(engine)
        if index is None or reading is None or not reading.ok:
            return None
        gpus = reading.gpus
        cached = self._by_index
        if cached is None or cached[0] is not gpus or cached[1] != len(gpus):
            by_index: dict[int, GpuSnapshot] = {}
            for snap in gpus.values():
                by_index.setdefault(snap.index, snap)   # the first one, as a scan finds it
            cached = self._by_index = (gpus, len(gpus), by_index)
        return cached[2].get(index)

    def gpu_index_of(self, uuid: str) -> int | None:
        """The index of the GPU with ``uuid`` in the last reading (None if unknown)."""
        reading = self.reading
        if reading is None:
            return None
        snap = reading.gpus.get(uuid)
        return None if snap is None else snap.index


def carry_xids(unseen: Any, reading: Any) -> Any:
    """``reading`` with the Xid events of ``unseen`` — the previous reading, which no reconcile
    has looked at — put before its own, per GPU uuid. A source delivers an Xid event once
    (NVML's event set is drained by the poll), so a reading replaced before the policies saw
    it must not take its Xids with it. The policies' deduplication drops repeats. Readings
    that are not ok carry nothing (telemetry down decides nothing)."""
    if not (getattr(unseen, "ok", False) and getattr(reading, "ok", False)):
        return reading
    old = getattr(unseen, "gpus", None)
    new = getattr(reading, "gpus", None)
    if not isinstance(old, dict) or not isinstance(new, dict):
        return reading
    gpus = dict(new)
    for uuid, snap in new.items():
        before = getattr(old.get(uuid), "xid_events", None) or []
        if before and isinstance(snap, GpuSnapshot):
            gpus[uuid] = dataclasses.replace(
                snap, xid_events=list(before) + [x for x in snap.xid_events if x not in before])
    return dataclasses.replace(reading, gpus=gpus)
