"""``routable`` in the controller's /status: a failed poll is "no data" (None), not a block.

Under load a poll of a busy engine can time out while the engine serves; reading that as
``routable: false`` made the router take serving replicas out of rotation (217 requests answered
503 in a loaded fleet test). A drain the engine reports, a rolling action's hold and the GPU's
routing verdict still block.
"""

from __future__ import annotations

from types import SimpleNamespace

from inferctl.controller.status import StatusBuilder
from inferctl.controller.types import EngineSnapshot


def _builder(gpu_verdict: dict | None = None) -> StatusBuilder:
    pol = SimpleNamespace(engine_routing=lambda: {"e0": gpu_verdict} if gpu_verdict else {})
    return StatusBuilder(state=None, sources=None, engines={}, policies={}, gpu_policies={"hw": pol},
                         supervisors={}, event_log=None, resetter=None, counter=None, clock=lambda: 0.0,
                         started_at=0.0)


def _routable(snap, lifecycle="running", gpu_verdict=None):
    sup = SimpleNamespace(lifecycle=lifecycle)
    return _builder(gpu_verdict)._lifecycle("e0", snap, sup)["routable"]


def test_a_failed_poll_is_no_data_not_a_block():
    assert _routable(EngineSnapshot(name="e0", kind="bundled", ok=False, error="timeout")) is None
    assert _routable(None) is None


def test_what_still_blocks():
    assert _routable(EngineSnapshot(name="e0", kind="bundled", ok=True, draining=False)) is True
    assert _routable(EngineSnapshot(name="e0", kind="bundled", ok=True, draining=True)) is False
    assert _routable(EngineSnapshot(name="e0", kind="bundled", ok=False), lifecycle="restarting") is False
    verdict = {"routable": False, "reason": "gpu draining", "gpu": "GPU-0"}
    assert _routable(EngineSnapshot(name="e0", kind="bundled", ok=True), gpu_verdict=verdict) is False
