"""``inferctl drill fleet``: the request records, per-replica share over time and the verdict.

Pure functions over what the load recorded (no I/O): :func:`summarize` gives the summary
``inferctl drill fleet --json`` prints, :func:`share_over_time` the per-replica share the plot
draws (from the router's ``X-Inferctl-Replica`` response header).

A request's *phase* for failure counting is the phase in which it ended (a failure happens when
it ends); a request never answered (``end`` None when the load stopped) is *lost*.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

#: The drill's phases in order: warm-up load, one replica switched to int8, one restarted
#: through the controller's rolling path, one SIGKILLed, then load on the survivors.
FLEET_PHASES = ("baseline", "degrade", "restart", "kill")


@dataclass
class FleetRequest:
    """One client request through the router.

    ``start``/``end``: ``time.time()`` seconds (``end`` None = never answered: lost);
    ``stream``: SSE or not; ``started``: a first data chunk arrived (streams);
    ``replica``: the router's ``X-Inferctl-Replica`` header (None without an answer);
    ``ok``: 200 and a complete answer; ``error``: why not (None when ok).
    """

    rid: int
    stream: bool
    start: float
    end: float | None = None
    ok: bool = False
    started: bool = False
    replica: str | None = None
    error: str | None = None


@dataclass
class PhaseMark:
    """A phase's start (``time.time()`` s), its name, and what the drill did (the target replica,
    the action's answer)."""

    name: str
    t: float
    target: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def phase_at(marks: list[PhaseMark], t: float) -> str:
    """The phase in force at ``t``: the last mark at or before ``t`` (the first phase before any)."""
    name = marks[0].name if marks else FLEET_PHASES[0]
    for m in marks:
        if m.t <= t:
            name = m.name
    return name


def share_over_time(requests: list[FleetRequest], t0: float, bin_seconds: float = 1.0) -> dict[str, Any]:
    """Answered requests per replica per time bin, by end time.

    Returns ``{"bin_seconds": b, "t": [bin start - t0, ...], "replicas": {name: [share 0..1 or
    None, ...]}, "counts": {name: [n, ...]}}``; a bin with no answered request has share None
    (no data, not 0). Raises ValueError for ``bin_seconds`` <= 0.
    """
    if not bin_seconds > 0:
        raise ValueError(f"bin_seconds: must be > 0, got {bin_seconds}")
    done = [r for r in requests if r.end is not None and r.replica]
    if not done:
        return {"bin_seconds": bin_seconds, "t": [], "replicas": {}, "counts": {}}
    nbins = max(0, int((max(r.end for r in done) - t0) / bin_seconds)) + 1
    names = sorted({r.replica for r in done})
    counts = {n: [0] * nbins for n in names}
    for r in done:
        counts[r.replica][max(0, int((r.end - t0) / bin_seconds))] += 1
    totals = [sum(counts[n][i] for n in names) for i in range(nbins)]
    shares = {n: [(counts[n][i] / totals[i]) if totals[i] else None for i in range(nbins)] for n in names}
    return {"bin_seconds": bin_seconds, "t": [i * bin_seconds for i in range(nbins)], "replicas": shares,
            "counts": counts}


def started_on(requests: list[FleetRequest], replica: str, t: float) -> list[FleetRequest]:
    """The streams ``replica`` had already started at ``t``: streams in flight at ``t`` (begun
    before, not ended before) whose answer came from ``replica``. The router sends a stream's
    status and ``X-Inferctl-Replica`` header only after the replica's first body byte
    (docs/router.md "Retries"), and a killed replica sends nothing after ``t``, so a stream
    carrying its name and in flight at the kill had its first byte before the kill."""
    return [r for r in requests if r.stream and r.replica == replica and r.start < t
            and (r.end is None or r.end >= t)]


def summarize(requests: list[FleetRequest], marks: list[PhaseMark], *, killed: str | None, t0: float,
              bin_seconds: float = 1.0) -> dict[str, Any]:
    """The drill's summary and verdict.

    ``killed``: the SIGKILLed replica's name (the ``kill`` mark's instant is the kill);
    ``killed_started_streams`` in the result: :func:`started_on` at the kill (None: no kill).

    Keys: ``requests``, ``failed``, ``lost``, ``by_phase`` {phase: {requests, failed, lost}} (by
    end phase; lost by start phase), ``killed_replica``, ``killed_started_streams``,
    ``kill_failures_attributable`` (kill-phase failures that were started streams on the killed
    replica), ``kill_failures_other``, ``by_replica`` {name: answered}, ``share``
    (:func:`share_over_time`), ``errors`` (up to 5 distinct error texts), ``phases``, ``ok``, and
    ``verdict`` (why not ok). ``ok``: nothing lost, 0 failed in every phase but the kill phase,
    and in the kill phase only started streams of the killed replica failed, no more of them
    than it had started.
    """
    by_phase: dict[str, dict[str, int]] = {p: {"requests": 0, "failed": 0, "lost": 0} for p in FLEET_PHASES}
    attributable = other = 0
    kill_t = next((m.t for m in marks if m.name == "kill"), None)
    cut = [] if killed is None or kill_t is None else started_on(requests, killed, kill_t)
    cut_ids = {r.rid for r in cut}
    killed_started_streams = None if kill_t is None or killed is None else len(cut)
    for r in requests:
        if r.end is None:
            by_phase.setdefault(phase_at(marks, r.start), {"requests": 0, "failed": 0, "lost": 0})["lost"] += 1
            continue
        ph = by_phase.setdefault(phase_at(marks, r.end), {"requests": 0, "failed": 0, "lost": 0})
        ph["requests"] += 1
        if not r.ok:
            ph["failed"] += 1
            if phase_at(marks, r.end) == "kill":
                if r.rid in cut_ids:
                    attributable += 1
                else:
                    other += 1
    failed = sum(p["failed"] for p in by_phase.values())
    lost = sum(p["lost"] for p in by_phase.values())
    reasons = []
    if lost:
        reasons.append(f"{lost} request(s) lost (never answered)")
    for p, v in by_phase.items():
        if p != "kill" and v["failed"]:
            reasons.append(f"{v['failed']} request(s) failed in the {p} phase")
    if other:
        reasons.append(f"{other} kill-phase failure(s) not a stream the killed replica had started")
    if killed_started_streams is not None and attributable > killed_started_streams:
        reasons.append(f"{attributable} kill-phase failures > {killed_started_streams} streams the killed replica"
                       " had started")
    names = [m.name for m in marks]
    missing = [p for p in FLEET_PHASES if p not in names]
    if missing:
        reasons.append(f"phase(s) not run: {', '.join(missing)}")
    return {
        "requests": sum(1 for r in requests), "answered": sum(1 for r in requests if r.end is not None),
        "failed": failed, "lost": lost, "by_phase": by_phase,
        "killed_replica": killed, "killed_started_streams": killed_started_streams,
        "kill_failures_attributable": attributable, "kill_failures_other": other,
        "by_replica": dict(sorted(Counter(r.replica for r in requests if r.end is not None and r.replica).items())),
        "share": share_over_time(requests, t0, bin_seconds),
        "errors": sorted({r.error for r in requests if r.error})[:5],
        "phases": [asdict(m) | {"t": round(m.t - t0, 3)} for m in marks],
        "ok": not reasons, "verdict": "; ".join(reasons) or "ok",
    }
