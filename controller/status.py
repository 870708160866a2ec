"""The ``/status`` document: the controller, every engine (last poll, memory, supervision, poll
job, policies), the GPUs (last reading, policies), the reset rails and the invalid samples.

Strict JSON data (``json_safe``: no NaN or infinity). ``None`` is "no data yet".
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from inferctl.controller.events import EventLog, json_safe
from inferctl.controller.policies.base import policy_state
from inferctl.controller.policies.hardware_state import standing_faults
from inferctl.controller.sources import Sources
from inferctl.controller.state import ControllerState
from inferctl.controller.types import EngineSnapshot


class StatusBuilder:
    """Builds the ``/status`` document from the controller's parts (all shared, read at call
    time: a policy or supervisor added to the mappings shows up)."""

    def __init__(self, *, state: ControllerState, sources: Sources, engines: Mapping[str, Any],
                 policies: Mapping[str, Mapping[str, Any]], gpu_policies: Mapping[str, Any],
                 supervisors: Mapping[str, Any], event_log: EventLog, resetter: Any, counter: Any,
                 clock: Callable[[], float], started_at: float) -> None:
        self.state = state
        self.sources = sources
        self.engines = engines
        self.policies = policies
        self.gpu_policies = gpu_policies
        self.supervisors = supervisors
        self.event_log = event_log
        self.resetter = resetter
        self.counter = counter
        self.clock = clock
        self.started_at = started_at
        #: the pause board (controller.pause.PauseBoard), set by the loop; None: no pause support
        self.pause: Any = None

    def build(self, *, ticks: int, running: bool, in_flight: Iterable[tuple[str, str]]) -> dict:
        """The document: ``{"controller", "engines", "gpus", "rails", "invalid_samples"}``."""
        now = self.clock()
        with self.state.lock:
            doc = {
                "controller": {"time": now, "started": self.started_at, "uptime_seconds": now - self.started_at,
                               "ticks": ticks, "last_event_id": self.event_log.last_id(),
                               "actions_in_flight": sorted(f"{a}:{t}" for a, t in in_flight),
                               "running": running},
                "engines": {name: self._engine(name, client, now) for name, client in self.engines.items()},
                "gpus": self._gpus(now),
                "rails": None if self.resetter is None else self.resetter.state(),
                "invalid_samples": None if self.counter is None else self.counter.snapshot(),
                "automation": None if self.pause is None else self.pause.state(now),
            }
        return json_safe(doc)

    def _engine(self, name: str, client: Any, now: float) -> dict:
        snap: EngineSnapshot | None = self.state.latest.get(name)
        sup = self.supervisors.get(name)
        none = snap is None
        return {
            "url": getattr(client, "base_url", None), "kind": getattr(client, "kind", None),
            "up": None if none else bool(snap.ok),
            "error": None if none else snap.error,
            "last_poll": None if none else snap.time,
            "model": None if none else snap.model,
            "precision": None if none else snap.precision,
            "draining": None if none else snap.draining,
            "running": None if none else snap.running,
            "waiting": None if none else snap.waiting,
            "kv_usage_ratio": None if none else snap.kv_usage_ratio,
            "memory": None if none else {
                "budget_bytes": snap.memory_budget_bytes,
                "allocated_bytes": snap.memory_allocated_bytes,
                "reserved_bytes": snap.memory_reserved_bytes,
                "free_bytes": snap.memory_free_bytes},
            "oom_total": None if none else snap.oom_total,
            "gpu": self.state.engine_gpu.get(name),
            "supervised": sup is not None,
            "pid": None if sup is None else sup.pid,
            "restarts": None if sup is None else sup.restarts,
            "poll": self.sources.jobs[f"engine:{name}"].state(),
            "policies": {k: policy_state(p, now) for k, p in self.policies.get(name, {}).items()},
            "routing": self._routing(name),
            **self._lifecycle(name, snap, sup),
        }

    def _lifecycle(self, name: str, snap: EngineSnapshot | None, sup: Any) -> dict:
        """``lifecycle`` (a launched engine's: ``starting``, ``running``, ``stopped``, ``down``, or
        the hold of a rolling action: ``draining``, ``restarting``, ``resetting``; None when not
        launched here) and ``routable`` (False when that, a drain the engine reports or the GPU's
        routing verdict keeps traffic away; None before the first poll and while the last poll
        failed: a poll that timed out on a busy engine is "no data", not a reason to take a
        serving replica out of rotation — the router's own ``/ready`` probe judges whether a
        replica answers). The router started with ``--controller`` reads both (router/probe.py)."""
        lifecycle = getattr(sup, "lifecycle", None) if sup is not None else None
        if lifecycle not in (None, "running") or not self._routing(name)["ready"]:
            routable: bool | None = False
        elif snap is None or not snap.ok:
            routable = None
        else:
            routable = snap.draining is not True
        return {"lifecycle": lifecycle, "routable": routable}

    def _routing(self, name: str) -> dict:
        """Whether the router may send this engine traffic, as the GPU policies judge its GPU:
        ``{"ready": bool, "reason": str | None, "gpu": uuid | None}`` (ready with no reason when
        no GPU policy knows the engine's GPU); :meth:`_lifecycle` folds it into ``routable``, which the
        router reads."""
        for pol in self.gpu_policies.values():
            verdicts = getattr(pol, "engine_routing", None)
            v = verdicts().get(name) if verdicts is not None else None
            if v is not None and not v["routable"]:
                return {"ready": False, "reason": v["reason"], "gpu": v["gpu"]}
        return {"ready": True, "reason": None, "gpu": None}

    def _gpus(self, now: float) -> dict:
        reading = self.state.reading
        source = self.sources.gpu_source
        return {
            "source": getattr(source, "name", None),
            "simulated": bool(getattr(source, "simulated", False)),
            "ok": None if reading is None else reading.ok,
            "error": None if reading is None else reading.error,
            "poll": self.sources.jobs["gpu"].state(),
            "devices": [] if reading is None else [
                {"index": g.index, "uuid": g.uuid, "name": g.name, "lost": g.lost,
                 "memory_total_bytes": g.memory_total_bytes, "memory_used_bytes": g.memory_used_bytes,
                 "memory_free_bytes": g.memory_free_bytes, "utilization_ratio": g.utilization_ratio,
                 "temperature_celsius": g.temperature_celsius, "health": g.health,
                 "ecc_uncorrected": g.ecc_uncorrected, "ecc_uncorrected_aggregate": g.ecc_uncorrected_aggregate,
                 "retired_pages_pending": g.retired_pages_pending, "remapped_rows_pending": g.remapped_rows_pending,
                 "remapped_rows_failure": g.remapped_rows_failure, "standing_faults": standing_faults(g),
                 "mig_enabled": g.mig_enabled,
                 "mig_instances": [{"gpu_instance_id": m.gpu_instance_id, "compute_instance_id": m.compute_instance_id,
                                    "profile": m.profile, "uuid": m.uuid, "memory_total_bytes": m.memory_total_bytes,
                                    "memory_used_bytes": m.memory_used_bytes, "memory_free_bytes": m.memory_free_bytes,
                                    "utilization_ratio": m.utilization_ratio} for m in g.mig_instances]}
                for g in sorted(reading.gpus.values(), key=lambda s: (s.index is None, s.index or 0))],
            "policies": {k: policy_state(p, now) for k, p in self.gpu_policies.items()},
        }
