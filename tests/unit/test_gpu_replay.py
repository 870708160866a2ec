"""Replay source: JSON-lines traces (F08, F09) and real nvidia-smi captures; the simulated GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferctl.controller.gpu.factory import make_gpu_source
from inferctl.controller.gpu.parsers import parse_capture
from inferctl.controller.gpu.replay import ReplayGpuSource, TraceFormatError
from inferctl.controller.gpu.sim import SIM_UUID, SimGpuSource
from inferctl.controller.gpu.xid import XidDeduper
from tests.gpu_helpers import TextServer

MIB = 1024 * 1024
TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__"


def test_f08_trace_by_time_no_false_recovery() -> None:
    src = ReplayGpuSource(TRACES / "f08_nvml_unknown.jsonl")
    start = 1_700_000_000.0
    readings = {t: src.poll(start + t) for t in (0, 5, 10, 15, 20, 25, 30)}
    for t in (0, 5, 10, 30):
        s = readings[t].gpus["GPU-f08-0"]
        assert readings[t].ok and s.memory_used_bytes == 61440 * MIB and s.memory_total_bytes == 81920 * MIB
        assert s.pci_bus_id == "0000:07:00.0" and s.time == start + t
    for t in (15, 20, 25):
        assert readings[t].ok is False and readings[t].gpus == {}      # no memory numbers, never 0
        assert readings[t].error == "NVMLError_Unknown"
    assert src.finished


def test_step_mode_plays_one_record_per_poll_then_repeats_the_last() -> None:
    src = make_gpu_source("replay", path=str(TRACES / "f08_nvml_unknown.jsonl"), mode="step")
    oks = [src.poll(0.0).ok for _ in range(9)]
    assert oks == [True, True, True, False, False, False, True, True, True]


def test_f09_trace_one_gpu_lost_others_report_and_events_dedupe() -> None:
    src = ReplayGpuSource(TRACES / "f09_fell_off_bus.jsonl")
    assert src.poll(0.0).gpus["GPU-f09-2"].lost is False
    r = src.poll(200.0)                      # skips both kernel records: both are still delivered
    assert r.ok
    lost = r.gpus["GPU-f09-2"]
    assert lost.lost and lost.health == "lost" and lost.memory_used_bytes is None
    assert [(e.xid, e.pci_bus_id) for e in lost.xid_events] == [(79, "0000:b3:00.0"), (79, "0000:b3:00.0")]
    assert XidDeduper(300).filter(lost.xid_events) == lost.xid_events[:1]     # one event, not two
    for key in ("GPU-f09-0", "GPU-f09-1", "GPU-f09-3"):
        assert not r.gpus[key].lost and r.gpus[key].memory_used_bytes == 40000 * MIB
    again = src.poll(260.0)
    assert again.gpus["GPU-f09-2"].lost and again.gpus["GPU-f09-2"].xid_events == []   # delivered once


def test_capture_list_merges_compute_apps(fixtures_dir: Path) -> None:
    gpu_dir = fixtures_dir / "gpu"
    src = ReplayGpuSource(captures=[gpu_dir / (H100 + "idle__querygpu.csv"),
                                    gpu_dir / (H100 + "load__querygpu.csv"),
                                    gpu_dir / (H100 + "load__computeapps.csv")],
                          mode="step")
    assert len(src) == 2
    idle = src.poll(0.0).gpus["GPU-00000000-0000-0000-0000-000000000000"]
    load = src.poll(1.0).gpus["GPU-00000000-0000-0000-0000-000000000000"]
    assert idle.memory_used_bytes == 0 and idle.processes == []
    assert load.memory_used_bytes == 19818 * MIB and load.memory_reserved_bytes == 479 * MIB
    assert sum(p.used_memory_bytes for p in load.processes) == (2566 + 1542 + 15690) * MIB


def test_trace_capture_record_and_single_capture_file(fixtures_dir: Path, tmp_path: Path) -> None:
    q = fixtures_dir / "gpu" / "nvsmi_q_h100x8_535.161.08.txt"
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"t": 0, "capture": str(q)}) + "\n" +
                     json.dumps({"t": 10, "kernel": "NVRM: Xid (PCI:0000:5d:00): 48, DBE"}) + "\n")
    src = ReplayGpuSource(trace)
    r0, r1 = src.poll(100.0), src.poll(111.0)
    assert len(r0.gpus) == 8 and r1.gpus["GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99"].xid_events[0].xid == 48
    assert not r1.gpus["GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99"].lost   # Xid 48 is not "fell off the bus"
    single = ReplayGpuSource(q).poll(0.0)
    assert single.ok and single.gpus["GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"].memory_reserved_bytes == 551 * MIB
    parsed = ReplayGpuSource(captures=[parse_capture(q.read_text())]).poll(0.0)
    assert len(parsed.gpus) == 8


@pytest.mark.parametrize("line,message", [
    ('{"t": 0, "gpus": [{"uuid": "a", "memory_used": 5}]}', "t.jsonl:1: gpus\\[0\\]: unknown GPU field 'memory_used'"),
    ('{"t": 0, "gpus": [{"index": 0}]}', "'uuid' is required"),
    ('{"t": "soon", "ok": false}', "field 't' must be a number"),
    ('{"t": 0, "colour": "red"}', "unknown record field"),
    ('not json', "t.jsonl:1: not JSON"),
])
def test_bad_trace_records_name_the_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(TraceFormatError, match=message):
        ReplayGpuSource(p)


def test_time_going_backwards_is_rejected(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"t": 5, "ok": false}\n{"t": 1, "ok": false}\n')
    with pytest.raises(TraceFormatError, match="t=1.0 goes back in time"):
        ReplayGpuSource(p)


def test_sim_gpu_is_the_engine_accounting() -> None:
    stats = {"memory": {"budget_bytes": 8_000_000, "reserved_bytes": 3_000_000}}
    src = SimGpuSource(lambda: stats)
    assert src.simulated is True
    s = src.poll(5.0).gpus[SIM_UUID]
    assert (s.name, s.index, s.health) == ("inferctl simulated GPU", 0, "ok")
    assert (s.memory_total_bytes, s.memory_used_bytes, s.memory_free_bytes, s.memory_reserved_bytes) == (
        8_000_000, 3_000_000, 5_000_000, 0)
    stats["memory"] = {"budget_bytes": 8_000_000}                   # engine not reporting reserved
    r = src.poll(6.0)
    assert r.ok is False and r.gpus == {}


@pytest.mark.e2e
def test_sim_gpu_over_http() -> None:
    body = json.dumps({"memory": {"budget_bytes": 1000, "reserved_bytes": 250}})
    with TextServer({"/stats": (200, "application/json", body)}) as srv:
        src = make_gpu_source("sim", engine_stats_url=srv.url + "/stats")
        s = src.poll(1.0).gpus[SIM_UUID]
        assert (s.memory_used_bytes, s.memory_free_bytes) == (250, 750)
        src.close()
    down = SimGpuSource("http://127.0.0.1:9/stats", timeout_s=0.5).poll(2.0)
    assert down.ok is False and "engine stats unavailable" in down.error


def test_sim_needs_exactly_one_input() -> None:
    with pytest.raises(ValueError, match="exactly one of engine_stats_url or stats_fn"):
        SimGpuSource()
