"""Serving over HTTP vs in-process on the same workload, side by side in one run.

    python -m bench.http_serving [--model stories260K] [--n 32] [--repeats 3] [--threads 2]

The workload of :mod:`bench.common` (``n`` mixed requests, seed 1234, greedy, EOS ignored, all
arriving at t = 0) runs on three sides, taking turns, best of ``--repeats`` rounds:

* ``in-process``: ``LLMEngine.step()`` in a loop (:func:`bench.runners.run_engine`, the number
  ``bench.throughput`` reports);
* ``async``: the same engine behind :class:`~inferctl.engine.async_engine.AsyncLLMEngine` (its
  stepping thread) with ``n`` asyncio consumers of ``generate()`` in the same process — the
  hand-off between the stepping thread and the event loop, without HTTP;
* ``http``: ``inferctl engine serve`` (a real uvicorn server, its own process, loopback) with
  ``n`` concurrent streaming ``/v1/completions`` clients (aiohttp, one process: this one).
  Each client reads the raw SSE bytes and parses only the last usage chunk, so the client side
  stays cheap; its CPU seconds (this process) and the server's (``/proc/<pid>/stat``) are
  reported beside the wall time so a client bottleneck would show.

Useful output tokens per second, each request's own tokens (checked: every request ends with
``finish_reason: "length"`` after exactly its ``max_tokens``). The target (issue 12,
docs/performance.md): HTTP ≥ 80 % of in-process. ``--profile-server FILE`` runs the server under
``py-spy record --threads -f raw`` (if installed) and prints where its threads spend their
samples. Writes the section ``http_serving`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from bench.common import Request, fmt, machine_facts, make_workload, md_table, section, write_section
from bench.models import model_dir
from bench.runners import RunResult, load_engine, run_engine

#: The target of issue 12: HTTP throughput ≥ 80 % of in-process on the same workload.
TARGET_RATIO = 0.80


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (``/proc/<pid>/stat``, clock ticks → s); NaN off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _tree_cpu_seconds(pid: int) -> float:
    """:func:`_cpu_seconds` of ``pid`` and of every process below it (``--core-process``'s engine
    core, multiprocessing's resource tracker: :func:`inferctl.controller.supervisor.descendants`)."""
    from inferctl.controller.supervisor import descendants

    return _cpu_seconds(pid) + sum(_cpu_seconds(child) for child in descendants(pid))


def start_server(model: Path, max_num_seqs: int, log: Path, extra: Sequence[str] = (),
                 python: str = sys.executable) -> tuple[subprocess.Popen, str]:
    """``inferctl engine serve`` on a free loopback port (run by ``python``); returns the
    process and its base URL once ``/ready`` answers 200.

    Raises RuntimeError when the server does not become ready within 120 s.
    """
    import httpx

    port = _port()
    argv = [python, "-m", "inferctl", "engine", "serve", "--model", str(model), "--port", str(port),
            "--max-num-seqs", str(max_num_seqs), "--log-level", "warning", *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"server not ready within 120 s; see {log}")


def start_profiler(pid: int, out: Path) -> subprocess.Popen:
    """``py-spy record`` attached to ``pid`` (every thread, raw collapsed stacks, 200 Hz, idle
    samples left out) until SIGINT."""
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--threads", "--gil", "-r", "200", "-f", "raw",
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _stream_all(url: str, model: str, requests: Sequence[Request]) -> tuple[int, list[float], list[float]]:
    """Stream every request at once; returns (completion tokens, TTFTs s, latencies s).

    Raises RuntimeError for a non-200 answer, a missing usage chunk, or a request that did not
    produce exactly its ``max_tokens``."""
    import aiohttp

    async def one(session: aiohttp.ClientSession, r: Request, t0: float) -> tuple[int, float, float]:
        body = {"model": model, "prompt": list(r.prompt), "max_tokens": r.max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        ttft = None
        tail = b""
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
            async for data in resp.content.iter_any():
                if ttft is None:
                    ttft = time.perf_counter() - t0
                tail = (tail + data)[-4096:]
        events = [e for e in tail.split(b"\n\n") if e.startswith(b"data: {")]
        last = json.loads(events[-1][6:]) if events else {}
        usage = last.get("usage")
        if not usage or usage["completion_tokens"] != r.max_tokens:
            raise RuntimeError(f"expected {r.max_tokens} tokens, got usage {usage}")
        return usage["completion_tokens"], ttft or float("nan"), time.perf_counter() - t0

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one(session, r, t0) for r in requests))
    return sum(n for n, _, _ in res), [t for _, t, _ in res], [lat for _, _, lat in res]


