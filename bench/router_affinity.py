"""Section 3 of ``python -m bench.router``: prefix affinity vs affinity off, TTFT by turn.

Three engines serving the real chat model (SmolLM2-135M-Instruct Q4_1 GGUF, 4k context,
prefix caching on), a router over them with prefix affinity (the default) and one with
``--affinity-min-chars`` above any prompt (every request takes the least-load rule, which rotates
among equally loaded replicas: the round-robin-like baseline). ``chats`` multi-turn chats
(streamed, ``max_tokens`` 8) in ``groups`` groups, the chats of a group sharing one long system
prompt (``system_chars`` characters of a Gutenberg book, about 1,500 tokens at 6,000).

The turns run **in lockstep**: turn t of every chat is sent when every chat has finished turn
t − 1, and the engines' prefix-cache counters are read between turns, so each turn has its own
TTFT (request sent → first content chunk) and its own cached-token share (prompt tokens the
engines found in their prefix caches ÷ prompt tokens looked up). Turn 1 is the cold one (six
long prompts at once whatever the placement); later turns are where the placement decides: with
affinity a chat's history sits on the replica that served its last turn. Each run uses
passages no earlier run used, so both routings start with cold caches.

Also the process helpers both parts of the benchmark use (:func:`spawn`, :func:`wait`,
:func:`free_port`, :func:`stop`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from bench.common import GUTENBERG, SHARED, fmt, md_table, percentile

#: the chat model of the affinity runs (8k context: a system prompt long enough that prefill matters)
CHAT_MODEL = SHARED / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_ENGINE_ARGS = ["--max-model-len", "4096", "--enable-prefix-caching", "--log-level", "warning"]
#: each chat engine's ``--memory-budget`` by default: after the weights (513 MiB as loaded) and a
#: 2,048-token step's activations (348 MiB) it leaves 231 KV blocks, 3,696 tokens per replica
#: (measured, /stats): about two of three 1,500-token group prompts, so round-robin already evicts
CHAT_MEMORY_BUDGET = "1GiB"
#: the book the system prompts are cut from (passages from character 5,000 on, none used twice)
BOOK = "pg1342.txt"
TURNS = ["Who is speaking in this passage?", "What does she want?", "Who was her friend?", "How did the day end?"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Until ``GET url`` answers 200; RuntimeError after ``timeout`` seconds, or at once when ``proc``
    (the server behind ``url``) has exited — the message then ends with the last lines of ``log``."""
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc is not None and proc.poll() is not None:
            said = log.read_text(errors="replace").strip().splitlines()[-5:] if log and log.exists() else []
            raise RuntimeError(f"{url}: the server exited with {proc.returncode} before it was ready"
                               + (": " + " | ".join(said) if said else ""))
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready within {timeout:g} s")


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    """``python -m inferctl ARGV`` with one OpenMP thread, output to ``log``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "inferctl", *argv], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each, wait 20 s, then SIGKILL."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def system_prompts(run: int, groups: int, chars: int) -> list[str]:
    """``groups`` system prompts of ``chars`` characters for affinity run number ``run``: an
    instruction, then a passage of :data:`BOOK`; no passage is used by two runs (cold caches)."""
    text = (GUTENBERG / BOOK).read_text(encoding="utf-8", errors="replace")
    out = []
    for g in range(groups):
        start = 5000 + (run * groups + g) * (chars + 500)
        if start + chars > len(text):
            raise ValueError(f"{BOOK} is too short for run {run}, group {g} of {chars} characters")
        out.append("You answer questions about this passage of a novel.\n\n" + text[start:start + chars])
    return out


def cache_counters(engines: list[str]) -> tuple[float, float]:
    """(prompt tokens looked up, tokens found) in the engines' prefix caches, summed over ``engines``
    (``inferctl_engine_prefix_cache_queries_total`` / ``..._hits_total``)."""
    import httpx

    q = h = 0.0
    for url in engines:
        text = httpx.get(url + "/metrics", timeout=5).text
        for name in ("queries", "hits"):
            found = re.search(rf"^inferctl_engine_prefix_cache_{name}_total(?:{{[^}}]*}})? (\S+)$", text, re.M)
            if found and name == "queries":
                q += float(found.group(1))
            elif found:
                h += float(found.group(1))
    return q, h


async def chats(url: str, n: int, systems: list[str], model: str, turns: int = 4, max_tokens: int = 8,
                counters: Callable[[], tuple[float, float]] | None = None) -> dict:
    """``n`` conversations of the first ``turns`` of :data:`TURNS`, streamed, chat ``k`` under
    ``systems[k % len(systems)]``, turns in lockstep (module docstring). ``counters``: the
    engines' (looked up, found) prefix-cache tokens, read before and after each turn.

    Returns ``ttft`` (s, every timed turn), ``by_turn`` (per turn: ``ttft`` list, ``queried``,
    ``hit``), ``errors`` (non-200; the chat stops), ``empty`` (a 200 stream without text),
    ``replicas`` (answers per replica), ``samples`` (first errors)."""
    import aiohttp

    by_turn = [{"ttft": [], "queried": None, "hit": None} for _ in range(turns)]
    errors = empty = 0
    replicas: dict[str, int] = {}
    samples: list[str] = []
    msgs = [[{"role": "system", "content": systems[k % len(systems)]}] for k in range(n)]
    alive = [True] * n

    async def one(session: aiohttp.ClientSession, k: int, t: int) -> None:
        nonlocal errors, empty
        msgs[k].append({"role": "user", "content": f"{TURNS[t]} (reader {k})"})
        body = {"model": model, "messages": msgs[k], "max_tokens": max_tokens, "stream": True}
        sent = time.perf_counter()
        first, text = None, []
        async with session.post(url + "/v1/chat/completions", json=body) as r:
            rep = r.headers.get("x-inferctl-replica", "?")
            replicas[rep] = replicas.get(rep, 0) + 1
            if r.status != 200:
                errors += 1
                alive[k] = False
                samples.append(f"turn {t + 1}: HTTP {r.status} {(await r.read())[:160]!r}")
                return
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0].get("delta", {}).get("content")
                if delta:
                    if first is None:
                        first = time.perf_counter() - sent
                    text.append(delta)
        if first is None:      # a 200 stream without any content (the model ended at once)
            empty += 1
        else:
            by_turn[t]["ttft"].append(first)
        msgs[k].append({"role": "assistant", "content": "".join(text)})

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=1800)) as session:
        for t in range(turns):
            before = await asyncio.to_thread(counters) if counters else None
            await asyncio.gather(*(one(session, k, t) for k in range(n) if alive[k]))
            if before is not None:
                after = await asyncio.to_thread(counters)
                by_turn[t]["queried"], by_turn[t]["hit"] = after[0] - before[0], after[1] - before[1]
    return {"ttft": [x for b in by_turn for x in b["ttft"]], "by_turn": by_turn, "errors": errors, "empty": empty,
            "replicas": dict(sorted(replicas.items())), "samples": samples[:3]}


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def summarize(res: dict, run: int, wall: float, queried: float, hit: float) -> dict:
    """One run's figures from :func:`chats`' result: TTFT p50 / p99 / mean over every turn, over
    the later turns (2..), and per turn (p50, mean, turns timed, cached share), in seconds."""
    ttft = res["ttft"]
    later = [x for b in res["by_turn"][1:] for x in b["ttft"]]
    turns = [{"turn": t + 1, "ttft_p50": percentile(b["ttft"], 50), "ttft_mean": _mean(b["ttft"]), "n": len(b["ttft"]),
              "cached": None if not b["queried"] else b["hit"] / b["queried"]} for t, b in enumerate(res["by_turn"])]
    return {"ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99), "ttft_mean": _mean(ttft),
            "later_p50": percentile(later, 50), "later_mean": _mean(later), "n": len(ttft), "turns": turns,
            "errors": res["errors"], "empty": res["empty"], "replicas": res["replicas"], "samples": res["samples"],
            "cache_queried": queried, "cache_hit": hit, "wall": wall, "run": run}


def affinity(workdir: Path, n_chats: int = 6, groups: int = 3, turns: int = 3, system_chars: int = 6000,
             runs: int = 1, max_tokens: int = 8, memory_budget: str = CHAT_MEMORY_BUDGET) -> dict:
    """Three chat engines with prefix caching, a router with affinity and one without, ``runs``
    alternated runs of each (module docstring); per run :func:`summarize`'s figures.
    ``memory_budget``: each engine's ``--memory-budget`` (a smaller one puts the prefix caches
    under pressure: round-robin then evicts prompts that affinity keeps on their home replica)."""
    import httpx

    procs: list[subprocess.Popen] = []
    try:
        engines = []
        for i in range(3):
            port = free_port()
            procs.append(spawn(["engine", "serve", "--model", str(CHAT_MODEL), "--port", str(port),
                                "--memory-budget", memory_budget, *CHAT_ENGINE_ARGS], workdir / f"chat-engine-{i}.log"))
            engines.append(f"http://127.0.0.1:{port}")
        routers = {}
        for name, extra in (("aff", []), ("off", ["--affinity-min-chars", "1000000"])):
            port = free_port()
            argv = ["router", "--port", str(port), "--log-level", "warning", "--probe-interval", "0.5", *extra]
            argv += [a for i, url in enumerate(engines) for a in ("--engine", f"chat-{i}={url}")]
            procs.append(spawn(argv, workdir / f"router-chat-{name}.log"))
            routers[name] = f"http://127.0.0.1:{port}"
        for url in [*engines, *routers.values()]:
            wait(url + "/ready", timeout=600)
        model = httpx.get(engines[0] + "/v1/models", timeout=10).json()["data"][0]["id"]
        out: dict[str, list] = {"aff": [], "off": []}
        for i, name in enumerate(("aff", "off") * runs):
            q0, h0 = cache_counters(engines)
            t = time.perf_counter()
            res = asyncio.run(chats(routers[name], n_chats, system_prompts(i, groups, system_chars), model, turns,
                                    max_tokens, counters=lambda: cache_counters(engines)))
            q1, h1 = cache_counters(engines)
            out[name].append(summarize(res, i + 1, time.perf_counter() - t, q1 - q0, h1 - h0))
        return {"runs": out, "chats": n_chats, "groups": groups, "turns": turns, "system_chars": system_chars,
                "model": model, "max_tokens": max_tokens, "memory_budget": memory_budget}
    finally:
        stop(procs)


def _med(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return percentile(vals, 50) if vals else None


def _gain(a: float | None, b: float | None) -> float | None:
    """1 − a / b (how much lower ``a`` is than ``b``), None without both."""
    return None if not (a and b) else 1 - a / b


def by_turn_table(aff: dict) -> tuple[str, dict]:
    """The per-turn table (markdown: routing, turn, TTFT p50 and mean in ms, cached %, each the
    median over the routing's runs; then the gain rows) and the headline gains
    ``{"p50", "mean", "later_p50", "later_mean"}`` (fractions; None without data)."""
    ms = lambda x: fmt(None if x is None else 1000 * x, 1)  # noqa: E731
    pct = lambda x: fmt(None if x is None else 100 * x, 1)  # noqa: E731
    rows, per = [], {}
    for name, label in (("aff", "affinity"), ("off", "affinity off")):
        runs = aff["runs"][name]
        for t in range(aff["turns"]):
            cell = {k: _med([r["turns"][t][k] for r in runs if len(r["turns"]) > t])
                    for k in ("ttft_p50", "ttft_mean", "cached")}
            per[name, t] = cell
            rows.append([label, t + 1, ms(cell["ttft_p50"]), ms(cell["ttft_mean"]), pct(cell["cached"])])
    for t in range(aff["turns"]):
        a, b = per["aff", t], per["off", t]
        rows.append(["**gain** (1 − affinity ÷ off)", t + 1, pct(_gain(a["ttft_p50"], b["ttft_p50"])) + " %",
                     pct(_gain(a["ttft_mean"], b["ttft_mean"])) + " %", ""])
    head = {k: _gain(_med([r[k] for r in aff["runs"]["aff"]]), _med([r[k] for r in aff["runs"]["off"]]))
            for k in ("ttft_p50", "ttft_mean", "later_p50", "later_mean")}
    table = md_table(["routing", "turn", "TTFT p50 ms", "TTFT mean ms", "cached %"], rows)
    return table, {"p50": head["ttft_p50"], "mean": head["ttft_mean"], "later_p50": head["later_p50"],
                   "later_mean": head["later_mean"]}


def affinity_summary(aff: dict) -> str:
    """One line per affinity run (TTFT p50 / p99 / mean in ms, later turns, each turn, cached %,
    answers per replica, wall s), then the per-turn table."""
    lines = []
    ms = lambda x: fmt(None if x is None else 1000 * x, 1)  # noqa: E731
    for name in ("aff", "off"):
        for r in aff["runs"][name]:
            cached = fmt(100 * r["cache_hit"] / r["cache_queried"], 1) if r["cache_queried"] else "-"
            turns = ", ".join(f"t{x['turn']} {ms(x['ttft_p50'])}/{ms(x['ttft_mean'])} ms"
                              f" ({fmt(None if x['cached'] is None else 100 * x['cached'], 1)} %)" for x in r["turns"])
            lines.append(f"{name} run {r['run']}: TTFT p50 {ms(r['ttft_p50'])} p99 {ms(r['ttft_p99'])} mean"
                         f" {ms(r['ttft_mean'])} ms; later turns p50 {ms(r['later_p50'])} mean {ms(r['later_mean'])}"
                         f" ms; by turn p50/mean (cached) {turns}; cached {cached} %, answers {r['replicas']},"
                         f" errors {r['errors']}, wall {r['wall']:.1f} s")
    table, gain = by_turn_table(aff)
    lines += ["", table, "", "gain (1 − affinity ÷ off, medians of the runs): all turns p50 "
              f"{fmt(None if gain['p50'] is None else 100 * gain['p50'], 1)} %, mean "
              f"{fmt(None if gain['mean'] is None else 100 * gain['mean'], 1)} %; turns 2.. p50 "
              f"{fmt(None if gain['later_p50'] is None else 100 * gain['later_p50'], 1)} %, mean "
              f"{fmt(None if gain['later_mean'] is None else 100 * gain['later_mean'], 1)} %"]
    return "\n".join(lines)
