"""``inferctl drill oom``: a scripted game day for the OOM → int8 → rollback flow.

Against a running stack (``--url`` of a controller) or one it starts itself (``inferctl up``
with a tight memory budget), the drill:

1. **baseline** — a few clients send short Gutenberg passages (streaming ``/v1/completions``)
   for ``baseline_seconds``; the engine must be in full precision.
2. **pressure** — every client sends long passages (long prompts → long-context prefill
   chunks → bigger step activations) until the engine records an OOM (``/stats``
   ``faults``). A real OOM is the goal; if none comes within ``pressure_seconds`` the drill
   injects one (``POST /admin/fault``, engine admin token) and says so (``oom.source``).
3. **switch** — the controller must see the fault and switch the engine to int8; the load
   goes on for ``int8_seconds`` after the engine reports int8.
4. **recovery** — pressure stops (baseline load only); memory recovers and, after the
   precision policy's hold, the controller rolls back to full precision.
5. **after** — baseline load in full precision for ``after_seconds``; then the load stops and
   every request in flight is waited for.

Every request's outcome is recorded (:class:`RequestRecord`): a non-200 answer, an error
event in the stream, a stream that ends without a finish reason, a transport error or a
request still unanswered at the end are failures (the last kind "lost"). ``/stats``
(engine) is polled every ``poll_seconds``, ``/status`` and ``/events`` (controller) a little
less often.

Measures (:class:`DrillReport`): **switch latency** = the first token received after the
first ``/stats`` answer that reports int8, minus the OOM fault's time (an upper bound: the
switch happened at or before that answer; resolution ~ one poll + one step); also OOM →
degrade decision (controller event) and OOM → int8 reported; **rollback time** = int8
reported → full reported again, and recovery start → full; failed and lost requests;
latency P50/P99 per phase; the controller's events. Output: a live rich view while it runs,
a summary table (or JSON with ``--json``), the full report as JSON and a PNG plot of mode,
memory and latency over time (matplotlib, Agg).

Exit code: 0 when no request failed or was lost, an OOM happened, the engine switched to
int8 and came back to full precision; 1 otherwise; 2 for bad usage.

The controller reaches the engine over HTTP only (it never imports ``engine``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from inferctl.controller.longtext import LongTextError, read_book

PHASES = ("baseline", "pressure", "int8", "recovery", "after")

#: The stack ``drill oom`` starts for stories260K when no ``--url`` is given: a memory budget
#: and engine limits measured on the real engine (tests/test_up_e2e.py) so that 16 concurrent
#: ~400-token prompts run out of memory in full precision and fit in int8: int8 weights
#: 284,496 B + KV pool 200 blocks × 20,480 B + the int8 run's peak step activations (~4.27 MB)
#: + ~106 KB; full precision needs 755,632 B more for its weights.
STORIES_BUDGET = 8_760_000
STORIES_ENGINE_ARGS = ["--max-num-batched-tokens", "128", "--num-kv-blocks", "200", "--max-num-seqs", "16",
                       "--max-model-len", "512"]


class DrillError(RuntimeError):
    """The drill could not run (stack not reachable, no data, bad option)."""


# ------------------------------------------------------------------------------ settings
@dataclass
class DrillConfig:
    """Settings of one drill (seconds, characters, counts).

    Raises:
        DrillError: a value out of range (the message names it).
    """

    clients: int = 16
    baseline_clients: int = 2
    long_chars: int = 660         # ~400 tokens of English for a 512-token vocabulary
    short_chars: int = 120
    max_tokens: int = 32
    baseline_seconds: float = 3.0
    pressure_seconds: float = 30.0
    int8_seconds: float = 2.0
    recovery_seconds: float = 90.0
    after_seconds: float = 3.0
    poll_seconds: float = 0.1
    request_timeout: float = 120.0
    inject_fallback: bool = True
    seed: int = 1234

    def __post_init__(self) -> None:
        for name in ("clients", "baseline_clients", "long_chars", "short_chars", "max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DrillError(f"{name}: must be an integer >= 1, got {v!r}")
        if self.baseline_clients > self.clients:
            raise DrillError(f"baseline_clients: must be <= clients ({self.clients}), got {self.baseline_clients}")
        for name in ("baseline_seconds", "pressure_seconds", "int8_seconds", "recovery_seconds", "after_seconds",
                     "poll_seconds", "request_timeout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise DrillError(f"{name}: must be a number >= 0, got {v!r}")
        if self.poll_seconds <= 0 or self.request_timeout <= 0:
            raise DrillError("poll_seconds and request_timeout must be > 0")


# --------------------------------------------------------------------------------- data
def load_passages(data: str | Path, long_chars: int, short_chars: int, encoding: str = "auto",
                  limit: int = 4000) -> tuple[list[str], list[str]]:
    """Long and short passages from every ``*.txt`` under ``data`` (a folder or one file),
    decoded with :func:`controller.longtext.read_book` (Gutenberg header/licence stripped),
    cut at word boundaries. Returns ``(long, short)``, each at most ``limit`` passages.

    Raises:
        DrillError: no ``.txt`` file, or a file that does not decode (the message names the
            file and the ``--encoding`` option).
    """
    p = Path(data)
    files = sorted(p.glob("*.txt")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise DrillError(f"--data: no .txt files in {p}")
    longs: list[str] = []
    shorts: list[str] = []
    per_file = limit // len(files) + 1
    for f in files:
        try:
            text = read_book(f, encoding).text
        except LongTextError as exc:
            raise DrillError(f"--data: {exc}") from None
        words = re.sub(r"\s+", " ", text).split(" ")
        for size, out in ((long_chars, longs), (short_chars, shorts)):
            cur: list[str] = []
            n = made = 0
            for w in words:
                cur.append(w)
                n += len(w) + 1
                if n - 1 >= size:
                    out.append(" ".join(cur))
                    cur, n, made = [], 0, made + 1
                    if made >= per_file:
                        break
    if not longs or not shorts:
        raise DrillError(f"--data: the texts in {p} are too short for passages of {long_chars} characters")
    return longs[:limit], shorts[:limit]


# ------------------------------------------------------------------------------ records
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


# ------------------------------------------------------------------------------ the run
class DrillRun:
    """The state of one drill while it runs (owned by one event loop): the load clients
    (:meth:`client`), the pollers (:meth:`poll_engine`, :meth:`poll_controller`), the script
    (:meth:`script`). Also used by ``bench/oom_switch.py`` to repeat the switch."""

    def __init__(self, engine_url: str, controller_url: str, model: str, token: str | None,
                 longs: list[str], shorts: list[str], cfg: DrillConfig, engine_name: str | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.engine_url = engine_url.rstrip("/")
        self.controller_url = controller_url.rstrip("/")
        self.model = model
        self.token = token
        self.longs, self.shorts = longs, shorts
        self.cfg = cfg
        self.engine_name = engine_name
        self.clock = clock
        self.rng = random.Random(cfg.seed)
        self.phase = "baseline"
        self.phases: list[tuple[str, float]] = []
        self.load = "baseline"             # baseline | pressure | stop
        self.requests: list[RequestRecord] = []
        self.samples: list[Sample] = []
        self.events: list[dict] = []
        self.last_event_id: int | None = None
        self.policy_state: str | None = None
        self.oom: dict | None = None
        self.oom_baseline_total: int | None = None
        self.int8_seen: float | None = None
        self.full_seen: float | None = None
        self.recovery_start: float | None = None
        self.notes: list[str] = []
        self.stop_polling = False
        self._next_id = 0

    def reset_oom_tracking(self) -> None:
        """Forget the last OOM/int8/full instants: the next new fault starts a new cycle
        (benchmarks that repeat the switch)."""
        self.oom = None
        self.oom_baseline_total = self.samples[-1].oom_total if self.samples else None
        self.int8_seen = self.full_seen = None

    def set_phase(self, name: str) -> None:
        self.phase = name
        self.phases.append((name, self.clock()))

    # -- load
    async def client(self, idx: int, http: Any) -> None:
        while self.load != "stop":
            active = self.cfg.clients if self.load == "pressure" else self.cfg.baseline_clients
            if idx >= active:
                await asyncio.sleep(0.05)
                continue
            long = self.load == "pressure"
            prompt = self.rng.choice(self.longs if long else self.shorts)
            await self.one(idx, http, prompt, "long" if long else "short")

    async def one(self, idx: int, http: Any, prompt: str, kind: str) -> None:
        import httpx

        rec = RequestRecord(id=self._next_id, client=idx, phase=self.phase, kind=kind, start=self.clock())
        self._next_id += 1
        self.requests.append(rec)
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.cfg.max_tokens, "temperature": 0,
                "stream": True}
        try:
            async with http.stream("POST", f"{self.engine_url}/v1/completions", json=body,
                                   timeout=self.cfg.request_timeout) as r:
                rec.status = r.status_code
                if r.status_code != 200:
                    text = (await r.aread()).decode("utf-8", "replace")
                    rec.error = f"HTTP {r.status_code}: {text[:200]}"
                    rec.outcome, rec.end = "failed", self.clock()
                    return
                done = False
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    try:
                        doc = json.loads(data)
                    except ValueError:
                        rec.error = f"bad SSE chunk: {data[:100]}"
                        continue
                    if "error" in doc:
                        rec.error = str((doc["error"] or {}).get("message"))
                        continue
                    now = self.clock()
                    for ch in doc.get("choices") or []:
                        if ch.get("text"):
                            rec.tokens += 1
                            rec.token_times.append(now)
                            if rec.first is None:
                                rec.first = now
                        if ch.get("finish_reason"):
                            rec.finish_reason = ch["finish_reason"]
                rec.end = self.clock()
                if rec.error is None and done and rec.finish_reason in ("stop", "length"):
                    rec.outcome = "ok"
                else:
                    rec.outcome = "failed"
                    rec.error = rec.error or (f"finish_reason {rec.finish_reason}" if rec.finish_reason
                                              else "stream ended without a finish reason")
        except (httpx.HTTPError, OSError) as exc:
            rec.end = self.clock()
            rec.outcome = "lost" if isinstance(exc, httpx.TimeoutException) else "failed"
            rec.error = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            rec.error = "cancelled at the end of the drill (no answer)"
            rec.outcome = "lost"
            raise

    # -- observation
    async def poll_engine(self, http: Any) -> None:
        while not self.stop_polling:
            t0 = self.clock()
            try:
                r = await http.get(f"{self.engine_url}/stats", timeout=2.0)
                doc = r.json() if r.status_code == 200 else None
            except Exception:  # noqa: BLE001 - a missed poll is a gap in the timeline
                doc = None
            if doc is not None:
                self._sample(doc)
            await asyncio.sleep(max(0.0, self.cfg.poll_seconds - (self.clock() - t0)))

    def _sample(self, doc: dict) -> None:
        now = self.clock()
        eng, mem = doc.get("engine") or {}, doc.get("memory") or {}
        kv, sch, faults = doc.get("kv_cache") or {}, doc.get("scheduler") or {}, doc.get("faults") or {}
        prec = eng.get("precision")
        s = Sample(t=now, precision=prec, policy_state=self.policy_state, budget_bytes=mem.get("budget_bytes"),
                   allocated_bytes=mem.get("allocated_bytes"), reserved_bytes=mem.get("reserved_bytes"),
                   kv_usage_ratio=kv.get("usage_ratio"), running=sch.get("running"), waiting=sch.get("waiting"),
                   oom_total=faults.get("oom_total"), phase=self.phase)
        self.samples.append(s)
        if self.oom_baseline_total is None and s.oom_total is not None:
            self.oom_baseline_total = s.oom_total
        if self.oom is None and s.oom_total is not None and self.oom_baseline_total is not None \
                and s.oom_total > self.oom_baseline_total:
            recent = [f for f in faults.get("recent") or [] if isinstance(f, dict)]
            new = recent[-(s.oom_total - self.oom_baseline_total):] if recent else []
            f = min(new, key=lambda x: x.get("time") or now) if new else {}
            self.oom = {"time": f.get("time") or now, "source": f.get("source"), "kind": f.get("kind"),
                        "id": f.get("id"), "message": f.get("message"), "requested_bytes": f.get("requested_bytes"),
                        "free_bytes": f.get("free_bytes"), "injected": False}
        if self.oom is not None and self.int8_seen is None and prec == "int8":
            self.int8_seen = now
        if self.int8_seen is not None and self.full_seen is None and prec == "full":
            self.full_seen = now

    async def poll_controller(self, http: Any) -> None:
        while not self.stop_polling:
            try:
                r = await http.get(f"{self.controller_url}/status", timeout=2.0)
                if r.status_code == 200:
                    engines = (r.json().get("engines") or {})
                    e = engines.get(self.engine_name) if self.engine_name else next(iter(engines.values()), None)
                    pol = ((e or {}).get("policies") or {}).get("precision") or {}
                    self.policy_state = pol.get("state")
                await self.fetch_events(http)
            except Exception:  # noqa: BLE001 - a missed poll is a gap
                pass
            await asyncio.sleep(max(0.25, self.cfg.poll_seconds * 3))

    async def fetch_events(self, http: Any) -> None:
        params: dict[str, Any] = {"limit": 1000}
        if self.last_event_id is not None:
            params["since_id"] = self.last_event_id
        r = await http.get(f"{self.controller_url}/events", params=params, timeout=2.0)
        if r.status_code != 200:
            return
        doc = r.json()
        rows = doc.get("events") or []
        if self.last_event_id is None:
            # the first fetch sets the starting point: only events of this drill are kept
            self.last_event_id = max([e.get("id", 0) for e in rows] + [doc.get("last_id") or 0])
            return
        for e in rows:
            self.events.append(e)
            self.last_event_id = max(self.last_event_id, e.get("id", 0))

    async def inject(self, http: Any) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        r = await http.post(f"{self.engine_url}/admin/fault", json={"kind": "oom", "count": 1}, headers=headers,
                            timeout=5.0)
        if r.status_code != 200:
            raise DrillError(f"no OOM under pressure within {self.cfg.pressure_seconds:g} s, and the fallback "
                             f"POST {self.engine_url}/admin/fault answered HTTP {r.status_code}: {r.text[:200]} "
                             "(pass --token with the engine's admin token)")

    # -- the script
    async def wait_for(self, cond: Callable[[], bool], timeout: float) -> bool:
        deadline = self.clock() + timeout
        while self.clock() < deadline:
            if cond():
                return True
            await asyncio.sleep(0.05)
        return cond()

    async def script(self, http: Any) -> None:
        cfg = self.cfg
        await self.fetch_events(http)
        self.set_phase("baseline")
        await asyncio.sleep(cfg.baseline_seconds)
        if self.samples and self.samples[-1].precision not in ("full", None):
            self.notes.append(f"the engine was in {self.samples[-1].precision} before the drill")
        self.set_phase("pressure")
        self.load = "pressure"
        got = await self.wait_for(lambda: self.oom is not None, cfg.pressure_seconds)
        if not got:
            if not cfg.inject_fallback:
                self.notes.append(f"no OOM within {cfg.pressure_seconds:g} s of pressure (no injection asked)")
                return
            self.notes.append(f"no OOM within {cfg.pressure_seconds:g} s of pressure: the drill injected one "
                              "(POST /admin/fault); the switch is measured from that fault")
            await self.inject(http)
            if not await self.wait_for(lambda: self.oom is not None, 15.0):
                self.notes.append("the injected OOM never showed in /stats")
                return
            self.oom["injected"] = True
        if not await self.wait_for(lambda: self.int8_seen is not None, 30.0):
            self.notes.append("the engine did not switch to int8 within 30 s of the OOM")
            return
        self.set_phase("int8")
        await asyncio.sleep(cfg.int8_seconds)
        self.set_phase("recovery")
        self.load = "baseline"
        self.recovery_start = self.clock()
        if not await self.wait_for(lambda: self.full_seen is not None, cfg.recovery_seconds):
            self.notes.append(f"no rollback to full precision within {cfg.recovery_seconds:g} s of the "
                              "pressure ending")
            return
        self.set_phase("after")
        await asyncio.sleep(cfg.after_seconds)


async def _drive(run: DrillRun, live: Callable[[DrillRun], None] | None) -> None:
    import httpx

    limits = httpx.Limits(max_connections=run.cfg.clients + 8, max_keepalive_connections=run.cfg.clients + 8)
    async with httpx.AsyncClient(limits=limits, timeout=run.cfg.request_timeout) as http:
        pollers = [asyncio.create_task(run.poll_engine(http)), asyncio.create_task(run.poll_controller(http))]
        clients = [asyncio.create_task(run.client(i, http)) for i in range(run.cfg.clients)]
        viewer = None
        if live is not None:
            async def view() -> None:
                while True:
                    live(run)
                    await asyncio.sleep(0.25)
            viewer = asyncio.create_task(view())
        try:
            await run.script(http)
        finally:
            run.load = "stop"
            # let in-flight requests finish (they count as lost if they never do)
            done, pending = await asyncio.wait(clients, timeout=run.cfg.request_timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await asyncio.sleep(max(0.3, 2 * run.cfg.poll_seconds))
            try:
                await run.fetch_events(http)
            except Exception:  # noqa: BLE001
                pass
            run.stop_polling = True
            await asyncio.gather(*pollers, return_exceptions=True)
            if viewer is not None:
                viewer.cancel()
                await asyncio.gather(viewer, return_exceptions=True)
                live(run)


def run_drill(engine_url: str, controller_url: str, *, longs: list[str], shorts: list[str],
              config: DrillConfig, token: str | None = None, model: str | None = None,
              engine_name: str | None = None, live: Callable[[Any], None] | None = None) -> DrillReport:
    """Run the drill against a running engine and controller; returns the report.

    ``live(run)`` is called ~4 times a second with the running state (for a rich view).
    Raises:
        DrillError: the engine or controller cannot be reached, or the fallback injection
            was refused.
    """
    import httpx

    try:
        with httpx.Client(timeout=5.0) as c:
            models = c.get(f"{engine_url.rstrip('/')}/v1/models").json().get("data") or []
            c.get(f"{controller_url.rstrip('/')}/status").raise_for_status()
    except (httpx.HTTPError, ValueError) as exc:
        raise DrillError(f"stack not reachable (engine {engine_url}, controller {controller_url}): {exc}") from None
    if model is None:
        if not models:
            raise DrillError(f"{engine_url}/v1/models lists no model")
        model = str(models[0].get("id"))
    run = DrillRun(engine_url, controller_url, model, token, longs, shorts, config, engine_name)
    started = time.time()
    asyncio.run(_drive(run, live))
    final = run.samples[-1].precision if run.samples else None
    return DrillReport(engine_url=run.engine_url, controller_url=run.controller_url, model=model,
                       started=started, ended=time.time(), config=asdict(config), phases=run.phases,
                       requests=run.requests, samples=run.samples, events=run.events, oom=run.oom,
                       int8_seen=run.int8_seen, full_seen=run.full_seen, recovery_start=run.recovery_start,
                       final_precision=final, notes=run.notes)


# ------------------------------------------------------------------------------ the stack
@dataclass
class Stack:
    """An ``inferctl up`` the drill started (stopped by :meth:`stop`)."""

    proc: subprocess.Popen
    engine_url: str
    controller_url: str
    token: str
    workdir: Path
    log: Path

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stack_config(model: str | None, workdir: Path, memory_budget: str | None, engine_args: list[str] | None,
                 hold_seconds: float, poll_seconds: float) -> dict:
    """The controller configuration of the stack the drill starts: one launched bundled engine
    (the stories260K calibration when the model is stories260K and nothing else is given),
    the simulated GPU, the precision policy with a short hold, fast polls."""
    is_stories = model is not None and Path(model).name == "stories260K.bin"
    budget = memory_budget or (str(STORIES_BUDGET) if is_stories else None)
    args = list(engine_args) if engine_args else (list(STORIES_ENGINE_ARGS) if is_stories else [])
    launch: dict[str, Any] = {"port": _free_port(), "args": args, "health_timeout_seconds": 120}
    if model:
        launch["model"] = str(Path(model).resolve())
    if budget:
        launch["memory_budget"] = budget
    timeout = min(0.8 * poll_seconds, 0.5)
    return {
        "listen": {"host": "127.0.0.1", "port": _free_port()},
        "event_log": str(workdir / "events.db"),
        "engines": [{"name": "main", "kind": "bundled", "launch": launch}],
        "gpu": {"kind": "sim"},
        "policies": {"precision": {"hold_seconds": hold_seconds, "margin_ratio": 0.0,
                                   "confirm_timeout_seconds": 5, "max_switches_per_hour": 20},
                     "fragmentation": {"enabled": False}},
        "intervals": {"engine_poll_seconds": poll_seconds, "gpu_poll_seconds": max(0.5, poll_seconds),
                      "reconcile_seconds": 0.5, "call_timeout_seconds": timeout, "max_backoff_seconds": 2},
    }


def start_stack(config: dict, workdir: Path, timeout: float = 150.0) -> Stack:
    """Run ``inferctl up --config`` (this interpreter, own session) and wait for its URLs.

    Raises:
        DrillError: it exited or printed no URLs within ``timeout`` (the log is named).
    """
    import yaml

    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "drill-stack.yaml"
    cfg_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    token = secrets.token_urlsafe(24)
    log = workdir / "inferctl-up.log"
    env = {**os.environ, "INFERCTL_ADMIN_TOKEN": token}
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "inferctl", "up", "--config", str(cfg_path),
                                 "--engine-log-dir", str(workdir)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=str(workdir), start_new_session=True)
    deadline = time.time() + timeout
    engine = controller = None
    while time.time() < deadline:
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        m1 = re.search(r"^engine:\s+(\S+)", text, re.M)
        m2 = re.search(r"^controller:\s+(\S+)", text, re.M)
        engine, controller = (m1.group(1) if m1 else None), (m2.group(1) if m2 else None)
        if engine and controller:
            return Stack(proc, engine, controller, token, workdir, log)
        if proc.poll() is not None:
            raise DrillError(f"inferctl up exited with code {proc.returncode} before it was ready; log {log}:\n"
                             + text[-2000:])
        time.sleep(0.2)
    Stack(proc, "", "", token, workdir, log).stop()
    raise DrillError(f"inferctl up did not print its URLs within {timeout:g} s (log {log})")


def discover(controller_url: str, engine: str | None) -> tuple[str, str]:
    """``(engine name, engine URL)`` from the controller's ``/status``.

    Raises:
        DrillError: unreachable, or the engine is unknown / ambiguous.
    """
    import httpx

    try:
        doc = httpx.get(f"{controller_url.rstrip('/')}/status", timeout=5.0).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise DrillError(f"--url: controller not reachable at {controller_url}: {exc}") from None
    engines = doc.get("engines") or {}
    bundled = {n: e for n, e in engines.items() if e.get("kind") in ("bundled", None)}
    if engine is None:
        if len(bundled) != 1:
            raise DrillError(f"--engine: the controller has {len(bundled)} bundled engines "
                             f"({', '.join(sorted(bundled)) or 'none'}); name one")
        engine = next(iter(bundled))
    if engine not in engines or not engines[engine].get("url"):
        raise DrillError(f"--engine: {engine!r} is not an engine of {controller_url} "
                         f"(engines: {', '.join(sorted(engines)) or 'none'})")
    return engine, engines[engine]["url"]


# --------------------------------------------------------------------------------- views
def _mb(x: Any) -> str:
    return "-" if x is None else f"{x / 1e6:.2f} MB"


def _s(x: Any, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f} s"


def live_table(run: Any) -> Any:
    """A rich Table of the running drill."""
    from rich.table import Table

    s = run.samples[-1] if run.samples else None
    counts = {"ok": 0, "failed": 0, "lost": 0}
    inflight = 0
    for r in run.requests:
        if r.end is None:
            inflight += 1
        else:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
    t = Table(title="inferctl drill oom", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t0 = run.phases[0][1] if run.phases else None
    t.add_row("phase", f"{run.phase}  (load: {run.load}, {time.time() - t0:.1f} s)" if t0 else run.phase)
    t.add_row("engine precision", "-" if s is None else str(s.precision))
    t.add_row("controller policy", str(run.policy_state))
    if s is not None:
        t.add_row("memory", f"allocated {_mb(s.allocated_bytes)} / reserved {_mb(s.reserved_bytes)} / "
                            f"budget {_mb(s.budget_bytes)}")
        t.add_row("KV usage", "-" if s.kv_usage_ratio is None else f"{100 * s.kv_usage_ratio:.0f} %")
        t.add_row("running / waiting", f"{s.running} / {s.waiting}")
        t.add_row("OOM faults", str(s.oom_total))
    t.add_row("requests", f"ok {counts['ok']}, failed {counts['failed']}, lost {counts['lost']}, in flight {inflight}")
    if run.oom:
        t.add_row("OOM", f"{run.oom.get('source')} / {run.oom.get('kind')}"
                         + (" (injected by the drill)" if run.oom.get("injected") else ""))
    for e in run.events[-4:]:
        t.add_row(f"event #{e.get('id')}", f"{e.get('kind')} {e.get('source')}: {str(e.get('reason') or e.get('message'))[:80]}")
    return t


def summary_table(report: DrillReport) -> Any:
    """The end-of-drill rich Table."""
    from rich.table import Table

    s = report.summary()
    c = s["requests"]
    t = Table(title=f"drill oom: {'PASSED' if s['ok'] else 'FAILED'}")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("OOM (source / kind)", f"{s['oom_source']} / {s['oom_kind']}"
              + (" — injected by the drill" if s["oom_injected_by_drill"] else ""))
    t.add_row("switch latency: OOM → first int8 token", _s(s["switch_latency_seconds"], 3))
    t.add_row("OOM → degrade decision", _s(s["oom_to_decision_seconds"], 3))
    t.add_row("OOM → engine reports int8", _s(s["oom_to_int8_reported_seconds"], 3))
    t.add_row("rollback: int8 → full", _s(s["rollback_seconds_from_int8"]))
    t.add_row("rollback: pressure end → full", _s(s["rollback_seconds_from_recovery"]))
    t.add_row("final precision", str(s["final_precision"]))
    t.add_row("requests (ok / failed / lost)", f"{c['total']} ({c['ok']} / {c['failed']} / {c['lost']})")
    for ph, v in s["latency_by_phase"].items():
        if v["requests"]:
            t.add_row(f"latency {ph} P50 / P99 ({v['requests']} req)",
                      f"{_s(v['p50_seconds'])} / {_s(v['p99_seconds'])}")
    t.add_row("controller events", ", ".join(f"{k} {v}" for k, v in sorted(s["events"].items())) or "none")
    t.add_row("duration", _s(s["duration_seconds"], 1))
    return t


def plot_report(report: DrillReport, path: str | Path) -> Path:
    """PNG: precision mode, memory (allocated, reserved, budget) and request latency over
    time, with the OOM, int8 and rollback instants marked. Matplotlib, Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = report.started
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, sharex=True, figsize=(10, 8))
    ts = [s.t - t0 for s in report.samples]
    ax1.step(ts, [1 if s.precision == "int8" else 0 if s.precision == "full" else math.nan for s in report.samples],
             where="post", color="tab:purple")
    ax1.set_yticks([0, 1], ["full", "int8"])
    ax1.set_ylabel("precision")
    for name, key in (("allocated", "allocated_bytes"), ("reserved", "reserved_bytes"), ("budget", "budget_bytes")):
        ax2.plot(ts, [(getattr(s, key) or math.nan) / 1e6 for s in report.samples], label=name)
    ax2.set_ylabel("memory (MB)")
    ax2.legend(loc="upper left", fontsize="small")
    ok = [r for r in report.requests if r.outcome == "ok" and r.end is not None]
    bad = [r for r in report.requests if r.outcome != "ok"]
    ax3.scatter([r.end - t0 for r in ok], [r.latency for r in ok], s=6, label="ok")
    if bad:
        ax3.scatter([(r.end or report.ended) - t0 for r in bad], [(r.latency or 0) for r in bad], s=14,
                    color="red", marker="x", label="failed/lost")
    ax3.set_ylabel("request latency (s)")
    ax3.set_xlabel("seconds since the drill started")
    ax3.legend(loc="upper left", fontsize="small")
    marks = [("OOM", report.oom["time"] if report.oom else None, "red"),
             ("int8", report.int8_seen, "purple"), ("full again", report.full_seen, "green")]
    for ax in (ax1, ax2, ax3):
        for label, t, color in marks:
            if t is not None:
                ax.axvline(t - t0, color=color, linestyle="--", linewidth=1)
        for ph, t in report.phases:
            ax.axvline(t - t0, color="grey", linestyle=":", linewidth=0.6)
    for label, t, color in marks:
        if t is not None:
            ax1.annotate(label, (t - t0, 1.05), color=color, fontsize="small")
    ends = [t for _, t in report.phases[1:]] + [report.ended]
    for (ph, t), end in zip(report.phases, ends):
        ax3.annotate(ph, ((t + end) / 2 - t0, 1.0), xycoords=("data", "axes fraction"), ha="center",
                     va="bottom", fontsize="small", color="grey")
    ax1.set_title(f"inferctl drill oom — {report.model}")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------------- CLI