def run_http(url: str, server_pid: int, model: str, requests: Sequence[Request]) -> RunResult:
    """One HTTP round (see the module doc)."""
    asyncio.run(_stream_all(url, model, [Request(requests[0].prompt[:8], 2)]))   # warm the connection path
    s0, c0 = _tree_cpu_seconds(server_pid), time.process_time()
    t0 = time.perf_counter()
    tokens, ttfts, lats = asyncio.run(_stream_all(url, model, requests))
    seconds = time.perf_counter() - t0
    server_cpu, client_cpu = _tree_cpu_seconds(server_pid) - s0, time.process_time() - c0
    return RunResult(side="http", model=model, batch=len(requests), requests=len(requests), useful_tokens=tokens,
                     seconds=seconds, latencies=lats,
                     extra={"server_cpu_s": server_cpu, "client_cpu_s": client_cpu, "cpu_s": server_cpu,
                            "ttft_p50": sorted(ttfts)[len(ttfts) // 2]})


def run_async(aeng, model: str, requests: Sequence[Request], tag: str) -> RunResult:
    """One round through AsyncLLMEngine in this process (``n`` asyncio consumers)."""
    from inferctl.engine.sampling_params import SamplingParams

    async def one(i: int, r: Request, t0: float) -> tuple[int, float]:
        n = 0
        params = SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True)
        async for out in aeng.generate(f"{tag}-{i}", list(r.prompt), params):
            n += len(out.new_token_ids)
            if out.finished and out.finish_reason != "length":
                raise RuntimeError(f"request {i} finished with {out.finish_reason}")
        return n, time.perf_counter() - t0

    async def go() -> tuple[list[tuple[int, float]], float]:
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one(i, r, t0) for i, r in enumerate(requests)))
        return res, time.perf_counter() - t0

    res, seconds = asyncio.run(go())
    tokens = sum(n for n, _ in res)
    if tokens != sum(r.max_tokens for r in requests):
        raise RuntimeError(f"async side produced {tokens} tokens")
    return RunResult(side="async", model=model, batch=len(requests), requests=len(requests), useful_tokens=tokens,
                     seconds=seconds, latencies=[t for _, t in res])


def _cpu_timed(fn, *args, **kwargs) -> RunResult:
    """``fn(*args, **kwargs)`` with this process's CPU seconds in ``extra["cpu_s"]``."""
    c0 = time.process_time()
    r = fn(*args, **kwargs)
    r.extra["cpu_s"] = time.process_time() - c0
    return r


def run(model: str, n: int, repeats: int, threads: int | None, quick: bool = False,
        profile: Path | None = None, alt_python: str | None = None, core: bool = False) -> dict:
    """Every side, ``repeats`` rounds taking turns; returns {side: [RunResult per round]}.
    ``alt_python``: a second server run by that interpreter (e.g. a venv with
    ``inferctl[serving]``), side ``http-alt``, measured in the same rounds. ``core``: one more
    server started with ``--core-process`` (the engine core in a child process), side
    ``http-core``, its CPU the API process's plus the core's."""
    import torch

    from inferctl.engine.async_engine import AsyncLLMEngine

    torch.manual_seed(0)
    d = model_dir(model)
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    reqs = make_workload(n, vocab, output_range=(4, 16) if quick else (16, 256),
                         prompt_range=(4, 32) if quick else (16, 256))
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-http-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    sync_eng = load_engine(d, threads, max_num_seqs=n)
    aeng = AsyncLLMEngine(load_engine(d, threads, max_num_seqs=n))
    aeng.start()
    proc, url = start_server(d, n, workdir / "server.log")
    pid = proc.pid
    alt = core_srv = None
    out: dict[str, list[RunResult]] = {"in-process": [], "async": [], "http": []}
    spy = None
    try:
        if alt_python:
            alt = start_server(d, n, workdir / "server-alt.log", python=alt_python)
            out["http-alt"] = []
        if core:
            core_srv = start_server(d, n, workdir / "server-core.log", extra=["--core-process"])
            out["http-core"] = []
        served = json.loads(_get(url + "/v1/models"))["data"][0]["id"]
        asyncio.run(_stream_all(url, served, reqs[:4]))   # warm-up
        if alt is not None:
            asyncio.run(_stream_all(alt[1], served, reqs[:4]))
        if core_srv is not None:
            asyncio.run(_stream_all(core_srv[1], served, reqs[:4]))
        spy = start_profiler(pid, profile) if profile is not None else None
        for k in range(repeats):
            out["in-process"].append(_cpu_timed(run_engine, d, reqs, threads, name=model, engine=sync_eng))
            out["async"].append(_cpu_timed(run_async, aeng, model, reqs, f"r{k}"))
            out["http"].append(run_http(url, pid, served, reqs))
            if alt is not None:
                out["http-alt"].append(run_http(alt[1], alt[0].pid, served, reqs))
            if core_srv is not None:
                out["http-core"].append(run_http(core_srv[1], core_srv[0].pid, served, reqs))
            print(f"round {k + 1}: " + ", ".join(f"{s} {fmt(v[-1].tok_s)} tok/s" for s, v in out.items()),
                  file=sys.stderr)
        if spy is not None:
            spy.send_signal(signal.SIGINT)   # py-spy writes its samples on SIGINT
            spy.wait(60)
    finally:
        aeng.shutdown()
        for other in (alt, core_srv):
            if other is not None:
                other[0].terminate()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def server_stack(python: str = sys.executable) -> str:
    """The event loop and HTTP parser uvicorn's ``auto`` picks for ``python``: uvloop and
    httptools when importable (``pip install inferctl[serving]``), else asyncio and h11."""
    probe = ("import importlib.util as u; print(('uvloop' if u.find_spec('uvloop') else 'asyncio') + ' + ' + "
             "('httptools' if u.find_spec('httptools') else 'h11'))")
    return subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False).stdout.strip()


