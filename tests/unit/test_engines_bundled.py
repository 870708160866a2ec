"""Bundled engine client: /stats -> EngineSnapshot, admin calls with the bearer token, failures."""

from __future__ import annotations

import json

import httpx
import pytest

from inferctl.controller.engines import BundledEngineClient, EngineAdminError, make_engine_client, snapshot_from_stats
from tests.gpu_helpers import TextServer

TOKEN = "s3cret"

STATS = {
    "engine": {"model": "stories260K", "models": ["stories260K"], "device": "cpu", "precision": "int8",
               "kv_cache_dtype": "fp32", "draining": False, "uptime_seconds": 12.3, "version": "0.1.0"},
    "memory": {"budget_bytes": 8_000_000, "allocated_bytes": 5_000_000, "reserved_bytes": 6_000_000,
               "free_bytes": 2_000_000, "weights_bytes": 300_000, "kv_pool_bytes": 4_000_000,
               "full_weights_bytes": 1_100_000, "int8_weights_bytes": 300_000},
    "kv_cache": {"block_size": 16, "num_blocks": 100, "blocks_used": 40, "blocks_free": 60,
                 "tokens_stored": 600, "waste_ratio": 0.0625, "usage_ratio": 0.4},
    "scheduler": {"running": 3, "waiting": 7, "preemptions_total": 2, "steps_total": 500,
                  "step_sequences_total": 1500, "real_tokens_total": 9000, "padded_tokens_total": 1000,
                  "last_step": {"batch_size": 3}},
    "requests": {"finished_total": 42, "by_finish_reason": {"stop": 30, "length": 12}, "errors_total": 0,
                 "prompt_tokens_total": 4000, "completion_tokens_total": 8000,
                 "ttft_seconds": {"p50": 0.01, "p90": 0.02, "p99": 0.05, "count": 42,
                                  "histogram": {"buckets": [[0.01, 20], [0.05, 41], ["+Inf", 42]],
                                                "sum": 0.7, "count": 42}},
                 "recent": [{"request_id": "r1", "completion_tokens": 64, "finish_reason": "length",
                             "seq_rep": {"4": 0.1}, "perplexity": 3.2, "degenerate": False}]},
    "quality": {"nonfinite_logprobs_total": 0, "degenerate_total": 0},
    "faults": {"oom_total": 1, "last_oom": None,
               "recent": [{"id": 1, "time": 1700000000.0, "kind": "exhaustion", "requested_bytes": 96,
                           "free_bytes": 41, "source": "injected", "precision": "full"}]},
}


def test_stats_document_maps_onto_the_snapshot() -> None:
    s = snapshot_from_stats(STATS, name="main", now=5.0)
    assert (s.name, s.kind, s.ok, s.time) == ("main", "bundled", True, 5.0)
    assert (s.precision, s.draining, s.model) == ("int8", False, "stories260K")
    assert (s.memory_budget_bytes, s.memory_allocated_bytes, s.memory_reserved_bytes, s.memory_free_bytes) == (
        8_000_000, 5_000_000, 6_000_000, 2_000_000)
    assert (s.weights_bytes, s.full_weights_bytes) == (300_000, 1_100_000)
    assert (s.kv_usage_ratio, s.kv_waste_ratio) == (0.4, 0.0625)
    assert (s.running, s.waiting, s.preemptions_total) == (3, 7, 2.0)
    assert (s.steps_total, s.step_sequences_total, s.real_tokens_total, s.padded_tokens_total) == (
        500.0, 1500.0, 9000.0, 1000.0)
    assert s.finished_total == 42.0 and s.by_finish_reason == {"stop": 30.0, "length": 12.0}
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (4000.0, 8000.0)
    assert s.ttft_histogram["buckets"] == [(0.01, 20.0), (0.05, 41.0), (float("inf"), 42.0)]
    assert s.ttft_histogram["sum"] == 0.7
    assert s.oom_total == 1.0 and s.faults[0]["requested_bytes"] == 96
    assert s.recent_requests[0]["request_id"] == "r1"
    assert s.missing == ["e2e_histogram"] and s.invalid == [] and s.raw is STATS


