"""bench/stub_upstream.py: the fixed-answer-time stand-in engine of the router overhead's low-noise reading."""

import asyncio
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.stub_upstream import MODEL, main, make_app


def _with_client(app, body):
    async def go():
        async with TestClient(TestServer(app)) as client:
            return await body(client)
    return asyncio.run(go())


def test_the_stub_answers_the_routers_probes():
    async def body(client):
        ready = await client.get("/ready")
        stats = await (await client.get("/stats")).json()
        models = await (await client.get("/v1/models")).json()
        return ready.status, stats, models
    status, stats, models = _with_client(make_app(0.0), body)
    assert status == 200
    assert stats["kv_cache"]["usage_ratio"] == 0.0 and stats["scheduler"]["waiting"] == 0
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_a_completion_answers_after_the_delay_however_many_are_in_flight():
    async def body(client):
        async def one():
            r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4},
                                  headers={"X-Request-Id": "r-1"})
            return r.status, (await r.json())["usage"]["completion_tokens"], r.headers["x-request-id"]
        t0 = time.perf_counter()
        got = await asyncio.gather(*[one() for _ in range(32)])
        return got, time.perf_counter() - t0
    got, wall = _with_client(make_app(0.2), body)
    assert set(got) == {(200, 4, "r-1")}
    assert 0.2 <= wall < 0.2 * 32 / 2            # concurrent: far less than 32 answers one after another


def test_a_negative_delay_is_refused():
    with pytest.raises(ValueError, match="delay must be >= 0"):
        make_app(-1.0)
    with pytest.raises(SystemExit) as exc:
        main(["--port", "1", "--delay-ms", "-5"])
    assert exc.value.code == 2


def test_bench_router_refuses_the_stub_outside_the_overhead_part():
    from bench.router import main as bench_main
    with pytest.raises(SystemExit) as exc:
        bench_main(["--upstream", "stub", "--reference-proxy", "none"])
    assert exc.value.code == 2


def test_answer_at_rounds_up_to_the_next_step_boundary():
    from bench.stub_upstream import answer_at
    assert answer_at(10.0, 0.05, 0.0, 0.0) == pytest.approx(10.05)
    assert answer_at(0.012, 0.05, 0.01, 0.0) == pytest.approx(0.07)        # due 0.062 → boundary 0.07
    assert answer_at(0.010, 0.05, 0.01, 0.0) == pytest.approx(0.06)        # due exactly on a boundary
    assert answer_at(5.003, 0.05, 0.01, 5.0) == pytest.approx(5.06)        # boundaries count from the epoch
    with pytest.raises(ValueError, match="step must be >= 0"):
        make_app(0.05, -0.01)


def test_stepped_answers_leave_together():
    async def body(client):
        async def one(wait):
            await asyncio.sleep(wait)
            r = await client.post("/v1/completions", json={"prompt": "x"})
            assert r.status == 200
            return time.perf_counter()
        first = await one(0)                        # sets the epoch
        done = await asyncio.gather(*[one(w) for w in (0.0, 0.03, 0.06)])
        return first, done
    first, done = _with_client(make_app(0.05, 0.2), body)
    assert max(done) - min(done) < 0.1              # sent 60 ms apart, answered at one 200 ms boundary
