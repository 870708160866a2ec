"""The engines' polls on one event loop (controller/scrape/aio.py, sources.AsyncSourceJob):
every call keeps its own deadline and size bound, and a hanging, garbage or endless engine
never holds back the others' readings. Every test runs on both poll clients (libcurl, aiohttp)."""

from __future__ import annotations

import asyncio
import gzip
import json
import time

import pytest
from aiohttp import web

from inferctl.controller.engines.bundled import BundledEngineClient
from inferctl.controller.engines.promtext import PromTextEngineClient
from inferctl.controller.scrape.aio import (INLINE_PARSE_BYTES, SCRAPE_ERRORS, AsyncPoller, BodyTooLarge,
                                           poll_client)
from inferctl.controller.sources import AsyncSourceJob
from tests.aiohttp_helpers import ThreadedAiohttpServer
from tests.controller_helpers import FAST_INTERVALS, FakeClock, make_controller

STATS = {"engine": {"model": "m", "precision": "full", "draining": False},
         "memory": {"budget_bytes": 8_000_000, "allocated_bytes": 100, "reserved_bytes": 200},
         "scheduler": {"running": 3, "waiting": 1}, "faults": {"oom_total": 0, "recent": []}}
VLLM = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 5\n'
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.25\n')


class FakeFleet(ThreadedAiohttpServer):
    """One aiohttp server in its own thread; each engine is a path prefix (``/good``,
    ``/hang``, ...) whose ``/stats`` and ``/metrics`` behave as its name says."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        super().__init__()

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("GET", "/{engine}/{what}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        engine, what = request.match_info["engine"], request.match_info["what"]
        self.hits[engine] = self.hits.get(engine, 0) + 1
        if engine == "hang":
            await asyncio.sleep(3600)
        if engine == "garbage":
            return web.Response(text="<html>not json</html>", content_type="text/html")
        if engine == "hugegarbage":           # parsed off the loop (> INLINE_PARSE_BYTES)
            return web.Response(body=b"[" * (INLINE_PARSE_BYTES * 4), content_type="application/json")
        if engine == "endless":               # headers at once, then a body that never ends
            resp = web.StreamResponse()
            await resp.prepare(request)
            try:
                while True:
                    await resp.write(b"x" * 1024)
                    await asyncio.sleep(0.02)
            except ConnectionError:           # the client gave up (its deadline or size bound)
                return resp
        if engine == "gzipbomb":              # small on the wire (Content-Length), 1 MiB decoded
            body = gzip.compress(b"0" * 1024 ** 2)
            return web.Response(body=body, headers={"Content-Encoding": "gzip"})
        if engine == "toolarge":
            return web.Response(body=b"{}", headers={"Content-Length": str(64 * 1024 ** 2)})
        if engine == "vllm":
            return web.Response(text=VLLM)
        if engine == "echo":                  # the request's headers and the client's port (keep-alive)
            peer = request.transport.get_extra_info("peername")[1]
            return web.json_response({"headers": dict(request.headers), "peer": peer})
        if engine == "redirect":
            raise web.HTTPFound("/good/stats")
        if what == "metrics":
            return web.Response(status=404)
        return web.json_response(STATS)

    def url(self, engine: str) -> str:
        return f"http://127.0.0.1:{self.port}/{engine}"



@pytest.fixture(params=["curl", "aiohttp"], autouse=True)
def client_name(request, monkeypatch):
    """Both transports: the env var reaches every AsyncPoller (the controller's included)."""
    monkeypatch.setenv("INFERCTL_POLL_CLIENT", request.param)
    return request.param


@pytest.fixture(scope="module")
def fleet():
    f = FakeFleet()
    yield f
    f.close()


def test_bounded_get_reads_the_body_and_enforces_size_and_deadline(fleet, client_name):
    poller = AsyncPoller()
    assert poller.client == client_name
    try:
        status, body = poller.submit(poller.get(fleet.url("good") + "/stats", deadline_s=2.0)).result(5)
        assert status == 200 and json.loads(body)["scheduler"]["running"] == 3
        with pytest.raises(BodyTooLarge):
            poller.submit(poller.get(fleet.url("toolarge") + "/stats", deadline_s=2.0)).result(5)
        with pytest.raises(BodyTooLarge):     # no Content-Length: counted while reading
            poller.submit(poller.get(fleet.url("endless") + "/stats", deadline_s=5.0, max_bytes=8192)).result(10)
        with pytest.raises(BodyTooLarge):     # a small encoded body is bounded by its decoded size
            poller.submit(poller.get(fleet.url("gzipbomb") + "/stats", deadline_s=5.0, max_bytes=65536)).result(10)
        status, body = poller.submit(poller.get(fleet.url("gzipbomb") + "/stats", deadline_s=5.0)).result(10)
        assert status == 200 and body == b"0" * 1024 ** 2
        t0 = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):   # the deadline covers the whole body
            poller.submit(poller.get(fleet.url("endless") + "/stats", deadline_s=0.3)).result(10)
        assert time.monotonic() - t0 < 2.0
    finally:
        poller.close()


