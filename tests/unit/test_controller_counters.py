"""Labelled controller counters exist at 0 from the controller's start (so PromQL increase()
sees their first event), restart reasons are a fixed label set, breaker trips are counted."""

from __future__ import annotations

import pytest

from inferctl.controller.actions import RESTART_REASONS, Actions, restart_reason
from inferctl.controller.events import EVENT_KINDS
from inferctl.controller.loop import Controller
from inferctl.controller.policies import LatencyBreaker
from inferctl.controller.policies.precision import PrecisionPolicy
from tests.controller_helpers import FakeClock, FakeEngineClient, StaticGpuSource, loop_parts
from tests.policy_helpers import ttft_hist


def build(tmp_path, clock=None):
    cfg, registry, metrics, log = loop_parts(
        tmp_path, [{"name": "main", "url": "http://127.0.0.1:9000"},
                   {"name": "vllm0", "kind": "vllm", "url": "http://127.0.0.1:9001"}])
    clients = {"main": FakeEngineClient("main"), "vllm0": FakeEngineClient("vllm0")}
    acts = Actions(clients, event_log=log, metrics=metrics, confirm_timeout_seconds=0.2,
                   poll_interval_seconds=0.01)
    policies = {"main": {"precision": PrecisionPolicy({}, engine="main"),
                         "breaker": LatencyBreaker({"light_model": "tiny", "min_requests": 20,
                                                    "window_seconds": 30}, engine="main")},
                "vllm0": {}}
    ctl = Controller(cfg, clients, StaticGpuSource(), policies, acts, log, metrics, registry=registry,
                     supervisors={"main": object()}, clock=clock or FakeClock())
    return ctl, registry, clients


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_known_label_sets_start_at_zero(tmp_path):
    ctl, reg, _ = build(tmp_path)
    for kind in EVENT_KINDS:
        assert value(reg, "inferctl_events_total", kind=kind) == 0.0, kind
    for to in ("full", "int8"):
        assert value(reg, "inferctl_precision_switches_total", engine="main", to=to) == 0.0
    for kind in ("fragmentation", "exhaustion", "impossible", "hardware", "unknown"):
        assert value(reg, "inferctl_engine_oom_events_total", engine="main", kind=kind) == 0.0
    assert value(reg, "inferctl_engine_drains_total", engine="main") == 0.0
    for reason in ("fragmentation", "hardware", "operator", "crash"):
        assert value(reg, "inferctl_engine_restarts_total", engine="main", reason=reason) == 0.0
    assert value(reg, "inferctl_breaker_trips_total", engine="main") == 0.0
    for poller in ("gpu", "engine:main", "engine:vllm0"):
        assert value(reg, "inferctl_poll_errors_total", poller=poller) == 0.0
    # a watched vLLM has no precision, drain, OOM or restart series (it cannot have those events)
    assert value(reg, "inferctl_precision_switches_total", engine="vllm0", to="int8") is None
    assert value(reg, "inferctl_engine_oom_events_total", engine="vllm0", kind="exhaustion") is None
    assert value(reg, "inferctl_engine_restarts_total", engine="vllm0", reason="crash") is None
    assert value(reg, "inferctl_breaker_trips_total", engine="vllm0") is None
    # GPUs are not known yet: no reset series
    assert value(reg, "inferctl_gpu_resets_total", gpu="0", outcome="success") is None


def test_gpu_reset_counters_appear_at_zero_once_the_gpus_are_known(tmp_path):
    ctl, reg, _ = build(tmp_path)
    ctl.tick()
    for gpu in ("0", "1"):
        for outcome in ("success", "failed", "refused", "dry_run"):
            assert value(reg, "inferctl_gpu_resets_total", gpu=gpu, outcome=outcome) == 0.0
    ctl.tick()                                   # idempotent: still 0, no reset happened
    assert value(reg, "inferctl_gpu_resets_total", gpu="1", outcome="failed") == 0.0


def test_first_event_is_an_increase_from_zero(tmp_path):
    ctl, reg, clients = build(tmp_path)
    before = value(reg, "inferctl_engine_oom_events_total", engine="main", kind="exhaustion")
    clients["main"].faults.append({"id": 1, "time": 1_700_000_000.0, "kind": "exhaustion",
                                   "requested_bytes": 1 << 20, "free_bytes": 0, "message": "oom"})
    ctl.tick(1_700_000_000.5)
    ctl.wait_for_actions(5)
    assert (before, value(reg, "inferctl_engine_oom_events_total", engine="main", kind="exhaustion")) == (0.0, 1.0)


