"""The liveness policies driven by snapshot sequences: engine down/up pairs, restarts seen from
the uptime and from counter resets, GPU telemetry lost/regained and single GPUs missing, and
the engine hang (issue 10 items 7 and 11)."""

from __future__ import annotations

import pytest

from inferctl.controller.policies.liveness import (EngineLiveness, GpuTelemetryLiveness, Liveness,
                                                   LivenessConfig)
from inferctl.controller.types import EngineSnapshot, GpuReading
from tests.controller_helpers import engine_snapshot, gpu

T0 = 1_800_000_000.0


def snap(t: float, *, uptime: float | None = None, steps: float | None = 10.0, running: int | None = 0,
         waiting: int | None = 0, alive: bool | None = None, finished: float | None = 4.0) -> EngineSnapshot:
    engine: dict = {}
    if uptime is not None:
        engine["uptime_seconds"] = uptime
    if alive is not None:
        engine["step_thread_alive"] = alive
    return engine_snapshot("e1", time=t, steps_total=steps, running=running, waiting=waiting,
                           finished_total=finished, raw={"engine": engine})


def down(t: float, error: str = "connection refused") -> EngineSnapshot:
    return EngineSnapshot(name="e1", kind="bundled", ok=False, time=t, error=error)


def drive(pol, seq):
    out = []
    for s in seq:
        out += pol.observe(s.time, s)
    return out


def test_down_then_up_is_one_pair_with_last_seen_values_and_downtime():
    pol = EngineLiveness({"hang_seconds": 20}, engine="e1")
    ds = drive(pol, [snap(T0, uptime=100, steps=37, running=2, waiting=1), down(T0 + 5), down(T0 + 10),
                     down(T0 + 15, "timeout"), snap(T0 + 22, uptime=122, steps=37, running=0)])
    assert [(d.from_state, d.to_state) for d in ds] == [("up", "down"), ("down", "up")]
    dn, up = ds
    assert dn.severity == "warning" and dn.action is None
    assert dn.inputs["last_seen"]["steps_total"] == 37 and dn.inputs["last_seen"]["running"] == 2
    assert dn.inputs["last_seen"]["uptime_seconds"] == 100 and "connection refused" in dn.reason
    assert up.inputs["downtime_seconds"] == pytest.approx(17.0) and up.inputs["last_error"] == "timeout"
    assert up.inputs["restarted"] is False           # uptime 100 → 122 over 22 s: the same process
    assert pol.state(T0 + 22)["counts"]["down"] == 1


def test_a_one_poll_outage_is_still_a_pair_and_the_restart_goes_in_the_up_event():
    pol = EngineLiveness(engine="e1")
    ds = drive(pol, [snap(T0, uptime=500), down(T0 + 1), snap(T0 + 2, uptime=0.7, steps=0, finished=0)])
    assert [(d.from_state, d.to_state) for d in ds] == [("up", "down"), ("down", "up")]
    signals = {e["signal"]: (e["before"], e["after"]) for e in ds[1].inputs["evidence"]}
    assert signals["uptime_seconds"] == (500, 0.7)
    assert signals["steps_total"] == (10.0, 0) and signals["finished_total"] == (4.0, 0)
    assert "restarted (uptime_seconds 500 → 0.7" in ds[1].reason


def test_the_first_poll_failing_is_a_down_event_the_first_good_one_says_nothing():
    assert drive(EngineLiveness(engine="e1"), [snap(T0), snap(T0 + 1)]) == []
    ds = drive(EngineLiveness(engine="e1"), [down(T0)])
    assert [(d.from_state, d.to_state) for d in ds] == [("unknown", "down")]
    assert "never seen up" in ds[0].reason and ds[0].inputs["last_seen"] is None


def test_restart_between_two_good_polls_from_the_uptime_drop():
    pol = EngineLiveness(engine="e1")
    ds = drive(pol, [snap(T0, uptime=300, steps=50), snap(T0 + 2, uptime=1.5, steps=90)])
    assert len(ds) == 1 and ds[0].kind == "observation" and ds[0].action is None
    assert [e["signal"] for e in ds[0].inputs["evidence"]] == ["uptime_seconds"]   # steps went up: not evidence
    assert pol.state()["counts"]["restarts"] == 1
    # the uptime keeps growing afterwards: no second event
    assert drive(pol, [snap(T0 + 4, uptime=3.5, steps=95)]) == []


