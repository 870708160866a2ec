"""Controller cost: one reconcile tick over 256 engines and 64 GPUs, and the /metrics render.

    python -m bench.controller_tick [--engines 256] [--gpus 64] [--ticks 20]

The controller is assembled as ``inferctl up`` does (``controller.up.build_policies``: precision,
fragmentation, breaker off, hardware), with engine clients that answer from recorded data
instead of the network: half the engines parse a real bundled-engine ``/stats`` document
(taken from an in-process stories260K engine after a few requests) through
``snapshot_from_stats``, half parse the real vLLM ``/metrics`` captures of
``../shared/fixtures/vllm/metrics_samples.txt`` (its four sources in turn) through
``snapshot_from_metrics_text``; the GPU source replays the real 8×H100 ``nvidia-smi -q``
capture (``../shared/fixtures/gpu/nvsmi_q_h100x8_535.161.08.txt``) cloned to ``--gpus`` GPUs
with distinct UUIDs, indices and bus ids. Each engine runs on GPU ``i % gpus``.

One tick = ``Controller.tick(now)``: poll every source (each poll in its own worker thread,
as in production) and reconcile (signals → policies → events). Measured: CPU time per tick
(``time.process_time``, all threads of the process) and wall time, median and max over
``--ticks`` ticks after 3 warm-up ticks; then the ``/metrics`` render
(``prometheus_client.generate_latest`` of the controller registry) time and size.
Target: a tick <= 100 ms CPU. Writes the section ``controller`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import FIXTURES, STORIES_BIN, machine_facts, md_table, section, write_section

TARGET_TICK_CPU_SECONDS = 0.100
#: The real 8×H100 ``nvidia-smi -q`` capture the GPU source replays.
H100_CAPTURE = FIXTURES / "gpu" / "nvsmi_q_h100x8_535.161.08.txt"


def bundled_stats_doc() -> dict:
    """A real ``/stats`` document: stories260K, 8 requests served in-process."""
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
    return eng.stats()


class RecordedEngine:
    """An engine client that parses a recorded answer on every poll (no network)."""

    def __init__(self, name: str, kind: str, payload) -> None:
        self.name, self.kind, self.payload = name, kind, payload
        self.base_url = f"http://recorded/{name}"

    def poll(self, now: float):
        from inferctl.controller.engines import snapshot_from_metrics_text, snapshot_from_stats

        if self.kind == "bundled":
            return snapshot_from_stats(copy.deepcopy(self.payload), name=self.name, now=now)
        return snapshot_from_metrics_text(self.payload, name=self.name, flavor=self.kind, now=now)

    def close(self) -> None:
        pass


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


def build_controller(n_engines: int, n_gpus: int, workdir: Path):
    """The controller over recorded engines and the replayed GPUs (see the module doc)."""
    from inferctl.controller.actions import Actions
    from inferctl.controller.config import parse_config
    from inferctl.controller.events import EventLog
    from inferctl.controller.gpu.replay import ReplayGpuSource
    from inferctl.controller.loop import Controller
    from inferctl.controller.metrics import build_registry
    from inferctl.controller.signals import InvalidSampleCounter
    from inferctl.controller.state import ControllerState
    from inferctl.controller.up import build_policies

    stats = bundled_stats_doc()
    vllm_text = (FIXTURES / "vllm" / "metrics_samples.txt").read_text()
    blocks = ["# SOURCE" + b for b in vllm_text.split("# SOURCE")[1:]]
    engines = []
    for i in range(n_engines):
        kind = "bundled" if i % 2 == 0 else "vllm"
        engines.append({"name": f"e{i:03d}", "kind": kind, "url": f"http://127.0.0.1:{20000 + i}", "gpu": i % n_gpus})
    # the configuration names the real capture (a replay source needs a path); the loop gets
    # the source built below, which replays that capture cloned to ``n_gpus`` GPUs
    cfg = parse_config({"engines": engines, "gpu": {"kind": "replay", "options": {"path": str(H100_CAPTURE)}},
                        "event_log": str(workdir / "events.db"), "policies": {"breaker": {"enabled": False}}})
    clients = {}
    for i, e in enumerate(cfg.engines):
        payload = stats if e.kind == "bundled" else blocks[(i // 2) % len(blocks)]
        clients[e.name] = RecordedEngine(e.name, e.kind, payload)
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
    return ctl, registry, log


def measure(n_engines: int, n_gpus: int, ticks: int) -> dict:
    """Tick and render numbers (seconds, bytes)."""
    from prometheus_client import generate_latest

    with tempfile.TemporaryDirectory() as tmp:
        ctl, registry, log = build_controller(n_engines, n_gpus, Path(tmp))
        try:
            now = time.time()
            for _ in range(3):
                now += 1.0
                ctl.tick(now)
            cpu, wall, decisions = [], [], 0
            for _ in range(ticks):
                now += 1.0
                c0, w0 = time.process_time(), time.perf_counter()
                decisions += len(ctl.tick(now))
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
            poll_cpu, rec_cpu = [], []
            for _ in range(ticks):
                now += 1.0
                c0 = time.process_time()
                ctl.poll_gpu(now, force=True)
                for name in ctl.engines:
                    ctl.poll_engine(name, now, reconcile=False, force=True)
                c1 = time.process_time()
                decisions += len(ctl.reconcile(now))
                poll_cpu.append(c1 - c0)
                rec_cpu.append(time.process_time() - c1)
            renders, size = [], 0
            for _ in range(max(5, ticks // 2)):
                w0 = time.perf_counter()
                body = generate_latest(registry)
                renders.append(time.perf_counter() - w0)
                size = len(body)
            series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
            status_t0 = time.perf_counter()
            ctl.status()
            status_s = time.perf_counter() - status_t0
            return {"engines": n_engines, "gpus": n_gpus, "ticks": ticks, "decisions": decisions,
                    "tick_cpu_median_s": statistics.median(cpu), "tick_cpu_max_s": max(cpu),
                    "tick_wall_median_s": statistics.median(wall), "tick_wall_max_s": max(wall),
                    "poll_cpu_median_s": statistics.median(poll_cpu),
                    "reconcile_cpu_median_s": statistics.median(rec_cpu),
                    "render_median_s": statistics.median(renders), "render_max_s": max(renders),
                    "metrics_bytes": size, "metrics_series": series, "status_s": status_s,
                    "events": log.last_id()}
        finally:
            ctl.stop()
            log.close()


def render(r: dict) -> str:
    ok = r["tick_cpu_median_s"] <= TARGET_TICK_CPU_SECONDS
    rows = [["reconcile tick (poll all + reconcile), CPU", f"{1000 * r['tick_cpu_median_s']:.1f} ms",
             f"{1000 * r['tick_cpu_max_s']:.1f} ms"],
            ["  of which: polls (parse every engine's answer, worker threads), CPU",
             f"{1000 * r['poll_cpu_median_s']:.1f} ms", "-"],
            ["  of which: reconcile (signals, policies, events, gauges), CPU",
             f"{1000 * r['reconcile_cpu_median_s']:.1f} ms", "-"],
            ["reconcile tick, wall", f"{1000 * r['tick_wall_median_s']:.1f} ms",
             f"{1000 * r['tick_wall_max_s']:.1f} ms"],
            ["/metrics render (generate_latest)", f"{1000 * r['render_median_s']:.1f} ms",
             f"{1000 * r['render_max_s']:.1f} ms"],
            ["/status document", f"{1000 * r['status_s']:.1f} ms", "-"]]
    return (f"{r['engines']} engines (half bundled /stats, half vLLM /metrics captures), {r['gpus']} GPUs (replayed "
            f"H100 capture), {r['ticks']} ticks after 3 warm-up ticks; {r['decisions']} decisions, "
            f"{r['events']} events; /metrics {r['metrics_series']:,} series, {r['metrics_bytes'] / 1e6:.2f} MB.\n\n"
            + md_table(["measure", "median", "max"], rows)
            + f"\n\n- Tick CPU {1000 * r['tick_cpu_median_s']:.1f} ms (target ≤ 100 ms: "
            f"{'met' if ok else 'NOT met'}).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="smoke test: no doc write")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    facts = machine_facts()
    r = measure(a.engines, a.gpus, a.ticks)
    body = render(r)
    print(body)
    if not (a.quick or a.no_write):
        write_section("controller", section("controller", "Controller: reconcile tick and /metrics render", body,
                                            facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
