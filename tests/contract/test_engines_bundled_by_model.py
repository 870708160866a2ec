"""Bundled client: TTFT histograms by served model from the engine's real /metrics
(``inferctl_engine_time_to_first_token_seconds{model=...}``), for the latency breaker."""

from __future__ import annotations

import httpx
from tests.server_helpers import STORIES, auth, client, demo_engine, engines_running, make_app, run, stories_engine

from inferctl.controller.engines import BundledEngineClient


def test_ttft_by_model_from_a_real_two_model_engine(stories_dir):
    main, light = stories_engine(stories_dir), demo_engine("light")
    with engines_running(main, light):
        app = make_app({STORIES: main, "light": light})

        async def go():
            async with client(app) as c:
                for _ in range(3):
                    r = await c.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 4})
                    assert r.status_code == 200
                r = await c.post("/v1/completions", json={"model": "light", "prompt": "Hi", "max_tokens": 2})
                assert r.status_code == 200
                return (await c.get("/stats")).json(), (await c.get("/metrics")).text
        stats, metrics = run(go())

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=stats) if req.url.path == "/stats" else httpx.Response(200, text=metrics)

    snap = BundledEngineClient("main", "http://e:1", transport=httpx.MockTransport(handler)).poll(1.0)
    assert sorted(snap.ttft_histogram_by_model) == ["light", STORIES]
    assert snap.ttft_histogram_by_model[STORIES]["count"] == 3.0
    assert snap.ttft_histogram_by_model["light"]["count"] == 1.0
    # cumulative buckets ending in +Inf with the model's own count
    les = [le for le, _ in snap.ttft_histogram_by_model[STORIES]["buckets"]]
    assert les == sorted(les) and les[-1] == float("inf")
    assert snap.ttft_histogram_by_model[STORIES]["buckets"][-1][1] == 3.0
    # the engine-wide field stays the /stats model's (the main one)
    assert snap.model == STORIES and snap.ttft_histogram["count"] == 3.0
    # /stats alone carries them (one GET per poll): the same histograms as /metrics gives
    assert sorted(stats["latency_histograms_by_model"]) == ["light", STORIES]
    paths = []

    def stats_only(req: httpx.Request) -> httpx.Response:
        paths.append(req.url.path)
        return httpx.Response(200, json=stats) if req.url.path == "/stats" else httpx.Response(404)

    alone = BundledEngineClient("main", "http://e:1", transport=httpx.MockTransport(stats_only)).poll(1.0)
    assert paths == ["/stats"]
    assert alone.ttft_histogram_by_model == snap.ttft_histogram_by_model
    assert (alone.ttft_histogram, alone.itl_histogram, alone.e2e_histogram) == (
        snap.ttft_histogram, snap.itl_histogram, snap.e2e_histogram)
    # an older engine (no histograms in /stats): read from /metrics, as before
    old = {k: v for k, v in stats.items() if k != "latency_histograms_by_model"}
    old["requests"] = {k: v for k, v in stats["requests"].items() if k != "latency_histograms"}
    paths.clear()

    def old_engine(req: httpx.Request) -> httpx.Response:
        paths.append(req.url.path)
        return httpx.Response(200, json=old) if req.url.path == "/stats" else httpx.Response(200, text=metrics)

    legacy = BundledEngineClient("main", "http://e:1", transport=httpx.MockTransport(old_engine)).poll(1.0)
    assert paths == ["/stats", "/metrics"] and legacy.ttft_histogram_by_model == alone.ttft_histogram_by_model
    assert (legacy.ttft_histogram, legacy.itl_histogram, legacy.e2e_histogram) == (
        alone.ttft_histogram, alone.itl_histogram, alone.e2e_histogram)


def test_scrape_off_or_failing_metrics_leaves_by_model_empty():
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/stats":
            return httpx.Response(200, json={"engine": {"model": "m"}})
        return httpx.Response(500, text="boom")

    snap = BundledEngineClient("main", "http://e:1", transport=httpx.MockTransport(handler)).poll(1.0)
    assert snap.ok and snap.ttft_histogram_by_model == {}


def test_real_faults_carry_time_and_id(stories_dir):
    import time

    main = stories_engine(stories_dir)
    with engines_running(main):
        app = make_app({STORIES: main})

        async def go():
            async with client(app) as c:
                r = await c.post("/admin/fault", json={"kind": "oom", "count": 2}, headers=auth())
                assert r.status_code == 200, r.text
                r = await c.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 4})
                assert r.status_code == 200          # retried after the injected OOMs
                return (await c.get("/stats")).json()
        t0 = time.time()
        stats = run(go())

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=stats) if req.url.path == "/stats" else httpx.Response(404)

    snap = BundledEngineClient("main", "http://e:1", transport=httpx.MockTransport(handler)).poll(1.0)
    assert [f["id"] for f in snap.faults] == [1, 2]            # the precision policy's (time, id) key
    assert all(isinstance(f["time"], float) and t0 - 1 <= f["time"] <= time.time() for f in snap.faults)
    assert len({(f["time"], f["id"]) for f in snap.faults}) == 2
