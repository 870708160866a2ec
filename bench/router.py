"""Router benchmarks: overhead, aggregate throughput over 1/2/3 replicas, prefix affinity's TTFT.

``python -m bench.router [--write]`` starts three real engines (stories260K, ``inferctl engine
serve``) and four routers (``inferctl router``, subprocesses) on loopback, then measures:

1. **Overhead**: the same closed-loop load — 64 clients, each sending non-streamed
   ``/v1/completions`` (``max_tokens`` 4) one at a time, 16 each — straight to engine main-0 and through
   a router in front of main-0 alone, alternated (the order turning each round), 5 rounds after a warm-up
   of both at full concurrency
   (a round of 4 each, ~0.5 s, swung by tens of ms; the first round through the router opened its
   upstream connections); the added latency is the router's
   p50 (p99) minus the direct p50 (p99) of the same round; the verdict is the median of the
   rounds' added p50 (the best round is shown too). The router's own
   ``inferctl_router_overhead_seconds`` (arrival → first byte to the client minus the
   upstream time to first byte) is read from its ``/metrics`` (its p50 / p99 from the round's
   buckets). Pinned (the default with two CPUs or more): the load generator and main-0 share the
   first CPU, the router has the last (the second of two; on a bigger host the last is never the first's
   hyperthread sibling under either usual numbering), so the router's CPU is not taken from the engine or the
   client: without it, on 2 shared cores the added latency at 64 clients is about clients × the
   router's CPU per request ÷ cores of queueing for a core, whatever the router does per request.
   Also one client, 40 sequential requests each way (no queueing), and the CPU seconds per
   request of the router and engine processes (/proc/PID/stat).
2. **Throughput**: 32 clients, non-streamed, ``max_tokens`` 32, a 16-character prompt (least-load
   routing), for 6 s through routers in front
   of 1, 2 and 3 replicas; generated tokens per second (the answers' ``usage``).
3. **Prefix affinity vs affinity off**, TTFT and cached-token share per turn
   (:mod:`bench.router_affinity`): ``--chats`` multi-turn chats in ``--groups`` groups sharing a
   long system prompt, on the real chat model, through a router with affinity and one without,
   ``--aff-runs`` alternated runs; ``--affinity-only`` runs just this part.

``--overhead-only`` starts one engine and one router and runs only part 1 (pinned unless
``--no-pin``); with ``--write`` it replaces only part 1 of the router section of docs/benchmarks.md
(between ``<!-- bench:router-overhead:start/end -->``, :func:`replace_overhead`), keeping the other
parts' tables and the notes after them.

The client is aiohttp on the same 2 cores as the servers: every figure includes that contention
(and any outside load: the report gives the load average). Writes the ``router`` section of
docs/benchmarks.md with ``--write``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.reference_proxy import (find_haproxy, fitting_maxconn, haproxy_version, server_times, start_haproxy,
                                   timings_seen)
from inferctl.controller.supervisor import descendants
from bench.common import DOC, STORIES_BIN, fmt, machine_facts, md_table, percentile, section, write_section
from bench.router_affinity import (BOOK, CHAT_MEMORY_BUDGET, TURNS, affinity, affinity_summary, by_turn_table,  # noqa: F401
                                   free_port as _port, spawn as _spawn, stop as _stop, system_prompts, wait as _wait)

ENGINE_ARGS = ["--max-model-len", "512", "--memory-budget", "512MiB", "--log-level", "warning"]
PROMPT = "Once upon a time there was a little girl who"
#: under the router's 32-character affinity minimum: the least-load rule spreads these evenly
SHORT = "Once upon a time"


async def _closed_loop(url: str, clients: int, *, n_per_client: int | None = None, seconds: float | None = None,
                       max_tokens: int = 4, prompt: str = PROMPT) -> dict:
    """``clients`` workers, one non-streamed completion at a time each; latencies (s), tokens, errors."""
    import aiohttp

    lat: list[float] = []
    tokens = errors = 0
    samples: list[str] = []
    stop = time.perf_counter() + (seconds or 1e9)
    body = {"model": "stories260K", "prompt": prompt, "max_tokens": max_tokens}

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal tokens, errors
        i = 0
        while (n_per_client is None or i < n_per_client) and time.perf_counter() < stop:
            i += 1
            t = time.perf_counter()
            async with session.post(url + "/v1/completions", json=body) as r:
                doc = await r.read()
            if r.status != 200:
                errors += 1
                samples.append(f"HTTP {r.status} {doc[:160]!r}")
                continue
            lat.append(time.perf_counter() - t)
            tokens += json.loads(doc)["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(worker(session) for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {"lat": lat, "tokens": tokens, "errors": errors, "wall": wall, "n": len(lat), "samples": samples[:3]}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/PID/stat fields 14, 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _engine_steps(url: str) -> tuple[float, float]:
    """(steps, sequences over those steps) of an engine so far (``inferctl_engine_steps_total``,
    ``inferctl_engine_step_sequences_total``): their ratio is the mean batch of a step."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=5).text

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return total("inferctl_engine_steps_total"), total("inferctl_engine_step_sequences_total")


def _overhead_metric(router: str) -> dict:
    """The router's ``inferctl_router_overhead_seconds`` now: ``sum`` (s), ``count``, ``buckets``
    (upper bound → cumulative count, ``+Inf`` included)."""
    import httpx

    return parse_overhead(httpx.get(router + "/metrics", timeout=5).text)