def test_restart_reason_labels_are_a_fixed_set():
    assert RESTART_REASONS == ("fragmentation", "hardware", "operator", "crash", "liveness")
    assert restart_reason("fragmentation") == "fragmentation"
    assert restart_reason("liveness") == "liveness"     # a hang restart (controller/policies/liveness.py)
    assert restart_reason("hardware") == "hardware"
    # an operator's name (from a request header) never becomes a label value
    assert restart_reason("alice") == "operator" and restart_reason("operator") == "operator"


def test_breaker_trips_are_counted_when_it_opens(tmp_path):
    clock = FakeClock()
    ctl, reg, clients = build(tmp_path, clock)
    main = clients["main"]
    main.memory = {"ttft_histogram": ttft_hist([]), "model": "stories"}
    ctl.tick(clock.t)
    clock.advance(5)
    main.memory = {"ttft_histogram": ttft_hist([2.0] * 30), "model": "stories"}   # p99 2 s > 0.5 s
    ctl.tick(clock.t)
    ctl.wait_for_actions(5)
    assert ctl.policies["main"]["breaker"].current.value == "open"
    assert value(reg, "inferctl_breaker_trips_total", engine="main") == 1.0
    clock.advance(1)
    ctl.tick(clock.t)                            # still open: not a new trip
    ctl.wait_for_actions(5)
    assert value(reg, "inferctl_breaker_trips_total", engine="main") == 1.0
    assert ("route", "stories", "tiny") in main.calls


def test_ttft_p99_in_the_inf_bucket_is_exported_as_a_saturated_lower_bound(tmp_path):
    clock = FakeClock()
    ctl, reg, clients = build(tmp_path, clock)
    main = clients["main"]
    h0 = ttft_hist([])
    main.memory = {"ttft_histogram": h0, "model": "stories"}
    ctl.tick(clock.t)
    assert value(reg, "inferctl_ttft_p99_seconds", engine="main") is None      # no window yet
    assert value(reg, "inferctl_ttft_p99_saturated", engine="main") is None
    clock.advance(5)
    h1 = ttft_hist([30.0] * 25, base=h0)                # all beyond the largest bound (10 s)
    main.memory = {"ttft_histogram": h1, "model": "stories"}
    ctl.tick(clock.t)
    ctl.wait_for_actions(5)
    assert value(reg, "inferctl_ttft_p99_seconds", engine="main") == 10.0      # the bound ...
    assert value(reg, "inferctl_ttft_p99_saturated", engine="main") == 1.0     # ... a lower bound
    # open → half-open after open_seconds; probes answer fast: p99 inside a finite bucket
    clock.advance(31)
    ctl.tick(clock.t)
    ctl.wait_for_actions(5)
    clock.advance(1)
    main.memory = {"ttft_histogram": ttft_hist([0.02] * 10, base=h1), "model": "stories"}
    ctl.tick(clock.t)
    ctl.wait_for_actions(5)
    assert value(reg, "inferctl_ttft_p99_seconds", engine="main") == pytest.approx(0.0495)
    assert value(reg, "inferctl_ttft_p99_saturated", engine="main") == 0.0


def test_oom_counter_dedupe_survives_the_bound_on_remembered_faults(tmp_path):
    """The loop remembers at most ~10,000 fault keys; trimming them must not count the faults
    the engine still reports (its recent list) a second time."""
    ctl, reg, clients = build(tmp_path)
    clients["main"].faults.append({"id": 1, "time": 1_700_000_000.0, "kind": "exhaustion",
                                   "requested_bytes": 1 << 20, "free_bytes": 0, "message": "oom"})
    ctl.tick(1_700_000_000.5)
    ctl.wait_for_actions(5)
    ctl._seen_faults["main"].update(("old", i) for i in range(10_001))   # a long-lived controller
    for t in (1_700_000_001.5, 1_700_000_002.5):
        ctl.tick(t)
        ctl.wait_for_actions(5)
    assert value(reg, "inferctl_engine_oom_events_total", engine="main", kind="exhaustion") == 1.0
    assert len(ctl._seen_faults["main"]) <= 10_001