def test_a_bad_engine_never_holds_back_the_others_readings(tmp_path, fleet):
    names = ["good", "hang", "garbage", "hugegarbage", "endless", "toolarge", "vllm"]
    # 2 s deadlines against a 0.4 s settle: a window wide enough for a loaded 2-core host (0.6 s
    # against 0.1 s failed 1 run in 11 at load 8, on both clients)
    clients = {n: (PromTextEngineClient(n, fleet.url(n), "vllm", timeout_s=2.0) if n == "vllm"
                   else BundledEngineClient(n, fleet.url(n), timeout_s=2.0)) for n in names}
    assert all(c.supports_async for c in clients.values())
    clock = FakeClock()
    ctl, registry, log = make_controller(tmp_path, clients, clock=clock,
                                         intervals={**FAST_INTERVALS, "engine_poll_seconds": 3.0,
                                                    "gpu_poll_seconds": 3.0,
                                                    "call_timeout_seconds": 2.0})
    try:
        assert all(isinstance(ctl._jobs[f"engine:{n}"], AsyncSourceJob) for n in names)
        seen_at_settle: dict[str, bool] = {}

        def on_settle() -> None:               # the good ones are stored while the bad ones still run
            seen_at_settle.update({n: n in ctl.state.latest for n in names})

        stored = ctl.sources.poll_engines(clock(), force=True, settle_s=0.4, on_settle=on_settle)
        assert stored == len(names)
        assert seen_at_settle["good"] and seen_at_settle["vllm"] and seen_at_settle["garbage"]
        assert not seen_at_settle["hang"] and not seen_at_settle["endless"]
        latest = ctl.state.latest
        assert latest["good"].ok and latest["good"].running == 3 and latest["good"].waiting == 1
        assert latest["vllm"].ok and latest["vllm"].running == 5 and latest["vllm"].kv_usage_ratio == 0.25
        assert latest["hang"].ok is False and "timed out after 2 s" in latest["hang"].error
        assert latest["endless"].ok is False and "timed out after 2 s" in latest["endless"].error
        assert latest["garbage"].ok is False and "not JSON" in latest["garbage"].error
        assert latest["hugegarbage"].ok is False and "not JSON" in latest["hugegarbage"].error
        assert latest["toolarge"].ok is False and "BodyTooLarge" in latest["toolarge"].error
        for bad in ("hang", "garbage", "hugegarbage", "endless", "toolarge"):   # missing = no data
            assert latest[bad].running is None and latest[bad].memory_free_bytes is None
            assert registry.get_sample_value("inferctl_engine_up", {"engine": bad}) == 0.0
            assert ctl._jobs[f"engine:{bad}"].failures == 1
        assert registry.get_sample_value("inferctl_engine_up", {"engine": "good"}) == 1.0
        # a scheduled round skips the engines backing off and polls the rest
        hits = dict(fleet.hits)
        assert ctl.sources.poll_engines(clock()) == 2
        assert fleet.hits["hang"] == hits["hang"] and fleet.hits["good"] == hits["good"] + 2   # /stats + /metrics
    finally:
        ctl.stop()
        log.close()


def test_scheduled_polls_keep_going_while_one_engine_hangs(tmp_path, fleet):
    clients = {"good": BundledEngineClient("good", fleet.url("good"), timeout_s=0.15),
               "hang": BundledEngineClient("hang", fleet.url("hang"), timeout_s=0.15)}
    ctl, registry, log = make_controller(tmp_path, clients)
    ctl.start()
    try:
        deadline = time.monotonic() + 10
        while ctl._jobs["engine:good"].polls < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        # 0.2 s interval: five good polls while the hanging engine times out and backs off
        assert ctl._jobs["engine:good"].polls >= 5
        assert ctl._jobs["engine:good"].failures == 0
        assert ctl._jobs["engine:hang"].failures >= 1
        assert registry.get_sample_value("inferctl_engine_up", {"engine": "good"}) == 1.0
        assert registry.get_sample_value("inferctl_engine_up", {"engine": "hang"}) == 0.0
    finally:
        ctl.stop()
        log.close()