def _get(url: str) -> str:
    import httpx

    return httpx.get(url, timeout=10).text


def render(model: str, res: dict, threads: int | None, alt_python: str | None = None) -> str:
    """The markdown table (best of the rounds per side) and the verdict."""
    best = {s: max(v, key=lambda r: r.tok_s) for s, v in res.items()}
    base = best["in-process"].tok_s
    rows = []
    sides = [("in-process", "in-process, `LLMEngine.step()` loop"),
             ("async", "in-process, AsyncLLMEngine + asyncio consumers"),
             ("http", f"HTTP, uvicorn server ({server_stack()}), streaming clients")]
    if "http-alt" in best:
        sides.append(("http-alt", f"HTTP, the same server run by {alt_python} ({server_stack(alt_python)})"))
    if "http-core" in best:
        sides.append(("http-core", "HTTP, the same server with `--core-process` (engine core in a child process)"))
    for side, label in sides:
        r = best[side]
        cpu = fmt(1000 * r.extra["cpu_s"] / r.useful_tokens * 1000, 0)
        if side.startswith("http"):
            cpu += f" (client {fmt(1000 * r.extra['client_cpu_s'] / r.useful_tokens * 1000, 0)})"
        rows.append([side if side != "http" else "**http**", label, fmt(r.tok_s),
                     " / ".join(fmt(x.tok_s, 0) for x in res[side]), fmt(100 * r.tok_s / base, 0) + " %",
                     fmt(r.p50, 2), fmt(r.p99, 2), fmt(r.seconds, 2), cpu])
    ratio = best["http"].tok_s / base
    table = md_table(["side", "what", "useful tok/s (best)", "every round", "vs in-process", "P50 s", "P99 s",
                      "wall s", "CPU ms per 1k tokens (server)"], rows)
    return (f"{model}, {best['http'].requests} mixed requests, as many concurrent streams; torch threads "
            f"{threads or 'engine default'} in-process, engine default in the server.\n\n{table}\n\n"
            f"- HTTP / in-process: **{fmt(100 * ratio, 0)} %** (target ≥ {TARGET_RATIO:.0%}: "
            f"{'met' if ratio >= TARGET_RATIO else 'NOT met'}); async / in-process "
            f"{fmt(100 * best['async'].tok_s / base, 0)} %.\n"
            f"- CPU per token, in-process ÷ HTTP server (a load-independent view: on a busy machine the wall "
            f"times above mostly measure the other processes): "
            f"**{fmt(100 * _cpu_per_tok(best['in-process']) / _cpu_per_tok(best['http']), 0)} %**; "
            f"the client used {fmt(100 * best['http'].extra['client_cpu_s'] / best['http'].seconds, 0)} % of a core.\n"
            f"- Host drift aside: HTTP / in-process median to median **{fmt(100 * _median_ratio(res), 0)} %**, and the "
            f"median of each round's own ratio **{fmt(100 * paired_ratio(res), 0)} %** (the sides of one round run "
            f"seconds apart, so a round's ratio is less exposed to this host's minute-to-minute swings than the best "
            f"of each side; the verdict above stays best to best, the issue's protocol)."
            + (f"\n- http-alt / in-process: **{fmt(100 * best['http-alt'].tok_s / base, 0)} %**; CPU per token "
               f"in-process ÷ http-alt server "
               f"{fmt(100 * _cpu_per_tok(best['in-process']) / _cpu_per_tok(best['http-alt']), 0)} %."
               if "http-alt" in best else "")
            + (f"\n- http-core / in-process: **{fmt(100 * best['http-core'].tok_s / base, 0)} %** best to best, "
               f"median of each round's own ratio **{fmt(100 * paired_ratio(res, 'http-core'), 0)} %**; CPU per "
               f"token in-process ÷ http-core server (both processes) "
               f"{fmt(100 * _cpu_per_tok(best['in-process']) / _cpu_per_tok(best['http-core']), 0)} %."
               if "http-core" in best else ""))


