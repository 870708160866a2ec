"""A stand-in engine with a fixed answer time, for the router overhead's low-noise reading.

``python -m bench.router --overhead-only --upstream stub`` puts this in place of the engine. At 64
closed-loop clients the real engine's p50 swings by tens of ms between identical rounds (its batches
fall differently each time), which buries a 1–2 ms difference; this server answers every
``POST /v1/completions`` (and chat) a fixed time after it was read, however many are in flight, so
what a proxy adds is the only thing that moves. Two modes:

* ``--step-ms 0``: each answer exactly ``--delay-ms`` after its request was read. The clients then
  drift apart: a request the proxy delayed comes back that much later and the next one is sent later
  too, so after a cycle or two the 64 clients no longer arrive together. This reads the hop without
  the engine's bursts (2026-12-04: 0.51 ms for the HAProxy data plane, 0.93 ms for the python plane on
  16 cores; docs/benchmarks.md).
* ``--step-ms S`` (> 0): like an engine's steps, answers leave together at step boundaries (multiples
  of S ms since the stub started): a request is answered at the first boundary at least ``--delay-ms``
  after it was read. The requests of a step come back at once, so the clients send their next ones in
  a burst, as after an engine's batch, and a request the proxy delayed past a boundary waits one more
  step, as one that misses an engine's batch does.

Routes (what the router's probes and the bench read): ``GET /ready`` and ``/health`` 200,
``GET /stats`` (an empty KV cache, nothing waiting), ``GET /v1/models`` (one model card),
``GET /metrics`` (empty), ``POST /v1/completions`` and ``/v1/chat/completions`` (a fixed OpenAI
completion object, 4 tokens). It reads but does not validate the request: the router in front of it
does. aiohttp on uvloop (pinned in pyproject), one process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time

from aiohttp import web

MODEL = "stories260K"
COMPLETION = json.dumps({
    "id": "cmpl-stub", "object": "text_completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "text": " there was a", "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
}).encode()
STATS = json.dumps({"kv_cache": {"usage_ratio": 0.0}, "scheduler": {"waiting": 0, "running": 0}}).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "stub"}]}).encode()


def answer_at(read_at: float, delay: float, step: float, epoch: float) -> float:
    """When a request read at ``read_at`` is answered (seconds on one clock): ``read_at + delay``, or,
    with ``step`` > 0, the first ``epoch + k × step`` at or after it (the module docstring's modes)."""
    due = read_at + delay
    if step <= 0:
        return due
    return epoch + math.ceil((due - epoch) / step - 1e-9) * step


def make_app(delay_seconds: float, step_seconds: float = 0.0) -> web.Application:
    """The stub's aiohttp application; completions answer at :func:`answer_at` of the moment their body
    was read (``step_seconds`` 0: ``delay_seconds`` after it).

    Raises:
        ValueError: a negative delay or step."""
    if delay_seconds < 0:
        raise ValueError(f"delay must be >= 0 s, got {delay_seconds}")
    if step_seconds < 0:
        raise ValueError(f"step must be >= 0 s, got {step_seconds}")
    epoch: list[float] = []

    def fixed(body: bytes):
        async def handler(_request: web.Request) -> web.Response:
            return web.Response(body=body, content_type="application/json")
        return handler

    async def complete(request: web.Request) -> web.Response:
        await request.read()
        now = time.monotonic()
        if not epoch:
            epoch.append(now)
        await asyncio.sleep(max(0.0, answer_at(now, delay_seconds, step_seconds, epoch[0]) - now))
        return web.Response(body=COMPLETION, content_type="application/json",
                            headers={"x-request-id": request.headers.get("x-request-id", "stub")})

    app = web.Application()
    ok = json.dumps({"ready": True, "status": "ok"}).encode()
    app.router.add_get("/ready", fixed(ok))
    app.router.add_get("/health", fixed(ok))
    app.router.add_get("/stats", fixed(STATS))
    app.router.add_get("/v1/models", fixed(MODELS))
    app.router.add_get("/metrics", fixed(b""))
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.stub_upstream --port P [--delay-ms 50] [--step-ms 0]``: serve on 127.0.0.1 until killed."""
    ap = argparse.ArgumentParser(prog="python -m bench.stub_upstream", description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=50.0, help="Answer time of a completion (ms).")
    ap.add_argument("--step-ms", type=float, default=0.0, help="Answers leave at multiples of this (ms; 0: none).")
    args = ap.parse_args(argv)
    if args.delay_ms < 0:
        ap.error(f"--delay-ms: must be >= 0, got {args.delay_ms:g}")
    if args.step_ms < 0:
        ap.error(f"--step-ms: must be >= 0, got {args.step_ms:g}")
    import uvloop

    web.run_app(make_app(args.delay_ms / 1000, args.step_ms / 1000), host="127.0.0.1", port=args.port, print=None,
                access_log=None, loop=uvloop.new_event_loop())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
