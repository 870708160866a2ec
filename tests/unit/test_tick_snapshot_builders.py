"""The poll path's snapshot builders give exactly what the dataclass gives: ``engine_snapshot``
against ``EngineSnapshot(...)`` (every attribute, its type and order, fresh containers), and the
vLLM mapping's one-dict assembly against the field-by-field one it replaced."""

from __future__ import annotations

import dataclasses
import pytest

from inferctl.controller.engines import promtext
from inferctl.controller.engines.promtext import CORE_FIELDS, _Index, snapshot_from_metrics_text
from inferctl.controller.scrape.promtext import parse_prometheus_text
from inferctl.controller.types import EngineSnapshot, engine_snapshot

def _same(a: EngineSnapshot, b: EngineSnapshot) -> None:
    assert type(a) is type(b)
    assert list(vars(a)) == list(vars(b))
    assert [(k, type(v)) for k, v in vars(a).items()] == [(k, type(v)) for k, v in vars(b).items()]
    assert repr(dataclasses.asdict(a)) == repr(dataclasses.asdict(b))


@pytest.mark.parametrize("kw", [dict(name="e", kind="bundled", ok=True, time=5.0, raw={"engine": {}}),
                                dict(name="v", kind="vllm", ok=True, time=0.0),
                                dict(name="x", kind="tgi", ok=False, time=1.5, error="GET /metrics: HTTP 500")])
def test_engine_snapshot_is_the_dataclass_attribute_for_attribute(kw):
    fast = engine_snapshot(kw["name"], kw["kind"], kw["ok"], kw["time"], error=kw.get("error"), raw=kw.get("raw"))
    _same(fast, EngineSnapshot(**kw))
    assert fast == EngineSnapshot(**kw)
    other = engine_snapshot("e", "bundled", True, 1.0)
    for f in ("faults", "recent_requests", "per_engine", "missing", "invalid", "ttft_histogram_by_model"):
        assert getattr(fast, f) is not getattr(other, f)          # never shared between snapshots


def _field_by_field(text: str, flavor: str) -> EngineSnapshot:
    """snapshot_from_metrics_text as it was written before the one-dict assembly."""
    samples, bad = parse_prometheus_text(text, keep=promtext._KEEP[flavor])
    b = promtext._MAPPERS[flavor](_Index(samples))
    snap = EngineSnapshot(name="e", kind=flavor, ok=True, time=2.0)
    for k, v in b.fields.items():
        setattr(snap, k, v)
    for k in ("running", "waiting"):
        v = getattr(snap, k)
        if v is not None:
            setattr(snap, k, int(round(v)))
    snap.per_engine = {e: dict(v) for e, v in sorted(b.per_engine.items())} if flavor == "vllm" else {}
    snap.invalid = b.invalid + [f"unparsed: {line}" for line in bad]
    snap.missing = [f for f in CORE_FIELDS if getattr(snap, f) is None]
    return snap


def _texts(fixtures_dir) -> list[str]:
    text = (fixtures_dir / "vllm" / "metrics_samples.txt").read_text(encoding="utf-8")
    blocks = ["# SOURCE" + b for b in text.split("# SOURCE")[1:]]
    out = blocks + [text, "", "garbage\n", 'vllm:num_requests_running{engine="1"} 2.6\nvllm:num_requests_running 3\n',
                    'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:kv_cache_usage_perc{engine="1"} -0.4\n',
                    "tgi_batch_current_size 4\ntgi_queue_size 1\n", "llamacpp:requests_processing 2\n"]
    for b in blocks:            # each line cut in half in turn (bad lines, invalid samples)
        lines = b.splitlines()
        out += ["\n".join(lines[:i] + [lines[i][: len(lines[i]) // 2]] + lines[i + 1:]) for i in range(len(lines))]
    return out


def test_the_vllm_tgi_llamacpp_snapshots_equal_the_field_by_field_assembly(fixtures_dir):
    for text in _texts(fixtures_dir):
        for flavor in ("vllm", "tgi", "llamacpp"):
            _same(snapshot_from_metrics_text(text, name="e", flavor=flavor, now=2.0), _field_by_field(text, flavor))