def register(app: Any) -> None:
    """Add ``inferctl drill oom`` to the typer ``app`` (as the sub-app ``drill``)."""
    import typer

    drill_app = typer.Typer(help="Game-day drills against a running (or self-started) stack.",
                            no_args_is_help=True)
    app.add_typer(drill_app, name="drill")

    @drill_app.command("oom")
    def oom(
        url: Optional[str] = typer.Option(None, "--url", help="A running controller (default: start `inferctl up`)."),
        engine: Optional[str] = typer.Option(None, "--engine", help="Engine name at --url (default: the only one)."),
        token: Optional[str] = typer.Option(None, "--token", envvar="INFERCTL_ADMIN_TOKEN",
                                            help="Engine admin token (for the fallback OOM injection)."),
        model: Optional[str] = typer.Option(None, "--model", help="Model of the stack the drill starts."),
        memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="Budget of the started engine."),
        engine_arg: list[str] = typer.Option([], "--engine-arg", help="Extra `inferctl engine serve` argument."),
        data: Path = typer.Option(Path("../shared/data/gutenberg"), "--data", help="Folder of .txt files (or one file)."),
        encoding: str = typer.Option("auto", "--encoding", help="auto (UTF-8, else Windows-1252) or a codec."),
        clients: int = typer.Option(16, "--clients", min=1),
        baseline_clients: int = typer.Option(2, "--baseline-clients", min=1),
        max_tokens: int = typer.Option(32, "--max-tokens", min=1),
        long_chars: int = typer.Option(660, "--long-chars", min=1, help="Characters of a pressure prompt."),
        baseline_seconds: float = typer.Option(3.0, "--baseline-seconds", min=0),
        pressure_seconds: float = typer.Option(30.0, "--pressure-seconds", min=0,
                                               help="Wait this long for a real OOM before injecting one."),
        no_inject: bool = typer.Option(False, "--no-inject", help="Never inject an OOM (fail without a real one)."),
        recovery_seconds: float = typer.Option(90.0, "--recovery-seconds", min=0, help="Wait this long for the rollback."),
        hold_seconds: float = typer.Option(3.0, "--hold-seconds", min=0, help="Precision hold of the started stack."),
        poll_seconds: float = typer.Option(0.1, "--poll-seconds", min=0.02, help="The drill's /stats poll interval."),
        controller_poll: float = typer.Option(0.2, "--controller-poll", min=0.05,
                                              help="Engine poll interval of the controller the drill starts."),
        out: Path = typer.Option(Path("out/drill"), "--out", help="Folder for drill-oom.json and drill-oom.png."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON (stdout)."),
        no_live: bool = typer.Option(False, "--no-live", help="No live view."),
    ) -> None:
        """OOM game day: load, memory pressure until an OOM, int8 switch, recovery, rollback.
        Exit 1 if a request failed or was lost or the stack did not return to full precision."""
        from rich.console import Console
        from rich.live import Live

        err = Console(stderr=True)

        def die(msg: str, code: int) -> None:
            err.print(f"error: {msg}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(code)

        try:
            cfg = DrillConfig(clients=clients, baseline_clients=min(baseline_clients, clients), max_tokens=max_tokens,
                              long_chars=long_chars, baseline_seconds=baseline_seconds,
                              pressure_seconds=pressure_seconds, recovery_seconds=recovery_seconds,
                              poll_seconds=poll_seconds, inject_fallback=not no_inject)
            longs, shorts = load_passages(data, cfg.long_chars, cfg.short_chars, encoding)
        except DrillError as exc:
            die(str(exc), 2)
        stack = None
        workdir = Path(tempfile.mkdtemp(prefix="inferctl-drill-"))
        try:
            if url is None:
                if model is not None and not Path(model).exists():
                    die(f"--model: {model} does not exist", 2)
                conf = stack_config(model, workdir, memory_budget, engine_arg, hold_seconds, controller_poll)
                err.print(f"starting inferctl up (model {model or 'demo'}, budget "
                          f"{conf['engines'][0]['launch'].get('memory_budget')}; log {workdir})", highlight=False, soft_wrap=True)
                stack = start_stack(conf, workdir)
                engine_name, engine_url, ctl_url, tok = "main", stack.engine_url, stack.controller_url, stack.token
            else:
                engine_name, engine_url = discover(url, engine)
                ctl_url, tok = url, token
            view = None
            if not no_live:
                live_ctx = Live(console=err, refresh_per_second=4, transient=False)
                live_ctx.start()
                view = lambda run: live_ctx.update(live_table(run))  # noqa: E731
            try:
                report = run_drill(engine_url, ctl_url, longs=longs, shorts=shorts, config=cfg, token=tok,
                                   engine_name=engine_name, live=view)
            finally:
                if view is not None:
                    live_ctx.stop()
        except DrillError as exc:
            die(str(exc), 1)
        finally:
            if stack is not None:
                code = stack.stop()
                if code not in (0, None):
                    err.print(f"note: inferctl up exited with code {code} (log {stack.log})", highlight=False, soft_wrap=True)
        if stack is not None:
            report.stack = {"started_by_drill": True, "log": str(stack.log), "workdir": str(workdir)}
        out.mkdir(parents=True, exist_ok=True)
        json_path = out / "drill-oom.json"
        json_path.write_text(json.dumps(report.to_dict(), indent=1, default=str), encoding="utf-8")
        png = plot_report(report, out / "drill-oom.png")
        summary = report.summary()
        if as_json:
            sys.stdout.write(json.dumps(summary | {"report": str(json_path), "plot": str(png),
                                                   "notes": report.notes}, indent=1) + "\n")
        else:
            Console().print(summary_table(report))
        for n in report.notes:
            err.print(f"note: {n}", markup=False, highlight=False, soft_wrap=True)
        err.print(f"wrote {json_path} and {png}", highlight=False, soft_wrap=True)
        raise typer.Exit(0 if summary["ok"] else 1)