def test_absent_null_and_out_of_range_values_are_no_data() -> None:
    doc = {"engine": {"precision": "full"}, "kv_cache": {"usage_ratio": 1.5, "waste_ratio": None},
           "scheduler": {"running": -1, "waiting": "many"}, "memory": {"budget_bytes": True}}
    s = snapshot_from_stats(doc, name="x")
    assert s.kv_usage_ratio is None and s.kv_waste_ratio is None
    assert s.running is None and s.waiting is None and s.memory_budget_bytes is None
    assert s.preemptions_total is None and s.oom_total is None and s.faults == []
    assert sorted(s.invalid) == ["kv_cache.usage_ratio=1.5 (out of range)",
                                 "memory.budget_bytes=True (not a number)",
                                 "scheduler.running=-1 (out of range)",
                                 "scheduler.waiting='many' (not a number)"]
    assert {"running", "waiting", "kv_usage_ratio", "finished_total"} <= set(s.missing)


def engine_app(state: dict):
    """A mock bundled engine (httpx transport): /stats and the admin API with a bearer token."""

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/stats":
            if state.get("down"):
                return httpx.Response(503, text="starting")
            return httpx.Response(200, json=STATS)
        if req.headers.get("authorization") != f"Bearer {TOKEN}":
            return httpx.Response(401, json={"detail": "invalid admin token"})
        body = json.loads(req.content)
        state.setdefault("calls", []).append((req.url.path, body))
        if req.url.path == "/admin/precision":
            return httpx.Response(200, json={"requested": body["mode"], "current": "full"})
        if req.url.path == "/admin/route" and body["model"] not in ("big", "small"):
            return httpx.Response(404, json={"error": {"message": f"model {body['model']} not served"}})
        return httpx.Response(200, json={"ok": True, **body})

    return httpx.MockTransport(handler)


def test_admin_calls_send_the_token_and_return_json() -> None:
    state: dict = {}
    c = BundledEngineClient("main", "http://engine:8000", TOKEN, transport=engine_app(state))
    assert c.set_precision("int8") == {"requested": "int8", "current": "full"}
    assert c.drain(True)["draining"] is True
    assert c.inject_fault("oom", 2)["count"] == 2
    assert c.route("big", "small")["to"] == "small"
    assert state["calls"] == [("/admin/precision", {"mode": "int8"}), ("/admin/drain", {"draining": True}),
                              ("/admin/fault", {"kind": "oom", "count": 2}),
                              ("/admin/route", {"model": "big", "to": "small"})]
    with pytest.raises(EngineAdminError) as err:
        c.route("nope", "small")
    assert (err.value.status, err.value.message) == (404, "model nope not served")


def test_admin_errors_carry_status_and_message() -> None:
    c = BundledEngineClient("main", "http://engine:8000", "wrong", transport=engine_app({}))
    with pytest.raises(EngineAdminError) as err:
        c.set_precision("full")
    assert (err.value.status, err.value.message, err.value.path) == (401, "invalid admin token", "/admin/precision")
    with pytest.raises(ValueError, match="precision mode 'fp8'"):
        c.set_precision("fp8")
    with pytest.raises(ValueError, match="fault count"):
        c.inject_fault("oom", 0)


def test_poll_failures_are_snapshots_not_exceptions() -> None:
    state = {"down": True}
    c = BundledEngineClient("main", "http://engine:8000", TOKEN, transport=engine_app(state))
    s = c.poll(1.0)
    assert s.ok is False and s.error == "GET /stats: HTTP 503" and s.running is None
    state["down"] = False
    assert c.poll(2.0).ok
    garbage = BundledEngineClient("g", "http://e:1", transport=httpx.MockTransport(
        lambda r: httpx.Response(200, text="<html>")))
    assert "not JSON" in garbage.poll(3.0).error


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="base_url 'engine:8000'"):
        BundledEngineClient("main", "engine:8000")
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        BundledEngineClient("main", "http://e:1", timeout_s=0)
    with pytest.raises(ValueError, match="engine kind 'triton'"):
        make_engine_client("triton", "t", "http://e:1")