def parse_overhead(text: str) -> dict:
    """:func:`_overhead_metric`'s dict from a /metrics text; a series the router does not export (the
    HAProxy data plane exports neither histogram: docs/router.md "Data planes") reads 0, so the round's
    router's-own figures are no data (None), not 0."""
    def get(k: str) -> float:
        found = re.search(rf"^inferctl_router_overhead_seconds_{k} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    buckets = {float(le): float(v) for le, v in
               re.findall(r'^inferctl_router_overhead_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)}
    up = lambda k: sum(float(v) for v in re.findall(  # noqa: E731
        rf"^inferctl_router_upstream_latency_seconds_{k}\{{[^}}]*\}} (\S+)$", text, re.M))
    return {"sum": get("sum"), "count": get("count"), "buckets": buckets,
            "upstream_sum": up("sum"), "upstream_count": up("count")}


def histogram_quantile(q: float, before: dict, after: dict) -> float | None:
    """The ``q`` quantile (0..1) of the observations between two :func:`_overhead_metric` reads,
    by Prometheus' ``histogram_quantile`` rule (linear inside the bucket that holds the rank;
    the lowest bucket from 0; the ``+Inf`` bucket answers the highest finite bound). None when
    nothing was observed."""
    les = sorted(after["buckets"])
    cum = [after["buckets"][le] - before["buckets"].get(le, 0.0) for le in les]
    if not cum or cum[-1] <= 0:
        return None
    rank = q * cum[-1]
    for i, (le, c) in enumerate(zip(les, cum)):
        if c >= rank:
            if le == float("inf"):
                return les[i - 1] if i else None
            lo, below = (les[i - 1], cum[i - 1]) if i else (0.0, 0.0)
            return lo + (le - lo) * ((rank - below) / (c - below) if c > below else 1.0)
    return None


def _pin(pid: int, cpus: set[int] | None) -> None:
    """Pin every thread of process ``pid`` (0: this one) to ``cpus`` (None: leave it alone):
    ``sched_setaffinity`` acts on one thread id, and the servers started theirs already
    (``taskset -a``'s rule: each id under /proc/PID/task)."""
    if not cpus:
        return
    for tid in os.listdir(f"/proc/{pid or os.getpid()}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):   # a thread that just ended
            pass


def measure_overhead(engine: str, router: str, engine_pid: int, router_pid: int, *, rounds: int = 5,
                     clients: int = 64, per_client: int = 16, pin: bool = True,
                     reference: tuple[str, int, str, Path] | None = None, router_also: tuple[int, ...] = (),
                     data_plane: str = "python") -> dict:
    """Part 1 (module docstring) against a running ``engine`` (URL, process ``engine_pid``) and a
    ``router`` in front of it alone (URL, ``router_pid``): ``overhead`` (a dict per round),
    ``sequential`` (one client, per round), ``pinned`` (the two CPU sets, or None), ``clients``,
    ``per_client``. ``pin``: the client and the engine on the first CPU, the router on the last
    (``os.sched_setaffinity``; skipped with one CPU), every process back on every CPU after.
    ``reference``: (URL, pid, name, its timing log) of a compiled proxy in front of the same engine
    (:mod:`bench.reference_proxy`), placed as the router and measured in the same rounds after it:
    each round's dict then also holds ``reference_p50`` / ``reference_p99`` / ``reference_added_p50`` /
    ``reference_cpu_ms_per_req``, and the result ``reference`` (its name). ``router_also``: more processes
    of the router (``--data-plane haproxy``: ``router_pid`` is HAProxy, these its Python control plane),
    pinned with it, their CPU counted in the router's; ``data_plane`` is recorded in the result."""
    over = []
    cpus = sorted(os.sched_getaffinity(0))
    # pinned: the load generator and engine main-0 share one core, the router has another, so the
    # router's CPU never comes out of the engine's or the client's (a router on its own host)
    pinned = (pin and len(cpus) >= 2) and ({cpus[0]}, {cpus[-1]})
    if pinned:
        _pin(0, pinned[0])
        _pin(engine_pid, pinned[0])
        for pid in (router_pid, *router_also):
            _pin(pid, pinned[1])
        if reference:
            _pin(reference[1], pinned[1])
    seq = []
    for _ in range(rounds):        # one client, sequential: the overhead without queueing
        d = asyncio.run(_closed_loop(engine, 1, n_per_client=40))
        r = asyncio.run(_closed_loop(router, 1, n_per_client=40))
        seq.append({"direct_p50": percentile(d["lat"], 50), "router_p50": percentile(r["lat"], 50),
                    "added_p50": percentile(r["lat"], 50) - percentile(d["lat"], 50)})
        if reference:
            x = asyncio.run(_closed_loop(reference[0], 1, n_per_client=40))
            seq[-1]["reference_added_p50"] = _minus(percentile(x["lat"], 50), percentile(d["lat"], 50))
    def router_cpu() -> float:
        return sum(_cpu_seconds(pid) for pid in (router_pid, *router_also))

    def direct() -> dict:
        e0, b0, k0 = _cpu_seconds(engine_pid), _engine_steps(engine), time.process_time()
        d = asyncio.run(_closed_loop(engine, clients, n_per_client=per_client))
        e1, b1, k1 = _cpu_seconds(engine_pid), _engine_steps(engine), time.process_time()
        return {"direct_p50": percentile(d["lat"], 50), "direct_p99": percentile(d["lat"], 99),
                "direct_mean": statistics.fmean(d["lat"]) if d["lat"] else None,
                "direct_rps": d["n"] / d["wall"], "direct_errors": d["errors"], "direct_n": d["n"],
                "client_cpu_ms_per_req_direct": 1000 * (k1 - k0) / max(1, d["n"]),
                "engine_cpu_ms_per_req_direct": 1000 * (e1 - e0) / max(1, d["n"]),
                "seqs_per_step_direct": (b1[1] - b0[1]) / max(1, b1[0] - b0[0])}

    def routed() -> dict:
        # the router's upstream connections open again if they idled past their keep-alive
        asyncio.run(_closed_loop(router, clients, n_per_client=1))
        h0 = _overhead_metric(router)
        u0, e2, b2, k2 = (router_cpu(), _cpu_seconds(engine_pid), _engine_steps(engine), time.process_time())
        r = asyncio.run(_closed_loop(router, clients, n_per_client=per_client))
        u1, e3, b3, k3 = (router_cpu(), _cpu_seconds(engine_pid), _engine_steps(engine), time.process_time())
        h1 = _overhead_metric(router)
        return {"router_p50": percentile(r["lat"], 50), "router_p99": percentile(r["lat"], 99),
                "router_rps": r["n"] / r["wall"], "router_errors": r["errors"], "router_n": r["n"],
                "router_own_mean": (h1["sum"] - h0["sum"]) / (h1["count"] - h0["count"])
                if h1["count"] > h0["count"] else None,
                "router_own_p50": histogram_quantile(0.5, h0, h1),
                "router_own_p99": histogram_quantile(0.99, h0, h1),
                "router_cpu_ms_per_req": 1000 * (u1 - u0) / max(1, r["n"]),
                "router_mean": statistics.fmean(r["lat"]) if r["lat"] else None,
                # what the router saw of the engine: sending the request → its first body byte
                "router_upstream_mean": (h1["upstream_sum"] - h0["upstream_sum"])
                / (h1["upstream_count"] - h0["upstream_count"])
                if h1["upstream_count"] > h0["upstream_count"] else None,
                "client_cpu_ms_per_req_routed": 1000 * (k3 - k2) / max(1, r["n"]),
                "engine_cpu_ms_per_req_routed": 1000 * (e3 - e2) / max(1, r["n"]),
                "seqs_per_step_routed": (b3[1] - b2[1]) / max(1, b3[0] - b2[0])}

    def referenced() -> dict:
        asyncio.run(_closed_loop(reference[0], clients, n_per_client=1))
        c0, t0 = _cpu_seconds(reference[1]), timings_seen(reference[3])
        x = asyncio.run(_closed_loop(reference[0], clients, n_per_client=per_client))
        c1 = _cpu_seconds(reference[1])
        tr = server_times(reference[3], t0, x["n"])
        return {"reference_p50": percentile(x["lat"], 50), "reference_p99": percentile(x["lat"], 99),
                "reference_mean": statistics.fmean(x["lat"]) if x["lat"] else None,
                "reference_upstream_mean": statistics.fmean(tr) / 1000 if tr else None,
                "reference_cpu_ms_per_req": 1000 * (c1 - c0) / max(1, x["n"]), "reference_errors": x["errors"]}

    # the order turns each round (direct, router[, reference] → router[, reference], direct → …):
    # a load's place in the round (what ran just before it on the engine) does not favour one side
    parts = [direct, routed] + ([referenced] if reference else [])
    for k in range(rounds):
        o: dict = {"order": []}
        for part in turned(parts, k):
            o.update(part())
            o["order"].append(part.__name__)
        o["errors"] = o.pop("direct_errors") + o.pop("router_errors")
        o["n"] = o.pop("direct_n") + o.pop("router_n")
        over.append(o)
    for o in over:
        o["added_p50"] = o["router_p50"] - o["direct_p50"]
        o["added_p99"] = o["router_p99"] - o["direct_p99"]
        if "reference_p50" in o:      # None when every request through the reference failed
            o["reference_added_p50"] = _minus(o["reference_p50"], o["direct_p50"])
    if pinned:
        for pid in (0, engine_pid, router_pid, *router_also, *([reference[1]] if reference else [])):
            _pin(pid, set(cpus))
    return {"overhead": over, "sequential": seq, "clients": clients, "per_client": per_client,
            "reference": reference[2] if reference else None, "data_plane": data_plane,
            "pinned": None if not pinned else [sorted(pinned[0]), sorted(pinned[1])]}


def _positive(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def turned(parts: list, k: int) -> list:
    """``parts`` turned by ``k`` places (round ``k``'s order: ``[a, b, c]`` → ``[b, c, a]`` for k = 1), so
    over ``len(parts)`` rounds each part runs once in each place. Raises ValueError on an empty list."""
    if not parts:
        raise ValueError("no parts to order")
    k %= len(parts)
    return parts[k:] + parts[:k]


def _wait_proxy(url: str, timeout: float = 30.0) -> None:
    """Until ``POST url/v1/completions`` (one token) answers 200 through whatever listens at ``url``
    (HAProxy has no /ready of its own); RuntimeError after ``timeout`` seconds."""
    import httpx

    deadline = time.time() + timeout
    while True:
        try:
            if httpx.post(url + "/v1/completions", json={"model": "stories260K", "prompt": PROMPT, "max_tokens": 1},
                          timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            raise RuntimeError(f"{url} answered no completion in {timeout:g} s")
        time.sleep(0.1)


def _spawn_engine(port: int, log: Path, engine_device: str | None, stub_delay_ms: float | None = None,
                  stub_step_ms: float = 0.0) -> subprocess.Popen:
    """``inferctl engine serve`` of stories260K on ``port`` (:data:`ENGINE_ARGS`, ``--device engine_device``
    when given), its output to ``log``; with ``stub_delay_ms``, :mod:`bench.stub_upstream` instead (a
    fixed answer time, steps of ``stub_step_ms``; no engine)."""
    if stub_delay_ms is not None:
        with open(log, "wb") as out:
            return subprocess.Popen([sys.executable, "-m", "bench.stub_upstream", "--port", str(port),
                                     "--delay-ms", str(stub_delay_ms), "--step-ms", str(stub_step_ms)],
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[1])
    device = ["--device", engine_device] if engine_device else []
    return _spawn(["engine", "serve", "--model", str(STORIES_BIN), "--port", str(port), *ENGINE_ARGS, *device], log)


def _warm_up(engine: str, router: str, reference: tuple | None, clients: int) -> None:
    """Twice through each of ``engine``, ``router`` and the reference proxy's URL, at the rounds'
    concurrency (two requests a client), each after it answered a completion (:func:`_wait_proxy`)."""
    warm = (engine, router, *([reference[0]] if reference else []))
    for url in warm + warm:
        _wait_proxy(url)
        asyncio.run(_closed_loop(url, clients, n_per_client=2))


def _start_reference(haproxy: str | None, engine: str, workdir: Path, clients: int,
                     procs: list[subprocess.Popen]) -> tuple[str, int, str, Path] | None:
    """With ``haproxy`` (its binary), start the reference proxy in front of ``engine``, add it to
    ``procs`` (stopped with the others) and return :func:`measure_overhead`'s ``reference``; None without."""
    if not haproxy:
        return None
    port = _port()
    procs.append(start_haproxy(haproxy, port, engine, workdir, maxconn=fitting_maxconn(max(4096, 2 * clients))))
    return f"http://127.0.0.1:{port}", procs[-1].pid, haproxy_version(haproxy), workdir / "haproxy.log"


def run_overhead(rounds: int = 5, clients: int = 64, per_client: int = 16, pin: bool = True,
                 haproxy: str | None = None, engine_device: str | None = None, data_plane: str = "python",
                 stub_delay_ms: float | None = None, stub_step_ms: float = 0.0) -> dict:
    """``--overhead-only``: start one engine (main-0, ``--device engine_device`` when given) and one
    router in front of it (``--data-plane data_plane``), and with ``haproxy`` (its binary) a reference
    HAProxy beside the router (:mod:`bench.reference_proxy`), warm them up, :func:`measure_overhead`,
    stop them. ``stub_delay_ms``: :mod:`bench.stub_upstream` in place of the engine (its answer time, ms).
    Raises RuntimeError when a haproxy data plane has no HAProxy child."""
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-router-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        port = _port()
        procs.append(_spawn_engine(port, workdir / "engine-0.log", engine_device, stub_delay_ms, stub_step_ms))
        engine = f"http://127.0.0.1:{port}"
        port = _port()
        procs.append(_spawn(["router", "--port", str(port), "--log-level", "warning", "--probe-interval", "0.5",
                             "--data-plane", data_plane, "--engine", f"main-0={engine}"], workdir / "router-r1.log"))
        router = f"http://127.0.0.1:{port}"
        reference = _start_reference(haproxy, engine, workdir, clients, procs)
        _wait(engine + "/ready", proc=procs[0], log=workdir / "engine-0.log")
        _wait(router + "/ready", proc=procs[1], log=workdir / "router-r1.log")
        router_pid, also = procs[1].pid, ()
        if data_plane == "haproxy":         # HAProxy carries the requests; the Python process drives it
            kids = descendants(procs[1].pid)     # HAProxy in the foreground, one process: no children
            if len(kids) != 1:
                raise RuntimeError(f"router --data-plane haproxy: expected one HAProxy child, found {kids}")
            router_pid, also = kids[0], (procs[1].pid,)
        _warm_up(engine, router, reference, clients)
        res = measure_overhead(engine, router, procs[0].pid, router_pid, rounds=rounds, clients=clients,
                               per_client=per_client, pin=pin, reference=reference, router_also=also,
                               data_plane=data_plane)
        return {**res, "stub_delay_ms": stub_delay_ms, "stub_step_ms": stub_step_ms}
    finally:
        _stop(procs)


def run(rounds: int = 5, clients: int = 64, per_client: int = 16, tp_seconds: float = 6.0, chats: int = 6,
        groups: int = 3, turns: int = 3, system_chars: int = 6000, aff_runs: int = 1, pin: bool = True,
        chat_memory_budget: str = CHAT_MEMORY_BUDGET, haproxy: str | None = None,
        engine_device: str | None = None) -> dict:
    """Start the servers, measure (module docstring), stop them; the results as a dict. ``pin``: the
    overhead part runs with the client and engine main-0 on the first CPU and the router on the
    last (``os.sched_setaffinity``; skipped with one CPU). ``haproxy`` (its binary): the reference
    proxy of the overhead part (:func:`run_overhead`); ``engine_device``: the engines' ``--device``."""
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-router-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        engines = []
        for i in range(3):
            port = _port()
            procs.append(_spawn_engine(port, workdir / f"engine-{i}.log", engine_device))
            engines.append(f"http://127.0.0.1:{port}")
        routers = {}
        for name, n, extra in (("r1", 1, []), ("r2", 2, []), ("r3", 3, [])):
            port = _port()
            argv = ["router", "--port", str(port), "--log-level", "warning", "--probe-interval", "0.5", *extra]
            for i in range(n):
                argv += ["--engine", f"main-{i}={engines[i]}"]
            procs.append(_spawn(argv, workdir / f"router-{name}.log"))
            routers[name] = f"http://127.0.0.1:{port}"
        for i, url in enumerate(engines):
            _wait(url + "/ready", proc=procs[i], log=workdir / f"engine-{i}.log")
        for i, (name, url) in enumerate(routers.items()):
            _wait(url + "/ready", proc=procs[3 + i], log=workdir / f"router-{name}.log")
        reference = _start_reference(haproxy, engines[0], workdir, clients, procs)
        _warm_up(engines[0], routers["r1"], reference, clients)
        ov = measure_overhead(engines[0], routers["r1"], procs[0].pid, procs[3].pid, rounds=rounds, clients=clients,
                              per_client=per_client, pin=pin, reference=reference)
        tp = {}
        for name in ("r1", "r2", "r3"):
            res = asyncio.run(_closed_loop(routers[name], 32, seconds=tp_seconds, max_tokens=32, prompt=SHORT))
            tp[name] = {"tok_s": res["tokens"] / res["wall"], "req_s": res["n"] / res["wall"],
                        "p50": percentile(res["lat"], 50), "errors": res["errors"], "samples": res["samples"]}
    finally:
        _stop(procs)
    aff = affinity(workdir, chats, groups, turns, system_chars, aff_runs, memory_budget=chat_memory_budget)
    return {**ov, "throughput": tp, "affinity": aff, "tp_seconds": tp_seconds}


#: The markers around part 1 inside the router section (``--overhead-only --write`` replaces what
#: is between them, or, in a section written before they existed, the paragraphs from
#: ``**Router overhead**`` up to ``**Aggregate throughput**``).
OVERHEAD_START, OVERHEAD_END = "<!-- bench:router-overhead:start -->", "<!-- bench:router-overhead:end -->"


def replace_overhead(doc: str, block: str, keep: bool = False) -> str:
    """``doc`` (docs/benchmarks.md's text) with part 1 of its router section replaced by ``block``
    (kept between :data:`OVERHEAD_START` / :data:`OVERHEAD_END`); the other parts' tables and any
    notes after them stay as they are. ``keep`` (what ``--write`` does): what was between the markers
    stays below the new block under ``#### Earlier run (<its finish time>)``, so the runs' history
    (and the notes written into it) is never lost.

    Raises:
        ValueError: no router section, or no part 1 in it (neither the markers nor the
            ``**Router overhead**`` … ``**Aggregate throughput**`` paragraphs)."""
    start, end = "<!-- bench:router:start -->", "<!-- bench:router:end -->"
    a, b = doc.find(start), doc.find(end)
    if a < 0 or b < a:
        raise ValueError("docs/benchmarks.md has no router section: run `python -m bench.router --write` first")
    sec = doc[a:b]
    new = f"{OVERHEAD_START}\n{block.strip()}\n{OVERHEAD_END}"
    i, j = sec.find(OVERHEAD_START), sec.find(OVERHEAD_END)
    if 0 <= i < j:
        old = sec[i + len(OVERHEAD_START):j].strip()
        if keep and old:
            when = re.search(r"finished (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", old)
            stamp = when.group(1) if when else "time not recorded"
            new = f"{OVERHEAD_START}\n{block.strip()}\n\n#### Earlier run ({stamp})\n\n{old}\n{OVERHEAD_END}"
        j += len(OVERHEAD_END)
    else:
        i, j = sec.find("**Router overhead**"), sec.find("**Aggregate throughput**")
        if not 0 <= i < j:
            raise ValueError("the router section has no overhead part to replace")
        new += "\n\n"
    return doc[:a] + sec[:i] + new + sec[j:] + doc[b:]


def _client_versions() -> str:
    """The router's upstream client and version, for the report (e.g. ``aiohttp 3.14.5``)."""
    import aiohttp

    return f"aiohttp {aiohttp.__version__}"


def load_sentence(uptime: str, load_1m: float, cpus: int | None) -> str:
    """The run's conditions: the load at the start, and a warning only when the 1-minute load
    average was above the CPU count (other work was queueing for the cores)."""
    base = (f"`uptime` at the start: `{uptime}`. The three engines, the routers and the load generator"
            " (aiohttp) all run on this machine's cores; every figure includes their contention.")
    if cpus and load_1m > cpus:
        return (base + f" **The load average at the start ({load_1m}) was above the CPU count ({cpus})**: other"
                " work was competing for the cores, so latencies and CPU per request are inflated.")
    return base + f" Load average at the start {load_1m} on {cpus} CPUs: no outside load above the CPU count."


def render_overhead(res: dict, busy: bool = False) -> str:
    """The markdown of part 1 (the overhead table, the verdict, the sequential line, where the
    router's time goes) from :func:`measure_overhead`'s dict; ``busy``: the load average at the
    start was above the CPU count (the verdict says the outside load adds to it)."""
    ms = lambda x: fmt(None if x is None else 1000 * x, 2)  # noqa: E731
    best = min(res["overhead"], key=lambda o: o["added_p50"])
    added = [o["added_p50"] for o in res["overhead"]]
    mid = percentile(added, 50)
    ref = res.get("reference")
    plane = res.get("data_plane") or "python"
    ref_cols = ["reference p50", "reference added p50", "reference CPU ms/req"] if ref else []
    ref_row = (lambda o: [ms(o.get("reference_p50")), ms(o.get("reference_added_p50")),
                          fmt(o.get("reference_cpu_ms_per_req"), 2)]) if ref else (lambda o: [])
    rows = [[i + 1, ms(o["direct_p50"]), ms(o["router_p50"]), ms(o["added_p50"]), ms(o["direct_p99"]),
             ms(o["router_p99"]), ms(o["added_p99"]),
             f'{ms(o.get("router_own_p50"))} / {ms(o.get("router_own_p99"))} / {ms(o["router_own_mean"])}',
             fmt(o["direct_rps"]), fmt(o["router_rps"]), fmt(o["router_cpu_ms_per_req"], 2),
             f'{fmt(o.get("client_cpu_ms_per_req_direct"), 2)} / {fmt(o.get("client_cpu_ms_per_req_routed"), 2)}',
             fmt(o["engine_cpu_ms_per_req_direct"], 2), fmt(o["engine_cpu_ms_per_req_routed"], 2),
             f"{fmt(o['seqs_per_step_direct'], 1)} / {fmt(o['seqs_per_step_routed'], 1)}",
             o["errors"] + o.get("reference_errors", 0), *ref_row(o)]
            for i, o in enumerate(res["overhead"])]
    ref_text = ""
    if ref:
        ref_added = [o.get("reference_added_p50") for o in res["overhead"]]
        got = [v for v in ref_added if v is not None]
        ref_mid = percentile(got, 50) if got else None
        cpu = [o["reference_cpu_ms_per_req"] for o in res["overhead"] if o.get("reference_cpu_ms_per_req") is not None]
        ref_cpu = percentile(cpu, 50) if cpu else None
        ref_text = (
            f" **The same rounds through {ref}** (a compiled proxy, bench/reference_proxy.py: one thread, keep-alive"
            " both ways, the whole body read before forwarding; placed as the router): added p50 median"
            f" **{ms(ref_mid)} ms** (rounds {', '.join(ms(v) for v in ref_added)}), {fmt(ref_cpu, 3)} ms of CPU a"
            " request: what a hop through a proxy at tens of µs of CPU a request reads in this harness;"
            + (" every request through it failed (the errors column)." if ref_mid is None else
               f" the router's median is {ms(abs(mid - ref_mid))} ms {'above' if mid >= ref_mid else 'below'} it."))
    seq_ref = [q["reference_added_p50"] for q in res["sequential"] if q.get("reference_added_p50") is not None]
    split = split_table(res)
    return "\n".join([
        f"**Router overhead**, {res['clients']} concurrent clients × {res['per_client']} non-streamed completions"
        " (`max_tokens` 4) straight to "
        + (f"a stub upstream that answers each one {fmt(res['stub_delay_ms'])} ms after reading it"
           + (f", at the next multiple of {fmt(res.get('stub_step_ms'))} ms (answers leave in bursts, as after an"
              " engine's step)" if res.get("stub_step_ms") else "")
           + ", however many are in flight (bench/stub_upstream.py: no engine, so the rounds do not swing with its"
           " batching)"
           if res.get("stub_delay_ms") is not None else "one engine")
        + " vs through a router"
        + (f" (`--data-plane {plane}`: HAProxy carries the requests, the router's Python process drives it;"
           " docs/router.md \"Data planes\")" if plane != "python" else "")
        + " in front of it, loopback, alternated (the"
        " order of the loads turning each round, so none always follows the same one), "
        f"{len(res['overhead'])} rounds, "
        + (f"pinned: the load generator and the engine on CPU {res['pinned'][0]}, the router on CPU"
           f" {res['pinned'][1]} (`os.sched_setaffinity`: the router's CPU never comes out of the engine's or the"
           " client's, as with a router on its own host; both sides run the same requests at the same concurrency"
           " with the same client and engine placement)" if res.get("pinned") else "not pinned")
        + " (ms; *added* = router − direct of the same round; *router's own* = p50 / p99 (Prometheus'"
        " `histogram_quantile` rule over the round's buckets) / mean of `inferctl_router_overhead_seconds`,"
        " arrival → first byte out minus upstream time to first byte; CPU per request from /proc/PID/stat and,"
        " for the client, `time.process_time`; *batch* = the engine's mean sequences per step, direct / routed):",
        "",
        md_table(["round", "direct p50", "router p50", "added p50", "direct p99", "router p99", "added p99",
                  "router's own p50 / p99 / mean", "direct req/s", "router req/s", "router CPU ms/req",
                  "client CPU ms/req direct / routed", "engine CPU ms/req direct", "engine CPU ms/req routed",
                  "batch", "errors", *ref_cols], rows),
        "",
        f"Median over the rounds: **added p50 {ms(mid)} ms** (rounds {', '.join(ms(v) for v in added)}; a"
        " single round swings by tens of ms with what else the cores run, so one round is no verdict) at"
        f" {res['clients']} clients (target ≤ 2 ms p50). Best round: added p50 {ms(best['added_p50'])} ms, p99"
        f" {ms(best['added_p99'])} ms; the router's own measure"
        f" {ms(best.get('router_own_p50'))} ms p50, {ms(best['router_own_mean'])} ms mean. CPU per request in that"
        " round: router"
        f" {fmt(best['router_cpu_ms_per_req'], 2)} ms, engine {fmt(best['engine_cpu_ms_per_req_routed'], 2)} ms"
        f" (direct: engine {fmt(best['engine_cpu_ms_per_req_direct'], 2)} ms). "
        + ("**Target met** (median of the rounds)." if mid <= 0.002 else
           "**Target not met** (median of the rounds)." if plane != "python" else
           "**Target not met**: the closed-loop clients' requests finish in engine batches, so the router gets"
           " them in bursts and handles a burst one request after another on its one event loop; the median"
           f" request of a burst of {res['clients']} waits for about {res['clients'] // 2} others, so the added p50 is"
           f" of the order of {res['clients'] // 2} × the router's CPU per request"
           f" ({res['clients'] // 2} × {fmt(best['router_cpu_ms_per_req'], 2)} ms ≈"
           f" {fmt(res['clients'] // 2 * best['router_cpu_ms_per_req'], 1)} ms in the best round), with a core of its"
           " own or not; its own measure (p50), which starts when the app gets the request, does not see that"
           " queue (docs/router.md, \"Cost per request\")."
           + (" The outside load (see the load average) adds to it." if busy else ""))
        + ref_text,
        "",
        *split,
        "One client, 40 sequential requests, no queueing (ms): "
        + "; ".join(f"round {i + 1}: direct p50 {ms(q['direct_p50'])}, router p50 {ms(q['router_p50'])},"
                    f" added {ms(q['added_p50'])}" for i, q in enumerate(res["sequential"]))
        + f"; median of the rounds' added p50 **{ms(percentile([q['added_p50'] for q in res['sequential']], 50))}"
        " ms**" + (f" ({ref}: {ms(percentile(seq_ref, 50))} ms)." if seq_ref else "."),
        "",
        ("Where the router's time goes (docs/router.md \"Cost per request\"; cProfile, py-spy and"
         " `time.process_time`, 2026-12-02): the app alone (plain ASGI on the two completion routes, a stub upstream)"
         " about 0.1–0.15 ms of CPU per request, the upstream client (" + _client_versions() + ", one keep-alive"
         " `ClientSession`) about a third of the process's CPU, uvicorn (httptools, uvloop), the event loop and the"
         " socket system calls the rest; no single part dominates." if plane == "python" else
         "Where the router's time goes: its *router CPU* column is HAProxy's CPU plus the Python control plane's"
         " (the probes every 0.5 s and one runtime-API sync after each, whatever the request rate); a request"
         " never enters Python (docs/router.md \"Data planes\")."),
    ])


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def split_table(res: dict) -> list[str]:
    """Where the added time goes, per round (means, ms): the client's mean latency straight and
    through each proxy, the engine's time as the proxy saw it (the router's
    ``inferctl_router_upstream_latency_seconds`` mean, HAProxy's ``%Tr`` mean), and the two
    differences: the proxy's part (client mean − engine as the proxy saw it: reading the request,
    routing, relaying the answer, and the time the request waited for the proxy's event loop) and
    the engine's part (engine as the proxy saw it − straight). Lines of markdown (empty when the
    rounds carry no means: results written before this split existed)."""
    over = [(i, o) for i, o in enumerate(res["overhead"])
            if o.get("router_upstream_mean") is not None and o.get("direct_mean")]
    if not over:
        return []
    ms = lambda x: fmt(None if x is None else 1000 * x, 2)  # noqa: E731
    ref = res.get("reference")
    parts = {"router": [], "router_engine": [], "ref": [], "ref_engine": []}
    rows = []
    for i, o in over:                   # i: the round's own number (a round without means is left out)
        own = _minus(o["router_mean"], o["router_upstream_mean"])
        eng = _minus(o["router_upstream_mean"], o["direct_mean"])
        parts["router"].append(own)
        parts["router_engine"].append(eng)
        row = [i + 1, ms(o["direct_mean"]), ms(o["router_mean"]), ms(o["router_upstream_mean"]), ms(own), ms(eng)]
        if ref:
            r_own = _minus(o.get("reference_mean"), o.get("reference_upstream_mean"))
            r_eng = _minus(o.get("reference_upstream_mean"), o["direct_mean"])
            parts["ref"].append(r_own)
            parts["ref_engine"].append(r_eng)
            row += [ms(o.get("reference_mean")), ms(o.get("reference_upstream_mean")), ms(r_own), ms(r_eng)]
        rows.append(row)
    med = {k: (percentile([v for v in vals if v is not None], 50) if any(v is not None for v in vals) else None)
           for k, vals in parts.items()}
    cols = ["round", "direct mean", "router mean", "engine as the router saw it", "router's part", "engine's part"]
    if ref:
        cols += ["reference mean", "engine as the reference saw it (%Tr)", "reference's part", "engine's part (ref.)"]
    return [
        "Where the added time goes (means, ms; *engine as the router saw it* = the mean of"
        " `inferctl_router_upstream_latency_seconds`, request sent → first body byte"
        + ("; for the reference, HAProxy's `%Tr`, request sent → response headers, whole ms" if ref else "")
        + "; *part* = client mean − engine as the proxy saw it, and engine as the proxy saw it − direct mean):",
        "",
        md_table(cols, rows),
        "",
        f"Medians over the rounds: the router's part **{ms(med['router'])} ms**, the engine's part"
        f" **{ms(med['router_engine'])} ms**"
        + (f"; {ref}: its part **{ms(med['ref'])} ms**, the engine's part **{ms(med['ref_engine'])} ms**"
           if ref else "")
        + ". The engine's part is the engine answering the same load more slowly (positive) or faster (negative)"
        " when it arrives through a proxy (no proxy code runs in it).",
        "",
    ]


def render(res: dict, uptime: str, facts: dict | None = None) -> str:
    """The markdown body of the ``router`` section (``facts``: :func:`bench.common.machine_facts`
    at the start, for the load sentence)."""
    facts = facts or machine_facts()
    ms = lambda x: fmt(None if x is None else 1000 * x, 2)  # noqa: E731
    tp = res["throughput"]
    base = tp["r1"]["tok_s"]
    aff = res["affinity"]
    busy = bool(facts.get("cpus")) and facts["load_1m"] > facts["cpus"]

    def med(runs: list, key: str):
        vals = [r[key] for r in runs if r[key] is not None]
        return percentile(vals, 50) if vals else None

    a_p50, b_p50 = med(aff["runs"]["aff"], "ttft_p50"), med(aff["runs"]["off"], "ttft_p50")
    a_mean, b_mean = med(aff["runs"]["aff"], "ttft_mean"), med(aff["runs"]["off"], "ttft_mean")
    gain = None if not (a_p50 and b_p50) else 1 - a_p50 / b_p50
    gain_mean = None if not (a_mean and b_mean) else 1 - a_mean / b_mean
    later = by_turn_table(aff)[1]
    aff_rows = []
    for name, label in (("aff", "prefix affinity (default)"),
                        ("off", "affinity off (`--affinity-min-chars 1000000`: least load, rotating ties)")):
        for r in aff["runs"][name]:
            hit = None if not r["cache_queried"] else 100 * r["cache_hit"] / r["cache_queried"]
            aff_rows.append([label, r["run"], ms(r["ttft_p50"]), ms(r["ttft_p99"]), ms(r["ttft_mean"]), r["n"],
                             r["empty"], r["errors"], fmt(hit), r["replicas"], fmt(r["wall"])])
    return "\n".join([
        load_sentence(uptime, facts["load_1m"], facts.get("cpus")),
        "",
        OVERHEAD_START,
        render_overhead(res, busy),
        OVERHEAD_END,
        "",
        f"**Aggregate throughput** through the router, 32 clients, non-streamed, `max_tokens` 32, prompt"
        " `Once upon a time` (16 characters: least-load routing),"
        f" {res['tp_seconds']:g} s each, one run each:",
        "",
        md_table(["replicas", "generated tok/s", "req/s", "× 1 replica", "p50 latency (ms)", "errors"],
                 [[i + 1, fmt(tp[k]["tok_s"]), fmt(tp[k]["req_s"]), fmt(tp[k]["tok_s"] / base, 2),
                   ms(tp[k]["p50"]), tp[k]["errors"]] for i, k in enumerate(("r1", "r2", "r3"))]),
        "",
        "Replicas on one machine share the same cores (each engine runs with 1 torch thread), so they"
        " add no compute: splitting 32 clients over more engines only shrinks each engine's batch (its cost per"
        " token rises: a batched step over 32 sequences costs little more than over 11) and adds processes"
        " competing for the cores. Throughput scaling with replicas needs one replica per GPU or per core set.",
        "",
        f"**Prefix affinity vs affinity off**, 3 replicas of {aff['model']} (prefix caching on, memory budget"
        f" {aff.get('memory_budget', '1GiB')} each),"
        f" {aff['chats']} concurrent chats × {aff['turns']} turns (streamed, `max_tokens` {aff['max_tokens']})"
        f" in {aff['groups']} groups, each group's chats sharing a {aff['system_chars']:,}-character system prompt"
        f" (a passage of {BOOK}, about {aff['system_chars'] // 4:,} tokens); runs alternated, each on passages no"
        " earlier run used (cold caches); *cached* = prompt tokens the engines found in their prefix caches ÷"
        " prompt tokens looked up, during the run (TTFT in ms, wall in s):",
        "",
        md_table(["routing", "run", "TTFT p50", "TTFT p99", "TTFT mean", "turns timed", "empty answers", "errors",
                  "cached %", "answers per replica", "wall"], aff_rows),
        "",
        "An empty answer is a 200 stream whose model ended before any text (no first token to time); it is"
        " kept in the conversation as an empty assistant turn. Errors are non-200 answers.",
        "",
        "TTFT and cached share by turn (turns in lockstep: turn t of every chat starts when every chat ended"
        " turn t − 1, and the engines' prefix-cache counters are read between turns; medians of the runs):",
        "",
        by_turn_table(aff)[0],
        "",
        f"TTFT with affinity: **{fmt(None if gain is None else 100 * gain)} % lower p50**, "
        f"{fmt(None if gain_mean is None else 100 * gain_mean)} % lower mean over every turn; turns 2 and later: "
        f"**{fmt(None if later['later_p50'] is None else 100 * later['later_p50'])} % lower p50**, "
        f"{fmt(None if later['later_mean'] is None else 100 * later['later_mean'])} % lower mean (median over the"
        " runs; negative: higher). With affinity a group's system prompt is prefilled once, on its home replica,"
        " and every later turn of the group finds it cached; without, the rotating least-load rule spreads a"
        " group over all three replicas and each of them prefills the long prompt cold once (SGLang's"
        " cache-aware router reports 70–75 % lower TTFT on such workloads).",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=_positive, default=5)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--per-client", type=int, default=16)
    ap.add_argument("--tp-seconds", type=float, default=6.0)
    ap.add_argument("--chats", type=int, default=6, help="Concurrent chats of the affinity runs.")
    ap.add_argument("--groups", type=int, default=3, help="System prompts (chat groups) of the affinity runs.")
    ap.add_argument("--turns", type=int, default=3, help="Turns per chat (at most 4).")
    ap.add_argument("--system-chars", type=int, default=6000, help="Characters of each system prompt.")
    ap.add_argument("--aff-runs", type=int, default=1, help="Alternated runs of affinity on / off.")
    ap.add_argument("--chat-memory-budget", default=CHAT_MEMORY_BUDGET,
                    help="Each chat engine's --memory-budget (1GiB: 3,696 KV tokens for SmolLM2; smaller: more "
                         "cache pressure).")
    ap.add_argument("--no-pin", action="store_true",
                    help="Overhead part: leave every process on every CPU (default: client + engine on one CPU, "
                         "the router on another).")
    ap.add_argument("--reference-proxy", default="auto", metavar="auto|none|PATH",
                    help="Overhead part: also measure HAProxy (a compiled proxy, bench/reference_proxy.py) in front "
                         "of the same engine in the same rounds, placed as the router: auto (default) uses it when "
                         "installed (Debian package haproxy), none skips it, or the binary's path.")
    ap.add_argument("--router-data-plane", choices=("python", "haproxy"), default="python",
                    help="Overhead part: the router's --data-plane (haproxy: HAProxy carries the requests).")
    ap.add_argument("--upstream", choices=("engine", "stub"), default="engine",
                    help="Overhead part: what stands behind the router: the real engine, or bench/stub_upstream.py "
                         "(a fixed answer time: the low-noise reading of what the router adds).")
    ap.add_argument("--stub-delay-ms", type=float, default=50.0, help="The stub's answer time (ms).")
    ap.add_argument("--stub-step-ms", type=float, default=0.0,
                    help="The stub's answers leave at multiples of this, as after an engine's step (ms; 0: none).")
    ap.add_argument("--engine-device", default=None, help="Overhead part: the engine's --device (default: its auto).")
    ap.add_argument("--write", action="store_true", help="Write the router section of docs/benchmarks.md.")
    ap.add_argument("--overhead-only", action="store_true",
                    help="Run only the overhead part (section 1: one engine, one router; pinned unless --no-pin) "
                         "and print it; with --write, replace only that part of the router section.")
    ap.add_argument("--affinity-only", action="store_true",
                    help="Run only the affinity part (section 3) and print its runs; never writes.")
    args = ap.parse_args(argv)
    if args.router_data_plane != "python" and not args.overhead_only:
        ap.error("--router-data-plane: only the overhead part measures another data plane (add --overhead-only)")
    if args.upstream != "engine" and not args.overhead_only:
        ap.error("--upstream stub: only the overhead part runs against the stub (add --overhead-only)")
    if args.stub_delay_ms < 0 or args.stub_step_ms < 0:
        ap.error(f"--stub-delay-ms / --stub-step-ms: must be >= 0, got {args.stub_delay_ms:g} / {args.stub_step_ms:g}")
    try:
        haproxy = find_haproxy(args.reference_proxy)
    except FileNotFoundError as exc:
        ap.error(str(exc))
    facts = machine_facts()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    t = time.time()
    if args.overhead_only:
        ov = run_overhead(args.rounds, args.clients, args.per_client, pin=not args.no_pin,
                          haproxy=haproxy, engine_device=args.engine_device, data_plane=args.router_data_plane,
                          stub_delay_ms=args.stub_delay_ms if args.upstream == "stub" else None,
                          stub_step_ms=args.stub_step_ms)
        busy = bool(facts.get("cpus")) and facts["load_1m"] > facts["cpus"]
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        flag = "" if args.router_data_plane == "python" else f" --router-data-plane {args.router_data_plane}"
        if args.upstream == "stub":
            flag += f" --upstream stub --stub-delay-ms {args.stub_delay_ms:g} --stub-step-ms {args.stub_step_ms:g}"
        upstream = "stub" if args.upstream == "stub" else "engine"
        block = (f"Part 1 re-run alone: `python -m bench.router --overhead-only{flag}` (one {upstream}, one router),"
                 " finished"
                 f" {when}; `uptime` at the start: `{uptime}`.\n\n" + render_overhead(ov, busy)
                 + f"\n\nWall time of the overhead part: {time.time() - t:.0f} s.")
        print(json.dumps(ov, indent=1, default=str))
        print(block)
        if args.write:
            DOC.write_text(replace_overhead(DOC.read_text(encoding="utf-8"), block, keep=True), encoding="utf-8")
        return 0
    if args.affinity_only:
        workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-router-{os.getpid()}"
        workdir.mkdir(parents=True, exist_ok=True)
        aff = affinity(workdir, args.chats, args.groups, min(args.turns, len(TURNS)), args.system_chars,
                       args.aff_runs, memory_budget=args.chat_memory_budget)
        print(json.dumps(aff, indent=1, default=str))
        print(uptime)
        print(affinity_summary(aff) + f"\n\nWall time: {time.time() - t:.0f} s.")
        return 0
    res = run(args.rounds, args.clients, args.per_client, args.tp_seconds, args.chats, args.groups,
              min(args.turns, len(TURNS)), args.system_chars, args.aff_runs, pin=not args.no_pin,
              chat_memory_budget=args.chat_memory_budget, haproxy=haproxy, engine_device=args.engine_device)
    body = render(res, uptime, facts) + f"\n\nWall time of the whole run: {time.time() - t:.0f} s."
    print(json.dumps(res, indent=1, default=str))
    print(body)
    if args.write:
        write_section("router", section("router", "Router: overhead, throughput over replicas, prefix affinity",
                                         body, facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
