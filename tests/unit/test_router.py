"""Router pure parts: the bounded-load ring, the load score and routing rule, request ids and
affinity keys, configuration errors, the controller view, JSON logs, the metric catalog, and
the readiness probe against small fake replicas (ASGI, no engine)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from inferctl.contract.openai import ChatCompletionRequest, CompletionRequest, validate_model
from inferctl.router.balancer import ReplicaLoad, choose, least_loaded, load_score
from inferctl.router.config import ConfigError, EngineSpec, RouterConfig, parse_engine
from inferctl.router.keys import affinity_prefix, request_id
from inferctl.contract.logs import JsonFormatter
from inferctl.router.metrics import ROUTER_METRICS, build_router_registry
from inferctl.router.probe import Prober, controller_block
from inferctl.router.replicas import ReplicaSet
from inferctl.router.ring import HashRing, capacity

NODES = ["r0", "r1", "r2", "r3"]


# ------------------------------------------------------------------ ring


def test_capacity_is_the_papers_bound():
    # ceil((1 + eps) * (L + 1) / n)
    assert capacity(0, 4, 0.25) == 1
    assert capacity(7, 4, 0.25) == 3          # 1.25 * 8 / 4 = 2.5 -> 3
    assert capacity(11, 4, 0.0) == 3          # exactly 12 / 4
    with pytest.raises(ValueError):
        capacity(1, 0, 0.25)


def test_ring_is_stable_and_spreads_keys():
    ring = HashRing(NODES, vnodes=64)
    idle = {n: 0 for n in NODES}
    homes = [ring.lookup(f"key-{i}", idle, 0.25)[0] for i in range(4000)]
    assert HashRing(NODES, 64).lookup("key-7", idle, 0.25) == ring.lookup("key-7", idle, 0.25)
    share = Counter(homes)
    assert set(share) == set(NODES) and max(share.values()) < 2 * min(share.values())


def test_removing_a_replica_moves_only_its_keys():
    ring = HashRing(NODES)
    all_four = {n: 0 for n in NODES}
    three = {n: 0 for n in NODES if n != "r2"}
    moved = [k for k in (f"k{i}" for i in range(2000))
             if ring.lookup(k, all_four, 0.25)[0] != ring.lookup(k, three, 0.25)[0]]
    assert moved and all(ring.lookup(k, all_four, 0.25)[0] == "r2" for k in moved)


def test_bounded_load_skips_a_loaded_home_and_spills_to_the_same_successor():
    ring = HashRing(NODES)
    key = "a shared system prompt"
    home = ring.walk(key)[0]
    successor = ring.walk(key)[1]
    loads = {n: 1 for n in NODES}
    assert ring.lookup(key, loads, 0.25) == (home, True)       # cap = ceil(1.25 * 5 / 4) = 2
    loads[home] = 2                                            # at capacity: skipped
    assert ring.lookup(key, loads, 0.25) == (successor, False)
    assert ring.lookup(key, loads, 10.0) == (home, True)       # a loose bound keeps it home


def test_bounded_load_never_exceeds_capacity_under_one_hot_key():
    ring = HashRing(NODES)
    loads = {n: 0 for n in NODES}
    for _ in range(40):                                        # every request has the same prefix
        name, _home = ring.lookup("hot", loads, 0.25)
        loads[name] += 1
        assert max(loads.values()) <= capacity(sum(loads.values()) - 1, 4, 0.25)
    # the home fills to the bound (ceil(1.25 * 40 / 4) = 13), the rest spills along the walk
    assert loads[ring.walk("hot")[0]] == 13 and max(loads.values()) == 13 and min(loads.values()) > 0


def test_ring_ignores_non_candidates():
    ring = HashRing(NODES)
    assert ring.lookup("k", {"other": 0}, 0.25) is None
    assert ring.lookup("k", {"r1": 5}, 0.25) == ("r1", True)   # the only candidate always has room
    with pytest.raises(ValueError):
        HashRing([])


# ------------------------------------------------------------------ balancer


def test_load_score_weights_kv_usage_and_queue():
    assert load_score(ReplicaLoad("a", 2)) == 3
    assert load_score(ReplicaLoad("a", 2, waiting=3, kv_usage_ratio=0.5)) == pytest.approx(9.0)
    assert load_score(ReplicaLoad("a", 0, kv_usage_ratio=2.0)) == 2.0      # clamped to 1
    busy_kv = ReplicaLoad("a", 1, waiting=0, kv_usage_ratio=0.9)
    queued = ReplicaLoad("b", 1, waiting=4, kv_usage_ratio=0.0)
    fresh = ReplicaLoad("c", 2, waiting=0, kv_usage_ratio=0.1)
    assert least_loaded([busy_kv, queued, fresh]) == "c"    # 3.3 < 3.8 < 6
    assert least_loaded([busy_kv, queued]) == "a"


def test_least_loaded_rotates_ties():
    idle = [ReplicaLoad(n, 0) for n in ("x", "y", "z")]
    assert [least_loaded(idle, tie=i) for i in range(4)] == ["x", "y", "z", "x"]
    with pytest.raises(ValueError):
        least_loaded([])


def test_choose_reasons():
    ring = HashRing(NODES)
    cands = [ReplicaLoad(n, 0) for n in NODES]
    assert choose(cands, ring, session="s1", prefix="p" * 40, epsilon=0.25).reason == "session"
    assert choose(cands, ring, session=None, prefix="p" * 40, epsilon=0.25).reason == "affinity"
    assert choose(cands, ring, session=None, prefix=None, epsilon=0.25).reason == "least_load"
    retry = choose(cands, ring, session="s1", prefix="p", epsilon=0.25, retry=True)
    assert retry.reason == "fallback"
    # affinity of the same prefix is the same replica; session and prefix keys are separate spaces
    one = {choose(cands, ring, session=None, prefix="same prefix", epsilon=0.25).replica for _ in range(5)}
    assert len(one) == 1


# ------------------------------------------------------------------ keys


def test_request_id_keeps_a_valid_client_id_and_makes_one_otherwise():
    assert request_id("abc-123") == "abc-123"
    made = {request_id(None), request_id(""), request_id("has space"), request_id("x" * 201), request_id("é")}
    assert all(len(m) == 32 and int(m, 16) >= 0 for m in made) and len(made) == 5


def test_affinity_prefix_rules():
    comp = validate_model(CompletionRequest, {"prompt": "A" * 300})
    assert affinity_prefix(comp, 256, 32) == "A" * 256
    short = validate_model(CompletionRequest, {"prompt": "hi"})
    assert affinity_prefix(short, 256, 32) is None
    ids = validate_model(CompletionRequest, {"prompt": list(range(100))})
    assert affinity_prefix(ids, 40, 1) == "ids:" + ",".join(str(i) for i in range(10))
    sys_msg = {"role": "system", "content": "You are helpful. " * 4}
    turn1 = validate_model(ChatCompletionRequest, {"messages": [sys_msg, {"role": "user", "content": "one"}]})
    turn2 = validate_model(ChatCompletionRequest, {"messages": [sys_msg, {"role": "user", "content": "one"},
                                                                {"role": "assistant", "content": "ok"},
                                                                {"role": "user", "content": "two"}]})
    # a later turn of the same conversation keeps the key when N covers only the shared start
    assert affinity_prefix(turn1, 60, 32) == affinity_prefix(turn2, 60, 32)
    assert affinity_prefix(turn1, 256, 32) != affinity_prefix(turn2, 256, 32)


# ------------------------------------------------------------------ config


@pytest.mark.parametrize("text, words", [
    ("r0", "NAME=URL"), ("=http://x", "NAME=URL"), ("r 0=http://x:1", "name"),
    ("r0=ftp://x", "http(s)"), ("r0=localhost:8000", "http(s)"),
])
def test_parse_engine_errors_name_the_flag(text, words):
    with pytest.raises(ConfigError, match="--engine") as info:
        parse_engine(text)
    assert words in str(info.value)


def test_parse_engine_strips_the_trailing_slash():
    assert parse_engine(" r0 = http://127.0.0.1:8000/ ") == EngineSpec("r0", "http://127.0.0.1:8000")


@pytest.mark.parametrize("kwargs, flag", [
    ({"engines": ()}, "--engine"),
    ({"engines": (EngineSpec("a", "http://x"), EngineSpec("a", "http://y"))}, "duplicate"),
    ({"probe_interval_seconds": 0}, "--probe-interval"),
    ({"max_retries": -1}, "--max-retries"),
    ({"epsilon": -0.1}, "--epsilon"),
    ({"affinity_chars": 0}, "--affinity-chars"),
    ({"upstream_connections": 0}, "--upstream-connections"),
    ({"log_format": "xml"}, "--log-format"),
    ({"controller": "ctl:8900"}, "--controller"),
])
def test_config_errors(kwargs, flag):
    base = {"engines": (EngineSpec("a", "http://a"),), **kwargs}
    with pytest.raises(ConfigError, match=flag.replace("-", r"\-")):
        RouterConfig(**base).validate()


def test_attempts_are_capped_by_the_other_replicas():
    two = (EngineSpec("a", "http://a"), EngineSpec("b", "http://b"))
    assert RouterConfig(engines=two, max_retries=5).attempts() == 2
    assert RouterConfig(engines=two, max_retries=0).attempts() == 1


# ------------------------------------------------------------------ controller, logs, catalog


def test_controller_block_reasons():
    assert controller_block({"up": True, "draining": False}) is None
    assert controller_block({"up": True, "draining": True}) == "draining"
    # a failed controller poll alone is no block (the router's own /ready probe judges liveness)
    assert controller_block({"up": False}) is None
    assert controller_block({"up": False, "routable": None, "lifecycle": "running"}) is None
    assert controller_block({"lifecycle": "down"}) == "down"
    assert controller_block({"state": "isolated"}) == "isolated"
    assert controller_block({"lifecycle": "restarting", "draining": False}) == "restarting"
    assert controller_block({"routable": False}) == "not_routable"
    assert controller_block({"state": "serving"}) is None


def test_json_log_line_carries_the_request_fields():
    record = logging.LogRecord("inferctl.router.access", logging.INFO, __file__, 1, "POST %s", ("/v1/x",), None)
    record.request_id, record.replica, record.status, record.duration_seconds = "rid", "r0", 200, 0.01
    doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == "POST /v1/x" and doc["level"] == "info"
    assert (doc["request_id"], doc["replica"], doc["status"], doc["duration_seconds"]) == ("rid", "r0", 200, 0.01)


def test_catalog_names_follow_the_conventions():
    names = [s["name"] for s in ROUTER_METRICS]
    assert len(names) == len(set(names)) and all(n.startswith("inferctl_router_") for n in names)
    for spec in ROUTER_METRICS:
        assert (spec["type"] == "counter") == spec["name"].endswith("_total")
        if spec["type"] == "histogram":
            assert spec["name"].endswith("_seconds") and list(spec["buckets"]) == sorted(spec["buckets"])
    _registry, metrics = build_router_registry()
    assert set(metrics) == set(names)


def test_rejection_codes_are_the_contracts_one_table():
    import inferctl.engine.entrypoints.errors as engine_errors
    import inferctl.router.app as router_app
    from inferctl.contract.errors import REJECTION_CODES

    assert engine_errors.REJECTION_CODES is REJECTION_CODES and router_app.REJECTION_CODES is REJECTION_CODES
    assert REJECTION_CODES["unsupported_media_type"] == "unsupported_media_type"


# ------------------------------------------------------------------ probe against fake replicas


def _fake(ready_status: int | None, health: dict | None = None, stats: dict | None = None) -> FastAPI:
    app = FastAPI()
    if ready_status is not None:
        @app.get("/ready")
        async def ready():
            body = {"ready": True} if ready_status == 200 else {"ready": False, "reason": "starting"}
            return JSONResponse(body, status_code=ready_status)

    @app.get("/health")
    async def health_route():
        return health or {"status": "ok"}

    @app.get("/stats")
    async def stats_route():
        return stats or {}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "m"}]}
    return app


def test_probe_reads_ready_stats_and_falls_back_to_health():
    fakes = {
        "ok": _fake(200, stats={"kv_cache": {"usage_ratio": 0.5}, "scheduler": {"waiting": 3}}),
        "starting": _fake(503),
        "old": _fake(None),                                   # no /ready: judged by /health
        "old_draining": _fake(None, health={"status": "draining"}),
    }

    async def go():
        mounts = {f"http://{n}.test": httpx.ASGITransport(app=a) for n, a in fakes.items()}
        async with httpx.AsyncClient(mounts=mounts) as client:
            replicas = ReplicaSet.from_specs(tuple(EngineSpec(n, f"http://{n}.test") for n in fakes))
            _reg, metrics = build_router_registry()
            await Prober(replicas, client, timeout=5, controller=None, metrics=metrics).round()
            return replicas

    replicas = asyncio.run(go())
    ok = replicas["ok"]
    assert ok.routable and ok.kv_usage_ratio == 0.5 and ok.waiting == 3 and ok.models == frozenset({"m"})
    assert (replicas["starting"].ready, replicas["starting"].reason) == (False, "starting")
    assert replicas["old"].routable
    assert (replicas["old_draining"].ready, replicas["old_draining"].reason) == (False, "draining")
    assert replicas["starting"].kv_usage_ratio is None                       # no reading, not 0


@pytest.mark.parametrize("exc, reason", [(httpx.ConnectError("refused"), "down"),
                                         (httpx.RemoteProtocolError("closed without a response"), "down"),
                                         (httpx.ReadError("reset"), "down"), (httpx.ReadTimeout("slow"), "down"),
                                         (httpx.DecodingError("bad gzip"), "error")])
def test_a_replica_that_cannot_answer_is_down_whatever_the_transport_said(exc, reason):
    def fail(request):
        raise exc

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(fail)) as client:
            replicas = ReplicaSet.from_specs((EngineSpec("gone", "http://gone.test"),))
            _reg, metrics = build_router_registry()
            await Prober(replicas, client, timeout=5, controller=None, metrics=metrics).round()
            return replicas["gone"]

    gone = asyncio.run(go())
    assert (gone.ready, gone.reason, gone.routable) == (False, reason, False)