def test_a_forced_poll_waits_for_the_call_in_flight_instead_of_failing(fleet):
    poller = AsyncPoller()
    gate = asyncio.Event()
    calls = []

    async def afn(now):
        calls.append(now)
        if len(calls) == 1:
            await gate.wait()
        return type("R", (), {"ok": True})()

    job = AsyncSourceJob("engine:x", afn, lambda now, err: None, interval=5.0, timeout=1.0, max_backoff=10.0,
                         metrics={}, poller=poller)
    try:
        first = poller.submit(job.arun(1.0))
        time.sleep(0.1)
        assert job.run(2.0) is None                       # a scheduled caller skips
        forced = poller.submit(job.arun(3.0, force=True))
        time.sleep(0.1)
        assert not forced.done()                         # ... a forced one waits its turn
        poller.loop.call_soon_threadsafe(gate.set)
        assert first.result(5).ok and forced.result(5).ok
        assert calls == [1.0, 3.0] and job.failures == 0 and job.polls == 2
    finally:
        poller.close()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_errors_status_headers_redirects_and_keepalive(fleet):
    poller = AsyncPoller()
    run = lambda coro, t=5: poller.submit(coro).result(t)   # noqa: E731
    try:
        with pytest.raises(SCRAPE_ERRORS) as refused:          # nothing listens there
            run(poller.get(f"http://127.0.0.1:{_free_port()}/stats", deadline_s=2.0))
        assert not isinstance(refused.value, (asyncio.TimeoutError, BodyTooLarge))
        assert run(poller.get(fleet.url("good") + "/metrics", deadline_s=2.0))[0] == 404
        status, body = run(poller.get(fleet.url("redirect") + "/stats", deadline_s=2.0))
        assert status == 302 and b"running" not in body            # redirects are not followed
        peers = set()
        for _ in range(4):
            status, body = run(poller.get(fleet.url("echo") + "/stats", deadline_s=2.0,
                                          headers={"Authorization": "Bearer k1"}))
            seen = json.loads(body)
            assert status == 200 and seen["headers"]["Authorization"] == "Bearer k1"
            peers.add(seen["peer"])
        assert len(peers) == 1                                      # one keep-alive connection

        async def many() -> list:
            return await asyncio.gather(*(poller.get(fleet.url("good") + "/stats", deadline_s=3.0)
                                          for _ in range(50)))
        assert [s for s, _ in run(many(), 10)] == [200] * 50
    finally:
        poller.close()


def test_a_cancelled_call_stops_its_transfer_and_the_poller_keeps_working(fleet):
    poller = AsyncPoller()
    try:
        async def cut_short() -> None:
            async with asyncio.timeout(0.2):                 # the caller's timeout, shorter than the call's
                await poller.get(fleet.url("endless") + "/stats", deadline_s=30.0)
        t0 = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            poller.submit(cut_short()).result(5)
        assert time.monotonic() - t0 < 2.0
        if poller.client == "curl":                          # nothing left in libcurl's multi handle
            assert poller.submit(_curl_active(poller)).result(5) == 0
        status, body = poller.submit(poller.get(fleet.url("good") + "/stats", deadline_s=2.0)).result(5)
        assert status == 200 and json.loads(body)["scheduler"]["waiting"] == 1
    finally:
        poller.close()
    with pytest.raises(RuntimeError):
        poller.submit(poller.get(fleet.url("good") + "/stats", deadline_s=2.0))


async def _curl_active(poller: AsyncPoller) -> int:
    return len(poller._curl._active)


def test_poll_client_choice(monkeypatch):
    monkeypatch.delenv("INFERCTL_POLL_CLIENT", raising=False)
    assert poll_client() == "curl"                          # pycurl is pinned and installed
    assert poll_client("aiohttp") == "aiohttp"
    monkeypatch.setenv("INFERCTL_POLL_CLIENT", "aiohttp")
    assert poll_client() == "aiohttp"
    with pytest.raises(ValueError, match="must be one of curl, aiohttp"):
        poll_client("requests")
