"""Breaking the controller with bad sources: engines that hang or answer garbage, GPU readings
with impossible numbers. The loop keeps running, a bad value is "no data" (never 0), and bad
data never rolls an engine back."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from inferctl.controller.engines.bundled import BundledEngineClient, snapshot_from_stats
from inferctl.controller.engines.promtext import PromTextEngineClient
from inferctl.controller.gpu.dcgm import DcgmGpuSource
from inferctl.controller.types import GpuSnapshot
from tests.controller_helpers import FakeClock, FakeEngineClient, StaticGpuSource, gpu, make_controller

GIB = 1024 ** 3
HUGE = "1" + "0" * 400          # an integer JSON number far beyond float range


def stats_doc(**memory) -> dict:
    return {"engine": {"model": "m", "precision": "full", "draining": False},
            "memory": {"budget_bytes": 8_000_000, "allocated_bytes": 0, "reserved_bytes": 0, **memory},
            "scheduler": {"running": 0, "waiting": 0}, "faults": {"oom_total": 0, "recent": []}}


def mock_client(body: str | bytes, status: int = 200, ctype: str = "application/json") -> BundledEngineClient:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(404)
        return httpx.Response(status, content=body if isinstance(body, bytes) else body.encode(),
                              headers={"content-type": ctype})
    return BundledEngineClient("e", "http://engine.test", transport=httpx.MockTransport(handler))


# --------------------------------------------------------------------------- engine clients
def test_a_number_beyond_float_range_is_invalid_not_a_failed_poll():
    text = json.dumps(stats_doc()).replace('"budget_bytes": 8000000', f'"budget_bytes": {HUGE}')
    text = text.replace('"oom_total": 0', f'"oom_total": {HUGE}')
    snap = mock_client(text).poll(1.0)
    assert snap.ok, snap.error
    assert snap.memory_budget_bytes is None and snap.oom_total is None
    assert any(i.startswith("memory.budget_bytes=") for i in snap.invalid)
    assert snap.running == 0 and snap.precision == "full"        # the rest is still read


def test_finish_reason_counts_beyond_float_range_are_dropped():
    doc = stats_doc()
    text = json.dumps(doc)[:-1] + f', "requests": {{"by_finish_reason": {{"stop": 3, "length": {HUGE}}}}}}}'
    snap = mock_client(text).poll(1.0)
    assert snap.ok, snap.error
    assert snap.by_finish_reason == {"stop": 3.0}


def test_garbage_fault_records_are_cleaned_field_by_field():
    doc = stats_doc()
    doc["faults"]["recent"] = [
        {"id": [1], "time": {"a": 1}, "kind": "exhaustion", "message": "x"},
        {"id": 2, "time": float("nan"), "kind": ["x"], "requested_bytes": -1, "message": 5},
        {"id": 3, "time": 100.0, "kind": "exhaustion", "requested_bytes": 1024, "message": "ok"},
        "not a record"]
    snap = snapshot_from_stats(json.loads(json.dumps(doc)), name="e")
    assert len(snap.faults) == 3
    first, second, third = snap.faults
    assert first["id"] is None and first["time"] is None and first["kind"] == "exhaustion"
    assert second["time"] is None and second["kind"] is None and second["requested_bytes"] is None
    assert second["message"] is None
    assert third == {"id": 3, "time": 100.0, "kind": "exhaustion", "requested_bytes": 1024, "message": "ok"}
    for f in snap.faults:          # every value a dedupe key uses is hashable
        hash((f.get("time"), f.get("id"), f.get("message")))
    assert any("faults.recent[0].id" in i for i in snap.invalid)


@pytest.mark.parametrize("body, ctype, words", [
    ("<html><body>hello</body></html>", "text/html", "not JSON"),
    ('{"engine": {', "application/json", "not JSON"),
    ("[" * 100_000, "application/json", "not JSON"),
    ("[1, 2]", "application/json", "not a JSON object"),
], ids=["html", "truncated", "nested", "list"])
def test_unreadable_stats_are_a_failed_poll_with_every_number_none(body, ctype, words):
    snap = mock_client(body, ctype=ctype).poll(1.0)
    assert snap.ok is False and words in snap.error
    assert snap.running is None and snap.memory_free_bytes is None and snap.kv_usage_ratio is None


def test_vllm_garbage_lines_leave_fields_missing_and_log_once(caplog):
    text = ("vllm:num_requests_running{model_name=\"m\"} NaN\n"
            "vllm:num_requests_waiting{model_name=\"m\"} -4\n"
            "garbage line here {{{\n"
            "vllm:gpu_cache_usage_perc{model_name=\"m\"} 17\n")
    client = PromTextEngineClient("v", "http://vllm.test", flavor="vllm",
                                  transport=httpx.MockTransport(lambda r: httpx.Response(200, text=text)))
    with caplog.at_level(logging.WARNING, logger="inferctl.controller.engines.promtext"):
        snaps = [client.poll(float(i)) for i in range(5)]
    assert all(s.ok for s in snaps)
    assert snaps[-1].running is None and snaps[-1].waiting is None and snaps[-1].kv_usage_ratio is None
    assert {"running", "waiting"} <= set(snaps[-1].missing)
    warnings = [r for r in caplog.records if "invalid sample" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


def test_an_engine_that_accepts_and_never_answers_backs_off_and_stays_down(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    port = srv.getsockname()[1]
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        hang = BundledEngineClient("hang", f"http://127.0.0.1:{port}", timeout_s=0.1)
        clock = FakeClock()
        ctl, registry, log = make_controller(tmp_path, {"hang": hang}, clock=clock)
        job = ctl._jobs["engine:hang"]
        delays = []
        for _ in range(3):
            ctl.poll_engine("hang", reconcile=True, force=True)
            delays.append(job.next_attempt - clock())
        assert delays == pytest.approx([0.4, 0.8, 1.6], abs=1e-3)   # interval 0.2 s × 2^failures
        st = ctl.status()["engines"]["hang"]
        assert st["up"] is False and st["running"] is None and st["memory"]["free_bytes"] is None
        assert registry.get_sample_value("inferctl_engine_up", {"engine": "hang"}) == 0.0
        assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "hang"}) is None
        assert registry.get_sample_value("inferctl_poll_errors_total", {"poller": "engine:hang"}) == 3.0
        hang.close()
    finally:
        stop.set()
        t.join(2)
        for s in held:
            s.close()
        srv.close()


# --------------------------------------------------------------------------- the loop
def test_garbage_faults_do_not_break_the_loop(tmp_path):
    client = FakeEngineClient()
    ctl, registry, log = make_controller(tmp_path, {"main": client})
    ctl.tick()
    client.faults = [{"id": [1], "time": {"a": 1}, "kind": "exhaustion", "message": "x"},
                     {"id": {"x": 1}, "time": [2.0], "kind": "fragmentation", "message": ["m"]}]
    ctl.tick()
    ctl.tick()
    errors = [e for e in log.query(limit=100) if e["kind"] == "error"]
    assert errors == [], errors
    # the two records were each counted once, as OOM events of their kind
    assert registry.get_sample_value("inferctl_engine_oom_events_total",
                                     {"engine": "main", "kind": "exhaustion"}) == 1.0
    assert registry.get_sample_value("inferctl_engine_oom_events_total",
                                     {"engine": "main", "kind": "fragmentation"}) == 1.0


def bad_gpu(index: int = 0, **fields) -> GpuSnapshot:
    snap = gpu(index)
    for k, v in fields.items():
        setattr(snap, k, v)
    return snap


def test_impossible_gpu_numbers_are_no_data_never_zero(tmp_path):
    src = StaticGpuSource({0: bad_gpu(0, memory_total_bytes="abc", memory_used_bytes=-1,
                                      memory_free_bytes=None, utilization_ratio=5.0,
                                      temperature_celsius="hot"),
                           1: bad_gpu(1, memory_total_bytes=100 * 2 ** 20, memory_used_bytes=200 * 2 ** 20,
                                      memory_free_bytes=-50 * 2 ** 20, memory_reserved_bytes=float("nan"))})
    ctl, registry, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=src)
    ctl.tick()
    ctl.tick()
    v = registry.get_sample_value
    u0, u1 = src.gpus[0].uuid, src.gpus[1].uuid
    for metric in ("inferctl_gpu_memory_total_bytes", "inferctl_gpu_memory_used_bytes",
                   "inferctl_gpu_memory_free_bytes", "inferctl_gpu_utilization_ratio",
                   "inferctl_gpu_temperature_celsius"):
        assert v(metric, {"gpu": "0", "uuid": u0}) is None, metric
    assert v("inferctl_gpu_memory_total_bytes", {"gpu": "1", "uuid": u1}) == 100 * 2 ** 20
    for metric in ("inferctl_gpu_memory_used_bytes", "inferctl_gpu_memory_free_bytes",
                   "inferctl_gpu_memory_reserved_bytes"):
        assert v(metric, {"gpu": "1", "uuid": u1}) is None, metric
    dev = {d["index"]: d for d in ctl.status()["gpus"]["devices"]}
    assert dev[0]["memory_total_bytes"] is None and dev[0]["utilization_ratio"] is None
    assert dev[1]["memory_used_bytes"] is None and dev[1]["memory_free_bytes"] is None
    assert v("inferctl_gpu_telemetry_up", {"source": "static"}) == 1.0
    invalid = ctl.status()["invalid_samples"]
    assert invalid and "gpu_memory_used_bytes" in json.dumps(invalid)


def test_gpu_free_above_total_never_rolls_back(tmp_path):
    """The engine runs in int8 and its GPU reports far more free memory than it has: the hold
    clock never starts, so no rollback however long it lasts."""
    clock = FakeClock()
    src = StaticGpuSource({0: bad_gpu(0, memory_total_bytes=80 * GIB, memory_used_bytes=0,
                                      memory_free_bytes=800 * GIB)})
    client = FakeEngineClient()
    client.precision = "int8"
    client.memory = {"full_weights_bytes": 4 * GIB, "weights_bytes": 1 * GIB}
    ctl, _, log = make_controller(tmp_path, {"main": client}, gpu_source=src, clock=clock, hold_seconds=2.0)
    for _ in range(10):
        ctl.tick(clock())
        clock.advance(1.0)
    ctl.wait_for_actions(5)
    assert ("precision", "full") not in client.calls
    st = ctl.status()["engines"]["main"]["policies"]["precision"]
    assert st["state"] == "int8" and st["hold_started"] is None
    # the same engine with a consistent GPU reading rolls back after its hold (the test can fail)
    src.gpus[0].memory_free_bytes = 79 * GIB
    for _ in range(6):
        ctl.tick(clock())
        clock.advance(1.0)
    ctl.wait_for_actions(5)
    assert ("precision", "full") in client.calls


def test_dcgm_endpoint_that_500s_is_telemetry_down_with_no_numbers(tmp_path):
    dcgm = DcgmGpuSource("http://dcgm.test/metrics",
                         transport=httpx.MockTransport(lambda r: httpx.Response(500, text="boom")))
    ctl, registry, log = make_controller(tmp_path, {"main": FakeEngineClient()}, gpu_source=dcgm)
    ctl.tick()
    st = ctl.status()["gpus"]
    assert st["ok"] is False and "HTTP 500" in st["error"] and st["devices"] == []
    assert registry.get_sample_value("inferctl_gpu_telemetry_up", {"source": "dcgm"}) == 0.0
    assert ctl._jobs["gpu"].failures == 1
    text = ctl.status()
    assert text["controller"]["running"] is False


# --------------------------------------------------------------------------- endless bodies
def endless(chunk: bytes = b"x" * 65536, pause: float = 0.0):
    def gen():
        while True:
            if pause:
                time.sleep(pause)
            yield chunk
    return gen()


@pytest.mark.parametrize("kind", ["bundled", "vllm", "dcgm", "sim"])
@pytest.mark.parametrize("pause", [0.0, 0.05], ids=["flood", "trickle"])
def test_an_endless_body_is_cut_off_not_read_forever(kind, pause):
    """httpx's timeouts bound each read, not the body: an engine or exporter that streams
    without end must fail the poll within its deadline and bounded memory."""
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=endless(pause=pause)))
    t0 = time.monotonic()
    if kind == "bundled":
        snap = BundledEngineClient("e", "http://e.test", timeout_s=0.5, transport=transport).poll(1.0)
        ok, error = snap.ok, snap.error
    elif kind == "vllm":
        snap = PromTextEngineClient("v", "http://v.test", timeout_s=0.5, transport=transport).poll(1.0)
        ok, error = snap.ok, snap.error
    elif kind == "dcgm":
        reading = DcgmGpuSource("http://d.test/metrics", timeout_s=0.5, transport=transport).poll(1.0)
        ok, error = reading.ok, reading.error
    else:
        from inferctl.controller.gpu.sim import SimGpuSource
        reading = SimGpuSource("http://e.test/stats", timeout_s=0.5, transport=transport).poll(1.0)
        ok, error = reading.ok, reading.error
    elapsed = time.monotonic() - t0
    assert ok is False
    assert ("larger than" in error) if pause == 0.0 else ("still arriving" in error), error
    assert elapsed < 3.0, elapsed