def paired_ratio(res: dict, side: str = "http") -> float:
    """Median over the rounds of ``side``'s tok/s ÷ in-process tok/s of the same round (NaN when
    no round has both)."""
    ratios = [h.tok_s / p.tok_s for h, p in zip(res[side], res["in-process"]) if p.tok_s > 0]
    return statistics.median(ratios) if ratios else float("nan")


def _median_ratio(res: dict, side: str = "http") -> float:
    """Median tok/s of ``side`` ÷ median tok/s in-process."""
    return statistics.median(r.tok_s for r in res[side]) / statistics.median(r.tok_s for r in res["in-process"])


def _cpu_per_tok(r: RunResult) -> float:
    return r.extra["cpu_s"] / r.useful_tokens if r.useful_tokens else float("nan")


def summarize_profile(path: Path, top: int = 25) -> str:
    """py-spy raw samples → per-thread totals and the top self/inclusive frames (text)."""
    threads: Counter = Counter()
    self_t: Counter = Counter()
    incl: Counter = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        c = int(count)
        frames = stack.split(";")
        total += c
        threads[frames[0]] += c
        self_t[(frames[0][:40], frames[-1])] += c
        for f in set(frames[1:]):
            incl[f] += c
    lines = [f"{total} samples"] + [f"  thread {t}: {c} ({100 * c / total:.0f} %)" for t, c in threads.most_common()]
    lines += ["top self:"] + [f"  {100 * c / total:5.1f} %  {t} | {f}" for (t, f), c in self_t.most_common(top)]
    lines += ["top inclusive:"] + [f"  {100 * c / total:5.1f} %  {f}" for f, c in incl.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="stories260K", help="bench.models name (default stories260K)")
    ap.add_argument("--n", type=int, default=32, help="requests = concurrent streams (default 32)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds, sides taking turns; best of (default 3)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads in-process (default 0 = the engine default, as in the server)")
    ap.add_argument("--quick", action="store_true", help="tiny lengths (smoke test), no doc write")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--alt-python", default=None,
                    help="also measure a server run by this interpreter (e.g. a venv with inferctl[serving])")
    ap.add_argument("--core-process", action="store_true",
                    help="also measure a server started with --core-process (side http-core)")
    ap.add_argument("--profile-server", type=Path, default=None,
                    help="run the server under py-spy, raw samples to this file, and print a summary")
    a = ap.parse_args(argv)
    if a.profile_server is not None and shutil.which("py-spy") is None:
        ap.error("--profile-server needs py-spy on PATH")
    facts = machine_facts()
    threads = a.threads or None
    res = run(a.model, a.n, a.repeats, threads, a.quick, a.profile_server, a.alt_python, a.core_process)
    body = (f"Best of {a.repeats} rounds, the sides taking turns in each round.\n\n"
            + render(a.model, res, threads, a.alt_python))
    if facts["load_1m"] > (facts["cpus"] or 1):
        body += (f"\n- The load average ({facts['load_1m']}) was above the CPU count ({facts['cpus']}): these "
                 "ratios are not a verdict; re-run on a quiet machine.")
    print(body)
    if a.profile_server is not None:
        print(summarize_profile(a.profile_server))
    if not (a.quick or a.no_write or a.profile_server):
        write_section("http_serving", section("http_serving", f"Serving over HTTP vs in-process, {a.n} mixed "
                                              "requests", body, facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
