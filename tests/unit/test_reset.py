"""GPU reset rails, run for real against tests/fake_bin/nvidia-smi on PATH."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from inferctl.controller.events import EventLog
from inferctl.controller.metrics import build_registry
from inferctl.controller.reset import GpuResetter
from tests.controller_helpers import FakeClock, FakeNvidiaSmi, StaticGpuSource, gpu

Q_APPS = ["-i", "0", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]
Q_PM = ["-i", "0", "--query-gpu=persistence_mode", "--format=csv,noheader"]
PM0 = ["-i", "0", "-pm", "0"]
PM1 = ["-i", "0", "-pm", "1"]
RESET = ["--gpu-reset", "-i", "0"]


@pytest.fixture
def log(tmp_path):
    return EventLog(tmp_path / "events.db")


def make(log, source=None, clock=None, **kw):
    registry, metrics = build_registry()
    r = GpuResetter(gpu_source=source or StaticGpuSource(), event_log=log, metrics=metrics,
                    clock=clock or FakeClock(), sleep=lambda s: None, verify_interval_seconds=0.0, **kw)
    return r, registry


def test_success_with_persistence_handled_and_exact_argv(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"persistence": True}})
    r, registry = make(log)
    out = r.reset(0, reason="xid 48")
    assert out.outcome == "success", out.message
    assert "verified" in out.message
    assert smi.calls() == [Q_APPS, Q_PM, PM0, RESET, PM1]
    assert smi.state(0)["persistence"] is True          # restored
    assert smi.state(0)["resets"] == 1
    assert [s["step"] for s in out.steps] == ["query_processes", "query_persistence",
                                              "disable_persistence", "reset", "restore_persistence", "verify"]
    events = log.query(target="gpu:0", limit=100)
    assert [e["kind"] for e in events] == ["step"] * 6 + ["action"]
    assert events[-1]["outcome"]["outcome"] == "success"
    assert events[-1]["outcome"]["persistence_restored"] is True
    assert events[-1]["inputs"]["reason"] == "xid 48"
    assert registry.get_sample_value("inferctl_gpu_resets_total", {"gpu": "0", "outcome": "success"}) == 1.0


def test_persistence_disabled_is_left_alone(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"persistence": False}})
    r, _ = make(log)
    assert r.reset(0, reason="t").outcome == "success"
    assert smi.calls() == [Q_APPS, Q_PM, RESET]
    assert smi.state(0)["persistence"] is False


def test_in_use_exit_255_fails_and_restores_persistence(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"mode": "in_use", "persistence": True}})
    r, registry = make(log)
    out = r.reset(0, reason="t")
    assert out.outcome == "failed"
    assert "in use by another client" in out.message
    assert out.steps[3]["returncode"] == 255
    assert smi.calls() == [Q_APPS, Q_PM, PM0, RESET, PM1]
    assert smi.state(0)["persistence"] is True
    assert not out.escalated
    assert registry.get_sample_value("inferctl_gpu_resets_total", {"gpu": "0", "outcome": "failed"}) == 1.0


def test_lost_during_reset_exit_15_fails_escalates_and_is_never_retried(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"mode": "lost_on_reset", "persistence": False}})
    clock = FakeClock()
    r, _ = make(log, clock=clock)
    out = r.reset(0, reason="t")
    assert out.outcome == "failed" and out.escalated
    assert out.steps[-1]["returncode"] == 15
    assert "lost" in out.message and "reboot" in out.message
    esc = log.query(kind="escalation")
    assert len(esc) == 1 and esc[0]["severity"] == "critical" and esc[0]["target"] == "gpu:0"
    clock.advance(10_000)                       # past the rate limit: still never reset again
    n_calls = len(smi.calls())
    again = r.reset(0, reason="t")
    assert again.outcome == "refused" and "lost" in again.message
    assert len(smi.calls()) == n_calls


def test_lost_gpu_is_refused_before_running_anything(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource({0: gpu(0, lost=True), 1: gpu(1)})
    r, registry = make(log, source=src)
    out = r.reset(0, reason="xid 79")
    assert out.outcome == "refused" and out.escalated
    assert "lost" in out.message
    assert smi.calls() == []
    assert log.query(kind="refusal")[0]["severity"] == "critical"
    assert registry.get_sample_value("inferctl_gpu_resets_total", {"gpu": "0", "outcome": "refused"}) == 1.0


def test_lost_seen_by_nvidia_smi_query_is_refused_without_reset(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"mode": "lost"}})
    r, _ = make(log)
    out = r.reset(0, reason="t")
    assert out.outcome == "refused" and out.escalated
    assert smi.calls() == [Q_APPS]
    assert not any("--gpu-reset" in c for c in smi.calls())


def test_dry_run_runs_nothing_and_reports_the_plan(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    r, _ = make(log)
    out = r.reset(0, reason="t", dry_run=True)
    assert out.outcome == "dry_run"
    assert smi.calls() == []
    assert ["nvidia-smi", *RESET] in [s["argv"] for s in out.steps]
    assert all(s.get("planned") for s in out.steps)
    # a dry run does not count against the rate limit
    assert r.reset(0, reason="t").outcome == "success"


def test_dry_run_by_default_from_the_rails(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    r, _ = make(log, dry_run=True)
    assert r.reset(0, reason="t").outcome == "dry_run"
    assert r.reset(0, reason="t", dry_run=False).outcome == "success"
    assert RESET in smi.calls()


def test_second_reset_within_interval_refused_with_time_left(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    clock = FakeClock()
    r, _ = make(log, clock=clock)
    assert r.reset(0, reason="t").outcome == "success"
    clock.advance(600)
    out = r.reset(0, reason="t")
    assert out.outcome == "refused"
    assert out.retry_after_seconds == pytest.approx(1200)
    assert "retry in 1200 s" in out.message
    assert r.reset(1, reason="t").outcome == "success"      # the limit is per GPU
    # the limit survives a controller restart: a new resetter reads the event log
    r2, _ = make(log, clock=clock)
    assert r2.reset(0, reason="t").outcome == "refused"
    clock.advance(1200)
    assert r2.reset(0, reason="t").outcome == "success"
    assert sum(1 for c in smi.calls() if c[:1] == ["--gpu-reset"]) == 3


def test_failed_attempt_also_counts_for_the_rate_limit(tmp_path, monkeypatch, log):
    FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"mode": "in_use"}})
    r, _ = make(log, min_interval_seconds=60)
    assert r.reset(0, reason="t").outcome == "failed"
    assert r.reset(0, reason="t").outcome == "refused"


def test_concurrent_reset_is_refused(tmp_path, monkeypatch, log):
    FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"mode": "hang", "hang_seconds": 1.5, "persistence": False},
                                          1: {}})
    r, _ = make(log)
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("first", r.reset(0, reason="t")))
    t.start()
    deadline = time.time() + 5
    while r.state()["in_progress"] is None and time.time() < deadline:
        time.sleep(0.01)
    second = r.reset(1, reason="t")
    t.join()
    assert second.outcome == "refused"
    assert "in progress (GPU 0)" in second.message
    assert results["first"].outcome == "success"


def test_foreign_processes_refused_naming_pids(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"processes": [[11327, "/root/tools/memhog", 2566],
                                                                  [11345, "./gpu_burn", 15690]]}})
    r, _ = make(log)
    out = r.reset(0, reason="t")
    assert out.outcome == "refused"
    assert "PIDs 11327, 11345" in out.message
    assert smi.calls() == [Q_APPS]


def test_own_processes_are_allowed(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"processes": [[4242, "inferctl-engine", 100]]}})
    r, _ = make(log, allowed_pids=lambda: [4242])
    out = r.reset(0, reason="t")
    # the precondition passes; the device itself then refuses (a process is still attached)
    assert out.outcome == "failed" and "in use by another client" in out.message
    assert RESET in smi.calls()


def test_unknown_gpu_and_telemetry_down_are_refused(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    r, _ = make(log)
    out = r.reset(7, reason="t")
    assert out.outcome == "refused" and "unknown" in out.message and "[0, 1]" in out.message
    r2, _ = make(log, source=StaticGpuSource(ok=False))
    assert "telemetry is down" in r2.reset(0, reason="t").message
    assert smi.calls() == []


def test_verification_failure_means_failed(tmp_path, monkeypatch, log):
    FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"persistence": False}})
    src = StaticGpuSource({0: gpu(0, total=None)})
    r, _ = make(log, source=src, verify_attempts=2)
    out = r.reset(0, reason="t")
    assert out.outcome == "failed"
    assert "verification failed: memory not readable" in out.message
    assert [s["step"] for s in out.steps].count("verify") == 2


def test_timeout_fails_and_restores_persistence(tmp_path, monkeypatch, log):
    # the timeout must outlast the fake's own start-up for the query calls (a Python script: over
    # 0.5 s on a loaded CI machine, which refused the reset before it began); only the reset hangs
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"mode": "hang", "hang_seconds": 12}})
    r, _ = make(log, command_timeout_seconds=3.0)
    out = r.reset(0, reason="t")
    assert out.outcome == "failed" and "timed out" in out.message
    assert smi.calls()[-1] == PM1
    assert smi.state(0)["persistence"] is True


def test_exception_path_restores_persistence(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    real_run = subprocess.run

    def exploding(argv, **kw):
        if "--gpu-reset" in argv:
            raise RuntimeError("boom")
        return real_run(argv, **kw)

    monkeypatch.setattr("inferctl.controller.reset.subprocess.run", exploding)
    r, _ = make(log)
    out = r.reset(0, reason="t")
    assert out.outcome == "failed" and "internal error" in out.message
    assert smi.calls() == [Q_APPS, Q_PM, PM0, PM1]
    assert smi.state(0)["persistence"] is True
    assert r.state()["in_progress"] is None


def test_nvidia_smi_missing_is_refused(tmp_path, monkeypatch, log):
    FakeNvidiaSmi(tmp_path, monkeypatch)
    r, _ = make(log, nvidia_smi="nvidia-smi-does-not-exist")
    out = r.reset(0, reason="t")
    assert out.outcome == "refused" and "not found" in out.message


@pytest.mark.parametrize("bad", [-1, "0", 1.0, True])
def test_bad_gpu_index_raises(log, bad):
    r, _ = make(log)
    with pytest.raises(ValueError, match="gpu"):
        r.reset(bad, reason="t")


def test_simulated_gpu_is_never_reset(tmp_path, monkeypatch, log):
    smi = FakeNvidiaSmi(tmp_path, monkeypatch)
    src = StaticGpuSource()
    src.simulated = True
    r, _ = make(log, source=src)
    for dry in (True, False):
        out = r.reset(0, reason="t", dry_run=dry)
        assert out.outcome == "refused" and "simulated" in out.message
    assert smi.calls() == []


def test_gpu_lost_at_verification_escalates_and_is_remembered_after_a_restart(tmp_path, monkeypatch, log):
    """nvidia-smi says "successfully reset" but the GPU source then shows the GPU lost: the
    failure is escalated (a person must reboot the node; engines on it are not started again)
    and the lost mark survives a controller restart through the event log."""
    smi = FakeNvidiaSmi(tmp_path, monkeypatch, {0: {"persistence": False}})
    src = StaticGpuSource()

    class LostAfterFirstPoll:
        name, simulated = "static", False

        def poll(self, now):
            reading = src.poll(now)
            if src.polls > 1:            # the rails' check saw it healthy; verification sees it lost
                src.gpus[0] = gpu(0, lost=True)
                reading = src.poll(now)
            return reading

    r, _ = make(log, source=LostAfterFirstPoll())
    out = r.reset(0, reason="xid 48")
    assert out.outcome == "failed" and "lost after the reset" in out.message
    assert out.escalated
    esc = log.query(kind="escalation")
    assert len(esc) == 1 and esc[0]["target"] == "gpu:0" and esc[0]["severity"] == "critical"
    restarted, _ = make(log, source=StaticGpuSource(), clock=FakeClock(t=1_800_000_000.0))
    assert restarted.state()["lost"] == [0]
    n_calls = len(smi.calls())
    again = restarted.reset(0, reason="t")
    assert again.outcome == "refused" and "lost" in again.message
    assert len(smi.calls()) == n_calls
