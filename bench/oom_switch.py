"""OOM → int8 switch latency under concurrent load, through the real controller.

    python -m bench.oom_switch [--clients 64] [--trials 10] [--poll 0.1]

Starts ``inferctl up`` (stories260K, simulated GPU, precision policy with fast polls; the
stack of ``inferctl drill oom`` but with the default, roomy budget), keeps ``--clients``
streaming clients busy with short Gutenberg passages, and repeats ``--trials`` times: the
benchmark injects one OOM (``POST /admin/fault``: the engine's next step runs out of memory
through its allocator), the controller sees the fault on its next poll and switches the
engine to int8, the benchmark records the switch latency, then waits for the
controller's own rollback (2 s hold, flap guard off) before the next trial. Injection
makes the trials repeatable; ``inferctl drill oom`` measures the same path from a real
(budget) OOM.

Switch latency = the first token any client receives after the first ``/stats`` answer that
reports int8, minus the fault's time (an upper bound; resolution one ``/stats`` poll, 20 ms
here, plus one step). Also: fault → the controller's degrade decision. Every request's
outcome is counted; target: p99 <= 1 s with 0 failed requests. Writes the section
``oom`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bench.common import GUTENBERG, STORIES_BIN, fmt, machine_facts, md_table, percentile, section, write_section

TARGET_P99_SECONDS = 1.0
HOLD_SECONDS = 2.0


async def _trials(run, http, n: int, token: str, controller_url: str) -> list[dict]:
    out = []
    await asyncio.sleep(2.0)              # load established
    for i in range(n):
        run.reset_oom_tracking()
        await run.inject(http)
        ok = await run.wait_for(lambda: run.int8_seen is not None, 20.0)
        if not ok:
            out.append({"trial": i, "error": "no int8 within 20 s"})
            break
        await asyncio.sleep(0.5)          # tokens after the switch
        fit = run.first_int8_token() if hasattr(run, "first_int8_token") else None
        if fit is None:
            after = [t for r in run.requests for t in r.token_times if t >= run.int8_seen]
            fit = min(after) if after else None
        await run.fetch_events(http)
        dec = [e["time"] for e in run.events if e.get("kind") == "transition" and e.get("source") == "precision"
               and (e.get("outcome") or {}).get("action") == "degrade" and e["time"] >= run.oom["time"] - 0.01]
        out.append({"trial": i, "oom_time": run.oom["time"], "source": run.oom.get("source"),
                    "switch_s": None if fit is None else fit - run.oom["time"],
                    "int8_reported_s": run.int8_seen - run.oom["time"],
                    "decision_s": (min(dec) - run.oom["time"]) if dec else None})
        t_int8 = run.int8_seen
        if not await run.wait_for(lambda: bool(run.samples) and run.samples[-1].precision == "full", 60.0):
            out[-1]["rollback_error"] = "still int8 60 s after the switch (no automatic rollback)"
            break
        out[-1]["rollback_s"] = run.samples[-1].t - t_int8
        await asyncio.sleep(1.0)
    return out


def measure(clients: int, trials: int, poll: float, max_tokens: int) -> dict:
    """Start the stack, run the trials, stop the stack. Returns the numbers."""
    import httpx

    from inferctl.tools.drill import DrillConfig, DrillRun, load_passages, stack_config, start_stack

    longs, shorts = load_passages(GUTENBERG, 660, 120, limit=400)
    work = Path(tempfile.mkdtemp(prefix="inferctl-bench-oom-"))
    conf = stack_config(str(STORIES_BIN), work, "1GiB", ["--max-num-seqs", str(clients)], HOLD_SECONDS, poll)
    # repeated trials: no flap guard (no relapse window, no pinning, no ping-pong cap)
    conf["policies"]["precision"].update(max_switches_per_hour=10 * trials + 10, relapse_window_seconds=0,
                                         max_switches_per_window=10 * trials + 10)
    stack = start_stack(conf, work)
    try:
        cfg = DrillConfig(clients=clients, baseline_clients=clients, max_tokens=max_tokens, poll_seconds=0.02)
        run = DrillRun(stack.engine_url, stack.controller_url, "stories260K", stack.token, longs, shorts, cfg, "main")

        async def main() -> list[dict]:
            limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
            async with httpx.AsyncClient(limits=limits, timeout=120.0) as http:
                models = (await http.get(f"{stack.engine_url}/v1/models")).json()["data"]
                run.model = models[0]["id"]
                await run.fetch_events(http)
                pollers = [asyncio.create_task(run.poll_engine(http))]
                tasks = [asyncio.create_task(run.client(i, http)) for i in range(clients)]
                try:
                    return await _trials(run, http, trials, stack.token, stack.controller_url)
                finally:
                    run.load = "stop"
                    done, pending = await asyncio.wait(tasks, timeout=120)
                    for t in pending:
                        t.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                    run.stop_polling = True
                    await asyncio.gather(*pollers, return_exceptions=True)

        results = asyncio.run(main())
    finally:
        stack.stop()
    counts = {"ok": 0, "failed": 0, "lost": 0}
    for r in run.requests:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    errors = [r.error for r in run.requests if r.outcome != "ok"][:3]
    return {"events": run.events, "clients": clients, "trials": results, "requests": counts, "errors": errors,
            "poll": poll, "max_tokens": max_tokens}


def render(r: dict) -> str:
    sw = [t["switch_s"] for t in r["trials"] if t.get("switch_s") is not None]
    dec = [t["decision_s"] for t in r["trials"] if t.get("decision_s") is not None]
    rep = [t["int8_reported_s"] for t in r["trials"] if t.get("int8_reported_s") is not None]
    rows = [[name, len(v), fmt(percentile(v, 50), 3), fmt(percentile(v, 99), 3), fmt(max(v) if v else None, 3)]
            for name, v in (("OOM → first int8 token", sw), ("OOM → degrade decision", dec),
                            ("OOM → /stats reports int8", rep))]
    c = r["requests"]
    p99 = percentile(sw, 99)
    ok = p99 is not None and p99 <= TARGET_P99_SECONDS and c["failed"] == 0 and c["lost"] == 0
    problems = [t for t in r["trials"] if "error" in t or "rollback_error" in t]
    return (f"{r['clients']} streaming clients (short Gutenberg passages, {r['max_tokens']} tokens each), controller "
            f"engine poll {r['poll']:g} s, {len(r['trials'])} trials (OOM injected; the controller rolls back"
            " after a 2 s hold between trials).\n\n"
            + md_table(["seconds", "trials", "P50", "P99", "max"], rows)
            + f"\n\nRequests: {sum(c.values())} total, {c['ok']} ok, {c['failed']} failed, {c['lost']} lost."
            + (f" First errors: {r['errors']}" if r["errors"] else "")
            + (f"\n\nTrial problems: {problems}" if problems else "")
            + f"\n\n- OOM → int8 P99 {fmt(p99, 3)} s with {c['failed'] + c['lost']} failed/lost requests "
              f"(target ≤ 1 s and 0 failed: {'met' if ok else 'NOT met'}).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--poll", type=float, default=0.1, help="controller engine poll interval (s)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="smoke test: no doc write")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    facts = machine_facts()
    r = measure(a.clients, a.trials, a.poll, a.max_tokens)
    body = render(r)
    print(body)
    if a.quick:
        for e in r["events"]:
            print(e["id"], e["kind"], e["source"], (e.get("outcome") or {}).get("action"), e["reason"][:100])
    if not (a.quick or a.no_write):
        write_section("oom", section("oom", f"OOM → int8 under {a.clients} clients", body, facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
