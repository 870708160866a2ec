"""up: a GPU source's own deadline is 0.8 × the loop's per-call timeout, so a hung NVML call
is reported by NVML (naming the hang) before the loop's generic per-call timeout fires."""

from __future__ import annotations

import threading
import time

import pytest

from inferctl.controller.config import parse_config
from inferctl.controller.sources import SourceJob
from inferctl.controller.runtime import SOURCE_TIMEOUT_SHARE, _gpu_source, gpu_source_options
from tests.gpu_helpers import FakeGpu, FakeNvml

INTERVALS = {"engine_poll_seconds": 1.0, "gpu_poll_seconds": 1.0, "reconcile_seconds": 1.0,
             "call_timeout_seconds": 0.5, "max_backoff_seconds": 5}


def test_source_timeout_defaults_to_a_share_of_the_call_timeout_and_an_explicit_one_wins():
    cfg = parse_config({"gpu": {"kind": "replay", "options": {"path": "x.json"}}, "intervals": INTERVALS})
    assert SOURCE_TIMEOUT_SHARE == 0.8
    assert gpu_source_options(cfg)["timeout_s"] == pytest.approx(0.4)
    cfg = parse_config({"gpu": {"kind": "replay", "options": {"path": "x.json", "timeout_s": 0.1}},
                        "intervals": INTERVALS})
    assert gpu_source_options(cfg)["timeout_s"] == 0.1


def test_hung_nvml_call_is_reported_by_nvml_not_by_the_loop_timeout():
    fake = FakeNvml([FakeGpu(uuid="GPU-0")])
    cfg = parse_config({"gpu": {"kind": "nvml", "options": {"nvml": fake}}, "intervals": INTERVALS})
    src = _gpu_source(cfg)
    assert src.timeout_s == pytest.approx(0.4)
    job = SourceJob("gpu", src.poll, lambda now, err: ("loop", err), interval=1.0, timeout=0.5,
                    max_backoff=5, metrics={})
    good = job.run(time.time(), force=True)
    assert good.ok and "GPU-0" in good.gpus
    fake.hang = threading.Event()
    try:
        reading = job.run(time.time(), force=True)
    finally:
        fake.hang.set()
    # NVML's own deadline (0.4 s) fired first: a GpuReading naming NVML, not the loop's tuple
    assert not isinstance(reading, tuple), reading
    assert reading.ok is False and "NVML poll did not return within 0.4 s" in reading.error
    assert job.last_error == reading.error
