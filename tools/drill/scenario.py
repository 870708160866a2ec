"""The drill while it runs: the load clients, the ``/stats``, ``/status`` and ``/events``
pollers, and the phase script (:class:`DrillRun`); :func:`run_drill` drives one run and returns
its :class:`~inferctl.tools.drill.report.DrillReport`."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict
from typing import Any, Callable

from inferctl.tools.drill.config import DrillConfig, DrillError
from inferctl.tools.drill.report import DrillReport, RequestRecord, Sample


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