@pytest.mark.e2e
def test_bundled_client_over_real_http() -> None:
    def admin(handler, body):
        if handler.headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, "application/json", json.dumps({"detail": "invalid admin token"})
        return 200, "application/json", json.dumps({"requested": json.loads(body)["mode"], "current": "full"})

    with TextServer({"/stats": (200, "application/json", json.dumps(STATS)), "/admin/precision": admin}) as srv:
        c = make_engine_client("bundled", "main", srv.url, admin_token=TOKEN, timeout_s=1.0)
        s = c.poll(1.0)
        assert c.set_precision("int8") == {"requested": "int8", "current": "full"}
        c.close()
    assert s.ok and s.running == 3 and s.kv_usage_ratio == 0.4 and s.faults[0]["kind"] == "exhaustion"
    assert srv.requests[-1]["headers"]["Authorization"] == f"Bearer {TOKEN}"
    dead = make_engine_client("bundled", "main", srv.url, admin_token=TOKEN, timeout_s=0.5)
    assert dead.poll(2.0).ok is False
    with pytest.raises(EngineAdminError) as err:
        dead.drain(True)
    assert err.value.status == 0 and "ConnectError" in err.value.message


def test_latency_histograms_come_from_metrics_for_the_stats_model() -> None:
    metrics = "".join(
        f'inferctl_engine_time_to_first_token_seconds_bucket{{le="{le}",model="{m}"}} {n}\n'
        for m, counts in (("stories260K", (2, 5, 5)), ("light", (0, 0, 9)))
        for le, n in zip(("0.01", "0.1", "+Inf"), counts))
    metrics += ('inferctl_engine_time_to_first_token_seconds_count{model="stories260K"} 5\n'
                'inferctl_engine_time_to_first_token_seconds_sum{model="stories260K"} 0.2\n'
                'inferctl_engine_time_to_first_token_seconds_count{model="light"} 9\n')
    stats = {k: v for k, v in STATS.items()}
    stats["requests"] = {k: v for k, v in STATS["requests"].items() if k != "ttft_seconds"}

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/stats":
            return httpx.Response(200, json=stats)
        return httpx.Response(200, text=metrics)

    s = BundledEngineClient("main", "http://e:1", transport=httpx.MockTransport(handler)).poll(1.0)
    assert s.ttft_histogram["buckets"] == [(0.01, 2.0), (0.1, 5.0), (float("inf"), 5.0)]   # light's 9 excluded
    assert (s.ttft_histogram["count"], s.ttft_histogram["sum"]) == (5.0, 0.2)
    assert "ttft_histogram" not in s.missing and "e2e_histogram" in s.missing
    off = BundledEngineClient("main", "http://e:1", scrape_metrics=False,
                              transport=httpx.MockTransport(handler)).poll(1.0)
    assert off.ttft_histogram is None and "ttft_histogram" in off.missing


def test_number_fast_path_edges_read_as_the_full_checks() -> None:
    """The reader's fast path (a JSON int or float in range) and its fall-through agree with
    the full checks at the edges: int ratios 0/1 accepted as floats, 2 out of range, an int past
    float range and an infinite float rejected, a bool never a number."""
    doc = {"kv_cache": {"usage_ratio": 1, "waste_ratio": 0},
           "scheduler": {"steps_total": 2 ** 70, "preemptions_total": 3, "running": float("inf"),
                         "step_sequences_total": 10 ** 400, "real_tokens_total": -0.0},
           "memory": {"budget_bytes": 2.0, "allocated_bytes": False},
           "requests": {"finished_total": 5.5}}
    doc2 = {"kv_cache": {"usage_ratio": 2}}
    s = snapshot_from_stats(doc, name="x")
    assert (s.kv_usage_ratio, s.kv_waste_ratio) == (1.0, 0.0) and type(s.kv_usage_ratio) is float
    assert s.steps_total == float(2 ** 70) and s.preemptions_total == 3.0 and type(s.preemptions_total) is float
    assert s.running is None and s.step_sequences_total is None and s.real_tokens_total == 0.0
    assert s.memory_budget_bytes == 2 and type(s.memory_budget_bytes) is int and s.memory_allocated_bytes is None
    assert s.finished_total == 5.5
    assert sorted(s.invalid) == ["memory.allocated_bytes=False (not a number)",
                                 "scheduler.running=inf (out of range)",
                                 f"scheduler.step_sequences_total={repr(10 ** 400)[:80]} (out of range)"]
    assert snapshot_from_stats(doc2, name="y").invalid == ["kv_cache.usage_ratio=2 (out of range)"]
