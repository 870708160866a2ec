"""What the drill records and measures: one request (:class:`RequestRecord`), one ``/stats``
poll (:class:`Sample`), and the whole run (:class:`DrillReport`, its summary numbers and JSON)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from inferctl.tools.drill.config import PHASES


@dataclass
class RequestRecord:
    """One request of the load. Times are ``time.time()`` seconds; ``first``/``end`` None
    when not reached. ``outcome``: ok, failed, lost."""

    id: int
    client: int
    phase: str
    kind: str                 # long | short
    start: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    token_times: list[float] = field(default_factory=list, repr=False)
    status: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    outcome: str = "lost"

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass
class Sample:
    """One poll of the engine's ``/stats`` (and the controller's precision policy state)."""

    t: float                          # when the answer arrived
    precision: str | None
    policy_state: str | None
    budget_bytes: int | None
    allocated_bytes: int | None
    reserved_bytes: int | None
    kv_usage_ratio: float | None
    running: int | None
    waiting: int | None
    oom_total: int | None
    phase: str


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    vals = sorted(values)
    if not vals:
        return None
    pos = (len(vals) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


# ------------------------------------------------------------------------------- report
@dataclass
class DrillReport:
    """What the drill measured (``to_dict`` is the JSON report)."""

    engine_url: str
    controller_url: str
    model: str | None
    started: float
    ended: float
    config: dict
    phases: list[tuple[str, float]]
    requests: list[RequestRecord]
    samples: list[Sample]
    events: list[dict]
    oom: dict | None                 # {"time", "source", "kind", "id", "injected": bool}
    int8_seen: float | None          # first /stats answer reporting int8 after the OOM
    full_seen: float | None          # first /stats answer reporting full after int8_seen
    recovery_start: float | None
    final_precision: str | None
    notes: list[str] = field(default_factory=list)
    stack: dict = field(default_factory=dict)

    # -- derived
    def first_int8_token(self) -> float | None:
        if self.int8_seen is None:
            return None
        after = [t for r in self.requests for t in r.token_times if t >= self.int8_seen]
        return min(after) if after else None

    def decision_time(self) -> float | None:
        for e in self.events:
            if e.get("kind") == "transition" and e.get("source") == "precision" and \
                    (e.get("outcome") or {}).get("action") == "degrade":
                return e.get("time")
        return None

    def rollback_event_time(self) -> float | None:
        for e in self.events:
            if e.get("kind") == "transition" and e.get("source") == "precision" and \
                    (e.get("outcome") or {}).get("action") == "rollback":
                return e.get("time")
        return None

    def counts(self) -> dict:
        out = {"total": len(self.requests), "ok": 0, "failed": 0, "lost": 0}
        for r in self.requests:
            out[r.outcome] = out.get(r.outcome, 0) + 1
        return out

    def summary(self) -> dict:
        """The numbers of the summary table (seconds; None = no data)."""
        oom_t = self.oom["time"] if self.oom else None
        fit = self.first_int8_token()
        dec = self.decision_time()
        c = self.counts()
        lat = {}
        for ph in PHASES:
            ls = [r.latency for r in self.requests if r.phase == ph and r.outcome == "ok" and r.latency is not None]
            lat[ph] = {"requests": sum(1 for r in self.requests if r.phase == ph),
                       "p50_seconds": percentile(ls, 50), "p99_seconds": percentile(ls, 99)}
        kinds: dict[str, int] = {}
        for e in self.events:
            kinds[e.get("kind", "?")] = kinds.get(e.get("kind", "?"), 0) + 1
        ok = (c["failed"] == 0 and c["lost"] == 0 and self.oom is not None and self.int8_seen is not None
              and self.full_seen is not None and self.final_precision == "full")
        return {
            "ok": ok,
            "oom_source": None if self.oom is None else self.oom.get("source"),
            "oom_kind": None if self.oom is None else self.oom.get("kind"),
            "oom_injected_by_drill": None if self.oom is None else self.oom.get("injected"),
            "switch_latency_seconds": None if oom_t is None or fit is None else fit - oom_t,
            "oom_to_decision_seconds": None if oom_t is None or dec is None else dec - oom_t,
            "oom_to_int8_reported_seconds": None if oom_t is None or self.int8_seen is None else self.int8_seen - oom_t,
            "rollback_seconds_from_int8": (None if self.int8_seen is None or self.full_seen is None
                                           else self.full_seen - self.int8_seen),
            "rollback_seconds_from_recovery": (None if self.recovery_start is None or self.full_seen is None
                                               else self.full_seen - self.recovery_start),
            "rolled_back": self.full_seen is not None,
            "final_precision": self.final_precision,
            "requests": c,
            "latency_by_phase": lat,
            "events": kinds,
            "oom_faults_seen": max((s.oom_total or 0) for s in self.samples) if self.samples else None,
            "duration_seconds": self.ended - self.started,
        }

    def to_dict(self) -> dict:
        return {
            "summary": self.summary(), "engine_url": self.engine_url, "controller_url": self.controller_url,
            "model": self.model, "started": self.started, "ended": self.ended, "config": self.config,
            "stack": self.stack, "notes": self.notes, "oom": self.oom, "int8_seen": self.int8_seen,
            "full_seen": self.full_seen, "recovery_start": self.recovery_start,
            "phases": [{"phase": p, "start": t} for p, t in self.phases],
            "events": self.events,
            "samples": [asdict(s) for s in self.samples],
            "requests": [{k: v for k, v in asdict(r).items() if k != "token_times"} | {"latency": r.latency}
                         for r in self.requests],
        }

