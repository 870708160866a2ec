"""Controller cost: one reconcile tick over N engines and N/4 GPUs, and the /metrics render.

    python -m bench.controller_tick [--engines 64,256,1024] [--ticks 10] [--models aiohttp,threads]

The controller is assembled as ``inferctl up`` does (``controller.runtime.build_policies``: precision,
fragmentation, breaker off, hardware) over REAL engine clients polling over loopback HTTP: a
fake fleet in a child process (``--serve``: one aiohttp server listening on one free port per
engine, picked by the OS, so two runs never collide) answers with recorded data: half the engines
are bundled engines whose ``/stats`` and ``/metrics`` are a real engine's (an in-process stories260K
engine after a few requests; its ``/stats`` carries the latency histograms, so the controller
makes one GET per poll; ``--old-stats`` strips them, as an engine before them answered, so the
controller also fetches and parses ``/metrics``), half are vLLM engines whose
``/metrics`` is one of the real captures of ``../shared/fixtures/vllm/metrics_samples.txt`` in
turn. The GPU source replays the real 8×H100 ``nvidia-smi -q`` capture
(``../shared/fixtures/gpu/nvsmi_q_h100x8_535.161.08.txt``) cloned to N/4 GPUs with distinct
UUIDs, indices and bus ids. Each engine runs on GPU ``i % gpus``.

Polling models (``--models``): ``aiohttp`` = the controller's model (every engine's poll a task
on one event loop with one aiohttp connection pool, controller/scrape/aio.py); ``threads`` = the
model before it (each engine's poll in its own worker thread through its own ``httpx.Client``).

One tick = ``Controller.tick(now)``: poll every source and reconcile (signals → policies →
events). Measured in the controller's process only (the fleet's CPU is another process):
CPU time per tick (``time.process_time``: every thread of the process, less disturbed by
other load on the machine than wall time), best and median over ``--ticks`` ticks after 3
warm-up ticks; then the ``/metrics`` render as the API serves it
(``controller.exposition.FleetExposition``; its first render apart) beside
``prometheus_client.generate_latest`` of the same registry (the bodies must be equal), CPU time
and size. ``--probe N`` also times N raw GETs with each HTTP client
(aiohttp, httpx ``AsyncClient``, httpx sync in threads). Target: a tick <= 250 ms CPU at 1,024
engines, /metrics <= 100 ms. Writes the section ``controller`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import FIXTURES, STORIES_BIN, machine_facts, md_table, section, write_section

TARGET_TICK_CPU_SECONDS = 0.250
TARGET_RENDER_SECONDS = 0.100
#: The real 8×H100 ``nvidia-smi -q`` capture the GPU source replays.
H100_CAPTURE = FIXTURES / "gpu" / "nvsmi_q_h100x8_535.161.08.txt"


def bundled_engine_bodies() -> tuple[dict, bytes]:
    """A real engine's ``/stats`` document and ``/metrics`` text: stories260K, 8 requests served
    in-process."""
    from prometheus_client import generate_latest

    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.loader import load_model
    from inferctl.engine.sampling_params import SamplingParams

    eng = LLMEngine(load_model(STORIES_BIN), EngineConfig(num_threads=1))
    ids = eng.tokenizer.encode("Once upon a time, there was a little girl", bos=True)
    for i in range(8):
        eng.add_request(f"r{i}", ids, SamplingParams(max_tokens=24, temperature=0.8, seed=i))
    while eng.has_unfinished_requests():
        eng.step()
    return eng.stats(), generate_latest(eng.registry)


def raise_file_limit() -> None:
    """One socket per engine on each side: lift the soft open-file limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def payloads(n_engines: int, old_stats: bool = False) -> list[tuple[str, dict[str, str]]]:
    """Per engine: (kind, {path: body}): a bundled engine's ``/stats`` JSON and ``/metrics`` text
    (``old_stats``: its ``/stats`` without the latency histograms, as an older engine's), a vLLM
    engine's ``/metrics``. The engine runs in a child process (``--engine-bodies``): the measured
    process must not carry torch's objects (hundreds of thousands, which every full garbage
    collection of the controller's would walk; a real controller never imports the engine)."""
    out = subprocess.run([sys.executable, "-m", "bench.controller_tick", "--engine-bodies"], check=True,
                         capture_output=True, cwd=str(Path(__file__).resolve().parents[1])).stdout
    doc, metrics = json.loads(out.decode().strip().splitlines()[-1])
    if old_stats:
        doc["requests"].pop("latency_histograms", None)
        doc.pop("latency_histograms_by_model", None)
    bundled = {"/stats": json.dumps(doc), "/metrics": metrics}
    vllm_text = (FIXTURES / "vllm" / "metrics_samples.txt").read_text()
    blocks = ["# SOURCE" + b for b in vllm_text.split("# SOURCE")[1:]]
    return [("bundled", bundled) if i % 2 == 0 else ("vllm", {"/metrics": blocks[(i // 2) % len(blocks)]})
            for i in range(n_engines)]


def serve(n_engines: int, bodies_path: str) -> None:
    """The fake fleet (child process): one aiohttp server per engine, each on a free loopback port
    the OS picks, answering its recorded bodies; prints ``ready [ports]`` when all listen."""
    import socket

    from aiohttp import web

    raise_file_limit()
    bodies = json.loads(Path(bodies_path).read_text())

    def answer(body: bytes, ctype: str):
        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type=ctype)
        return handler

    async def main() -> None:
        runners, ports = [], []
        for i in range(n_engines):
            app = web.Application()
            for path, body in bodies[i][1].items():
                ctype = "application/json" if path == "/stats" else "text/plain"
                app.router.add_get(path, answer(body.encode(), ctype))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
            await web.SockSite(runner, sock, backlog=128).start()
            runners.append(runner)
        print("ready " + json.dumps(ports), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


class Fleet:
    """The fake fleet's child process (context manager); ``urls`` one per engine."""

    def __init__(self, n_engines: int, workdir: Path, old_stats: bool = False) -> None:
        self.kinds = payloads(n_engines, old_stats)
        bodies = workdir / "bodies.json"
        bodies.write_text(json.dumps(self.kinds))
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.controller_tick", "--serve", str(n_engines),
                                      "--bodies", str(bodies)],
                                     stdout=subprocess.PIPE, cwd=str(Path(__file__).resolve().parents[1]))
        line = self.proc.stdout.readline()
        if not line.startswith(b"ready "):
            self.close()
            raise RuntimeError(f"fake fleet did not start: {line!r}")
        self.urls = [f"http://127.0.0.1:{port}" for port in json.loads(line[len(b"ready "):])]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gpu_reading(n: int):
    """``n`` GPUs cloned from the real 8×H100 capture."""
    from inferctl.controller.gpu.parsers import parse_smi_q
    from inferctl.controller.types import GpuReading

    cap = parse_smi_q(H100_CAPTURE.read_text())
    gpus = {}
    for i in range(n):
        g = copy.deepcopy(cap.gpus[i % len(cap.gpus)])
        g.index = i
        g.uuid = f"GPU-{i:08x}-bench-0000-0000-000000000000"
        g.pci_bus_id = f"00000000:{i // 8:02X}:{i % 8:02X}.0"
        gpus[g.uuid] = g
    return GpuReading(source="replay", ok=True, gpus=gpus, time=time.time())


def build_controller(fleet: Fleet, n_gpus: int, workdir: Path, model: str):
    """The controller over the fleet's engines and the replayed GPUs (see the module doc)."""
    from inferctl.controller.actions import Actions
    from inferctl.controller.config import parse_config
    from inferctl.controller.engines import make_engine_client
    from inferctl.controller.events import EventLog
    from inferctl.controller.gpu.replay import ReplayGpuSource
    from inferctl.controller.loop import Controller
    from inferctl.controller.metrics import build_registry
    from inferctl.controller.signals import InvalidSampleCounter
    from inferctl.controller.state import ControllerState
    from inferctl.controller.runtime import build_policies

    engines = [{"name": f"e{i:04d}", "kind": kind, "url": url, "gpu": i % n_gpus}
               for i, ((kind, _), url) in enumerate(zip(fleet.kinds, fleet.urls))]
    # the configuration names the real capture (a replay source needs a path); the loop gets
    # the source built below, which replays that capture cloned to ``n_gpus`` GPUs
    cfg = parse_config({"engines": engines, "gpu": {"kind": "replay", "options": {"path": str(H100_CAPTURE)}},
                        "event_log": str(workdir / "events.db"), "policies": {"breaker": {"enabled": False}}})
    timeout = cfg.intervals.call_timeout_seconds
    clients = {e.name: make_engine_client(e.kind, e.name, e.url, timeout_s=timeout) for e in cfg.engines}
    if model == "threads":            # the model before: a worker thread and an httpx.Client per engine
        for c in clients.values():
            c.supports_async = False
    registry, metrics = build_registry()
    log = EventLog(str(workdir / "events.db"), metrics=metrics)
    gpu_source = ReplayGpuSource(captures=[gpu_reading(n_gpus)], mode="step")
    counter = InvalidSampleCounter()
    policies, gpu_policies = build_policies(cfg, counter)
    state = ControllerState.for_config(cfg)   # the last readings, shared by the loop and the actions
    actions = Actions(clients, {}, None, log, metrics, engine_gpus={e.name: e.gpu for e in cfg.engines},
                      state=state)
    ctl = Controller(cfg, clients, gpu_source, policies, actions, log, metrics, registry=registry,
                     gpu_policies=gpu_policies, counter=counter, state=state)
    return ctl, registry, log, clients


def measure(fleet: Fleet, n_gpus: int, ticks: int, model: str, workdir: Path, profile: str | None = None,
            no_freeze: bool = False) -> dict:
    """Tick and render numbers (seconds, bytes) for one polling model. ``profile``: cProfile the
    measured ticks (the tick's thread and the poller's loop thread, one profile each) into
    ``profile`` + ``.tick`` / ``.loop`` (pstats files). ``no_freeze``: leave the start-up heap in
    the garbage collector's generations and its thresholds as they are (controller/heap.py; the
    default freezes it and raises the young threshold as the controller's ``serve`` does)."""
    from prometheus_client import generate_latest

    from inferctl.controller.exposition import FleetExposition

    from inferctl.controller.heap import freeze_startup_heap

    ctl, registry, log, clients = build_controller(fleet, n_gpus, workdir, model)
    try:
        if not no_freeze:
            freeze_startup_heap()       # as controller.up.serve does before the controller starts
        now = time.time()
        for _ in range(3):
            now += 1.0
            ctl.tick(now)
        cpu, wall, decisions = [], [], 0
        profiles = _start_profiles(ctl) if profile else None
        for _ in range(ticks):
            now += 1.0
            c0, w0 = time.process_time(), time.perf_counter()
            decisions += len(ctl.tick(now))
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        if profiles:
            _stop_profiles(ctl, profiles, profile)
        up = sum(1 for s in ctl.state.latest.values() if s.ok)
        poll_cpu, rec_cpu = [], []
        for _ in range(max(3, ticks // 2)):
            now += 1.0
            c0 = time.process_time()
            ctl.poll_gpu(now, force=True)
            ctl.sources.poll_engines(now, force=True)
            c1 = time.process_time()
            decisions += len(ctl.reconcile(now))
            poll_cpu.append(c1 - c0)
            rec_cpu.append(time.process_time() - c1)
        # /metrics as the API serves it (controller/exposition.py), its first (cold) render apart,
        # and prometheus-client's generate_latest of the same registry for comparison
        exposition = FleetExposition(registry)
        c0 = time.process_time()
        body = exposition.render()
        render_first = time.process_time() - c0
        renders, plain, size = [], [], 0
        for _ in range(max(5, ticks // 2)):
            c0 = time.process_time()
            body = exposition.render()
            renders.append(time.process_time() - c0)
            c0 = time.process_time()
            plain_body = generate_latest(registry)
            plain.append(time.process_time() - c0)
            size = len(body)
        if plain_body != body:
            raise RuntimeError("the /metrics body differs from generate_latest's")
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        return {"model": model, "engines": len(fleet.urls), "gpus": n_gpus, "ticks": ticks, "up": up,
                "decisions": decisions, "tick_cpu_best_s": min(cpu), "tick_cpu_median_s": statistics.median(cpu),
                "tick_wall_median_s": statistics.median(wall), "poll_cpu_median_s": statistics.median(poll_cpu),
                "reconcile_cpu_median_s": statistics.median(rec_cpu), "render_best_s": min(renders),
                "render_median_s": statistics.median(renders), "render_first_s": render_first,
                "render_generate_latest_best_s": min(plain), "metrics_bytes": size, "metrics_series": series,
                "threads": len(__import__("threading").enumerate())}
    finally:
        ctl.stop()
        log.close()
        for c in clients.values():
            c.close()


def _start_profiles(ctl) -> tuple:
    """A ``cProfile.Profile`` enabled in this (the tick's) thread and one in the poller's loop thread."""
    import cProfile

    tick, loop = cProfile.Profile(), cProfile.Profile()
    poller = ctl.sources.poller

    async def enable() -> None:
        loop.enable()
    if poller is not None:
        poller.submit(enable()).result(10)
    tick.enable()
    return tick, loop


def _stop_profiles(ctl, profiles: tuple, path: str) -> None:
    tick, loop = profiles
    tick.disable()

    async def disable() -> None:
        loop.disable()
    if ctl.sources.poller is not None:
        ctl.sources.poller.submit(disable()).result(10)
    tick.dump_stats(path + ".tick")
    loop.dump_stats(path + ".loop")
    print(f"profiles: {path}.tick {path}.loop", flush=True)


def probe(fleet: Fleet, reps: int = 3) -> list[list[str]]:
    """CPU of one GET to every fleet engine with each HTTP client (best of ``reps``)."""
    import concurrent.futures as cf

    import aiohttp
    import httpx

    urls = [u + ("/stats" if k == "bundled" else "/metrics") for (k, _), u in zip(fleet.kinds, fleet.urls)]

    def best(fn) -> tuple[float, int]:
        runs = []
        for _ in range(reps + 1):            # the first run opens the connections
            c0 = time.process_time()
            errors = fn()
            runs.append((time.process_time() - c0, errors))
        return min(runs[1:])

    rows = []
    clients = [httpx.Client(timeout=10) for _ in urls]
    pools = [cf.ThreadPoolExecutor(1) for _ in urls]

    def threads() -> int:
        futs = [p.submit(lambda c=c, u=u: c.get(u).content) for p, c, u in zip(pools, clients, urls)]
        return sum(1 for f in futs if f.exception() is not None)
    cpu, err = best(threads)
    rows.append(["httpx sync, one thread + client per engine (before)", f"{1000 * cpu:.0f} ms", str(err)])
    for c in clients:
        c.close()
    for p in pools:
        p.shutdown()
    loop = asyncio.new_event_loop()

    async def hx_round(client) -> int:
        res = await asyncio.gather(*(client.get(u) for u in urls), return_exceptions=True)
        return sum(1 for r in res if isinstance(r, Exception))
    hx = httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))
    cpu, err = best(lambda: loop.run_until_complete(hx_round(hx)))
    rows.append(["httpx AsyncClient, one event loop", f"{1000 * cpu:.0f} ms", str(err)])
    loop.run_until_complete(hx.aclose())

    async def ah_round(session) -> int:
        async def one(u):
            async with session.get(u) as r:
                return await r.read()
        res = await asyncio.gather(*(one(u) for u in urls), return_exceptions=True)
        return sum(1 for r in res if isinstance(r, Exception))

    async def mk():
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    session = loop.run_until_complete(mk())
    cpu, err = best(lambda: loop.run_until_complete(ah_round(session)))
    rows.append(["aiohttp, one event loop (chosen)", f"{1000 * cpu:.0f} ms", str(err)])
    loop.run_until_complete(session.close())
    loop.close()
    return rows


def render(results: list[dict], probe_rows: list[list[str]] | None, probe_n: int) -> str:
    rows = []
    for r in results:
        rows.append([f"{r['engines']:,} / {r['gpus']}", r["model"], f"{r['up']}/{r['engines']}",
                     f"{1000 * r['tick_cpu_best_s']:.0f} ms", f"{1000 * r['tick_cpu_median_s']:.0f} ms",
                     f"{1000 * r['poll_cpu_median_s']:.0f} ms", f"{1000 * r['reconcile_cpu_median_s']:.0f} ms",
                     f"{1000 * r['tick_wall_median_s']:.0f} ms", str(r["threads"]),
                     f"{1000 * r['render_best_s']:.0f} ms ({1000 * r['render_first_s']:.0f} ms first)",
                     f"{1000 * r['render_generate_latest_best_s']:.0f} ms",
                     f"{r['metrics_series']:,} / {r['metrics_bytes'] / 1e6:.2f} MB"])
    out = ("Engines polled over loopback HTTP (half bundled `/stats`, half vLLM `/metrics` captures) from a fake fleet "
           "in a child process; GPUs: the replayed H100 capture. CPU is the controller process's only "
           f"(`time.process_time`). {results[0]['ticks']} ticks after 3 warm-up ticks per row.\n\n"
           + md_table(["engines / GPUs", "polling model", "engines up", "tick CPU best", "tick CPU median",
                       "of which polls", "of which reconcile", "tick wall", "threads", "/metrics render CPU best",
                       "generate_latest CPU best", "series / size"], rows))
    big = [r for r in results if r["model"] == "aiohttp"]
    if big:
        r = max(big, key=lambda x: x["engines"])
        out += (f"\n\n- Tick CPU at {r['engines']:,} engines: {1000 * r['tick_cpu_best_s']:.0f} ms best, "
                f"{1000 * r['tick_cpu_median_s']:.0f} ms median (target ≤ {1000 * TARGET_TICK_CPU_SECONDS:.0f} ms: "
                f"{'met' if r['tick_cpu_median_s'] <= TARGET_TICK_CPU_SECONDS else 'NOT met'}); /metrics render "
                f"{1000 * r['render_best_s']:.0f} ms (target ≤ {1000 * TARGET_RENDER_SECONDS:.0f} ms: "
                f"{'met' if r['render_best_s'] <= TARGET_RENDER_SECONDS else 'NOT met'}).")
    if probe_rows:
        out += (f"\n\nHTTP clients alone: one GET to each of {probe_n} fleet engines, CPU of the client process, "
                "best of 3 after a warm-up round:\n\n" + md_table(["client", "CPU", "errors"], probe_rows))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="64,256,1024", help="comma-separated engine counts (GPUs = engines / 4)")
    ap.add_argument("--ticks", type=int, default=10)
    ap.add_argument("--models", default="aiohttp,threads",
                    help="polling models: aiohttp (one event loop), threads (a thread + httpx.Client per engine)")
    ap.add_argument("--threads-max", type=int, default=256, help="largest fleet the threads model is run on")
    ap.add_argument("--probe", type=int, default=256, help="engines for the raw HTTP client probe (0: skip)")
    ap.add_argument("--old-stats", action="store_true",
                    help="bundled engines answer /stats without the latency histograms (an older engine): "
                         "the controller also fetches /metrics from each")
    ap.add_argument("--profile", metavar="FILE",
                    help="cProfile the measured ticks of the largest fleet's first model into FILE (pstats)")
    ap.add_argument("--no-freeze", action="store_true",
                    help="do not freeze the start-up heap nor raise the collector's young threshold "
                         "(controller/heap.py) before the ticks")
    ap.add_argument("--quick", action="store_true", help="smoke test: no doc write")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--bodies", help=argparse.SUPPRESS)
    ap.add_argument("--engine-bodies", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.engine_bodies:
        doc, metrics = bundled_engine_bodies()
        print(json.dumps([doc, metrics.decode()]))
        return 0
    if a.serve:
        serve(a.serve, a.bodies)
        return 0
    raise_file_limit()
    facts = machine_facts()
    sizes = [int(x) for x in a.engines.split(",") if x.strip()]
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    results, probe_rows = [], None
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp, Fleet(n, Path(tmp), a.old_stats) as fleet:
            for model in models:
                if model == "threads" and n > a.threads_max:
                    continue
                prof = a.profile if a.profile and n == max(sizes) and model == models[0] else None
                r = measure(fleet, max(1, n // 4), a.ticks, model, Path(tmp) / model, prof, a.no_freeze)
                print(json.dumps(r), flush=True)
                results.append(r)
            if a.probe and n == a.probe:
                probe_rows = probe(fleet)
                print(probe_rows, flush=True)
    body = render(results, probe_rows, a.probe)
    print(body)
    if not (a.quick or a.no_write):
        write_section("controller", section("controller", "Controller: reconcile tick and /metrics render", body,
                                            facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