def test_restart_from_a_counter_reset_without_uptime():
    pol = EngineLiveness(engine="e1")
    ds = drive(pol, [snap(T0, steps=800, finished=40), snap(T0 + 2, steps=3, finished=40)])
    assert len(ds) == 1 and [e["signal"] for e in ds[0].inputs["evidence"]] == ["steps_total"]
    assert "steps_total 800 → 3" in ds[0].reason


def test_hang_after_hang_seconds_with_work_queued_restarts_a_launched_engine():
    pol = EngineLiveness({"hang_seconds": 12}, engine="e1", can_restart=True)
    seq = [snap(T0 + t, steps=77, running=1, waiting=3) for t in (0, 4, 8, 11.9)]
    assert drive(pol, seq) == []
    ds = drive(pol, [snap(T0 + 12.5, steps=77, running=1, waiting=3)])
    assert len(ds) == 1
    d = ds[0]
    assert (d.from_state, d.to_state, d.action, d.severity) == ("up", "hung", "restart_engine", "critical")
    assert d.inputs["steps_total"] == 77 and d.inputs["stalled_seconds"] == pytest.approx(12.5)
    assert d.inputs["force"] is True
    # still stalled: no second decision until hang_seconds more, then one "still hung" note
    assert drive(pol, [snap(T0 + 16, steps=77, running=1, waiting=3)]) == []
    pol.on_result(T0 + 17, d, False, "restart failed: boom")
    ds = drive(pol, [snap(T0 + 25, steps=77, running=1, waiting=3), snap(T0 + 40, steps=77, running=1, waiting=3)])
    assert len(ds) == 1 and ds[0].kind == "observation" and "failed: restart failed: boom" in ds[0].reason
    # steps advance: recovered
    ds = drive(pol, [snap(T0 + 41, steps=78, running=1, waiting=3)])
    assert [(d.from_state, d.to_state) for d in ds] == [("hung", "up")]


def test_hang_of_an_engine_not_launched_is_recorded_only():
    pol = EngineLiveness({"hang_seconds": 5}, engine="e1", can_restart=False)
    ds = drive(pol, [snap(T0, steps=9, waiting=2), snap(T0 + 6, steps=9, waiting=2)])
    assert len(ds) == 1 and ds[0].action is None and ds[0].to_state == "hung" and ds[0].kind == "transition"
    assert "record only" in ds[0].reason


def test_dead_step_thread_with_work_is_a_hang_at_once():
    pol = EngineLiveness({"hang_seconds": 60}, engine="e1", can_restart=True)
    ds = drive(pol, [snap(T0, steps=5, running=1), snap(T0 + 1, steps=5, running=1, alive=False)])
    assert len(ds) == 1 and ds[0].action == "restart_engine" and ds[0].inputs["step_thread_alive"] is False
    # a dead thread with nothing queued is not a hang
    pol2 = EngineLiveness({"hang_seconds": 60}, engine="e1", can_restart=True)
    assert drive(pol2, [snap(T0, running=0, waiting=0, alive=False), snap(T0 + 1, running=0, waiting=0,
                                                                          alive=False)]) == []


@pytest.mark.parametrize("name, seq", [
    ("idle", [snap(T0 + t, steps=5, running=0, waiting=0) for t in range(0, 100, 10)]),
    ("steps advance", [snap(T0 + t, steps=5 + t, running=4, waiting=9) for t in range(0, 100, 10)]),
    ("steps_total missing", [snap(T0 + t, steps=None, running=4, waiting=9) for t in range(0, 100, 10)]),
    ("queue unknown", [snap(T0 + t, steps=5, running=None, waiting=None) for t in range(0, 100, 10)]),
])
def test_no_hang(name, seq):
    pol = EngineLiveness({"hang_seconds": 30}, engine="e1", can_restart=True)
    assert drive(pol, seq) == [], name
    assert pol.current is Liveness.UP


def test_the_stall_clock_restarts_when_work_drains_in_between():
    pol = EngineLiveness({"hang_seconds": 30}, engine="e1", can_restart=True)
    seq = ([snap(T0 + t, steps=5, waiting=1) for t in (0, 20)] + [snap(T0 + 25, steps=5, waiting=0)]
           + [snap(T0 + t, steps=5, waiting=1) for t in (40, 60)])
    assert drive(pol, seq) == []          # 20 s + 20 s stalled, never 30 s in a row
    assert len(drive(pol, [snap(T0 + 71, steps=5, waiting=1)])) == 1


def test_config_limits():
    with pytest.raises(ValueError, match="hang_seconds"):
        LivenessConfig(hang_seconds=0)
    with pytest.raises(ValueError, match="unknown field"):
        EngineLiveness({"hang_secs": 5})


def reading(t: float, *indices: int, ok: bool = True) -> GpuReading:
    if not ok:
        return GpuReading(source="nvml", ok=False, error="NVML_ERROR_UNKNOWN", time=t)
    return GpuReading(source="nvml", ok=True, time=t, gpus={g.uuid: g for g in (gpu(i) for i in indices)})


def test_gpu_telemetry_lost_and_regained_is_one_pair():
    pol = GpuTelemetryLiveness()
    ds = []
    for r in [reading(T0, 0, 1), reading(T0 + 5, ok=False), reading(T0 + 10, ok=False), reading(T0 + 19, 0, 1)]:
        ds += pol.observe(r.time, r)
    assert [(d.from_state, d.to_state) for d in ds] == [("up", "down"), ("down", "up")]
    assert ds[0].target == "nvml" and ds[0].severity == "warning"
    assert sorted(ds[0].inputs["last_seen"]["gpus"].values()) == [0, 1]
    assert ds[1].inputs["downtime_seconds"] == pytest.approx(14.0)
    assert ds[1].inputs["last_error"] == "NVML_ERROR_UNKNOWN"


def test_a_single_gpu_missing_from_the_reading_and_back():
    pol = GpuTelemetryLiveness()
    ds = []
    for r in [reading(T0, 0, 1), reading(T0 + 5, 0), reading(T0 + 10, 0), reading(T0 + 18, 0, 1)]:
        ds += pol.observe(r.time, r)
    uuid1 = gpu(1).uuid
    assert [(d.target, d.from_state, d.to_state) for d in ds] == [(uuid1, "up", "missing"), (uuid1, "missing", "up")]
    assert ds[0].inputs["gpu_index"] == 1 and ds[0].inputs["pci_bus_id"] == gpu(1).pci_bus_id
    assert ds[1].inputs["missing_seconds"] == pytest.approx(13.0)
    assert pol.state()["gpus"][uuid1]["state"] == "up"


def test_build_policies_restarts_only_launched_bundled_engines_and_checks_the_section():
    from inferctl.controller.config import parse_config
    from inferctl.controller.runtime import build_policies

    cfg = parse_config({"engines": [{"name": "own", "kind": "bundled", "launch": {"port": 18123}},
                                    {"name": "watched", "kind": "vllm", "url": "http://127.0.0.1:18124"}],
                        "policies": {"liveness": {"hang_seconds": 45}}})
    per_engine, gpu_policies = build_policies(cfg, None)
    assert per_engine["own"]["liveness"].can_restart is True
    assert per_engine["watched"]["liveness"].can_restart is False
    assert per_engine["own"]["liveness"].config.hang_seconds == 45
    assert isinstance(gpu_policies["telemetry"], GpuTelemetryLiveness)
    with pytest.raises(ValueError, match="liveness.*hang_seconds"):
        parse_config({"engines": [{"name": "w", "kind": "vllm", "url": "http://127.0.0.1:1"}],
                      "policies": {"liveness": {"hang_seconds": -1}}})
    off = parse_config({"engines": [{"name": "w", "kind": "vllm", "url": "http://127.0.0.1:1"}],
                        "policies": {"liveness": {"enabled": False}}})
    assert "liveness" not in build_policies(off, None)[0]["w"] and "telemetry" not in build_policies(off, None)[1]
