"""``/stats`` carries the latency histograms (``requests.latency_histograms``): the engine's
numbers equal its ``/metrics`` histograms, and the controller reads them with ONE GET per poll,
falling back to ``/metrics`` for an older engine whose ``/stats`` lacks them."""

from __future__ import annotations

import copy
import json
import math

import httpx
import pytest
from prometheus_client import generate_latest

from inferctl.controller.engines import BundledEngineClient
from inferctl.controller.engines.bundled import histograms_in_stats, stats_histograms
from inferctl.engine.metrics import LATENCY_BUCKETS
from inferctl.engine.quality import score_output
from inferctl.engine.stat_loggers import PrometheusStatLogger
from inferctl.engine.stats import EngineStats, FinishedRequestStats, IterationStats
from tests.gpu_helpers import TextServer

# values on bucket bounds (le is inclusive), between them, below the first and above the last
TTFTS = [0.0005, 0.001, 0.0011, 0.05, 0.3, 0.3000001, 2.0, 700.0]
ITLS = [0.002, 0.0025, 0.02, 0.02, 1.5, 601.0]


def _finished(reason: str, e2e: float) -> FinishedRequestStats:
    return FinishedRequestStats("r-" + reason, reason, 4, 2, 0.5, e2e, score_output([5, 6], [-1.0, -1.0], 4, reason),
                                "full", 0, None)


def _iteration() -> IterationStats:
    return IterationStats(ttfts=list(TTFTS), itls=list(ITLS),
                          finished=[_finished("stop", 1.0), _finished("length", 0.075), _finished("abort", 99.0),
                                    _finished("error", 50.0), _finished("repetition", 900.0)])


def _engine(model: str = "m") -> tuple[dict, str]:
    """(the /stats document, the /metrics text) of one engine's two stat loggers fed the same step."""
    stats, prom = EngineStats(), PrometheusStatLogger(model, 1000)
    it = _iteration()
    stats.record(None, it)
    prom.record(None, it)
    doc = {"engine": {"model": model, "models": [model]},
           "requests": {"finished_total": 5, "latency_histograms": stats.latency_histograms()}}
    return doc, generate_latest(prom.registry).decode()


def test_engine_histograms_equal_the_metrics_histograms():
    stats, prom = EngineStats(), PrometheusStatLogger("m", 1000)
    it = _iteration()
    stats.record(None, it)
    prom.record(None, it)
    sec = stats.latency_histograms()
    assert sec["le"] == list(LATENCY_BUCKETS)
    for key, metric in (("ttft_seconds", "time_to_first_token"), ("itl_seconds", "inter_token_latency"),
                        ("e2e_seconds", "e2e_request_latency")):
        base = f"inferctl_engine_{metric}_seconds"
        expect = [prom.registry.get_sample_value(base + "_bucket", {"model": "m", "le": str(le)})
                  for le in LATENCY_BUCKETS]
        assert sec[key]["buckets"] == expect, key
        assert sec[key]["count"] == prom.registry.get_sample_value(base + "_count", {"model": "m"})
        assert sec[key]["sum"] == pytest.approx(prom.registry.get_sample_value(base + "_sum", {"model": "m"}))
    # le is inclusive: 0.001 is in the 0.001 bucket, 0.0011 is not; aborts and errors are not samples
    assert sec["ttft_seconds"]["buckets"][0] == 2 and sec["ttft_seconds"]["buckets"][1] == 3
    assert sec["ttft_seconds"]["buckets"][-1] == 7 and sec["ttft_seconds"]["count"] == 8
    assert sec["e2e_seconds"]["count"] == 3 and sec["e2e_seconds"]["sum"] == pytest.approx(901.075)
    json.dumps(sec, allow_nan=False)     # strictly valid JSON


def _serve(doc: dict, metrics: str, seen: list[str]):
    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req.url.path)
        if req.url.path == "/stats":
            return httpx.Response(200, json=doc)
        return httpx.Response(200, text=metrics)
    return httpx.MockTransport(handler)


def _without_section(doc: dict) -> dict:
    old = copy.deepcopy(doc)
    del old["requests"]["latency_histograms"]
    return old


def test_one_get_per_poll_and_the_same_snapshot_as_from_metrics():
    doc, metrics = _engine()
    seen: list[str] = []
    new = BundledEngineClient("e", "http://e:1", transport=_serve(doc, metrics, seen)).poll(1.0)
    assert seen == ["/stats"]                                   # no /metrics
    seen.clear()
    old = BundledEngineClient("e", "http://e:1", transport=_serve(_without_section(doc), metrics, seen)).poll(1.0)
    assert seen == ["/stats", "/metrics"]                       # an older engine: the fallback
    for field in ("ttft_histogram", "itl_histogram", "e2e_histogram"):
        assert new.__dict__[field] is not None and new.__dict__[field] == old.__dict__[field], field
    assert new.ttft_histogram["buckets"][-1] == (math.inf, 8.0)
    assert new.ttft_histogram["metric"] == "inferctl_engine_time_to_first_token_seconds"
    assert new.ttft_histogram_by_model == old.ttft_histogram_by_model == {"m": new.ttft_histogram}
    assert new.invalid == [] and "ttft_histogram" not in new.missing


def test_two_models_need_the_by_model_section_else_metrics_is_read():
    doc, metrics = _engine("main")
    light_doc, light_metrics = _engine("light")
    light_doc["requests"]["latency_histograms"]["ttft_seconds"]["count"] = 11   # tell the two apart
    light_doc["requests"]["latency_histograms"]["ttft_seconds"]["buckets"][-1] = 11
    doc["engine"]["models"] = ["light", "main"]
    assert not histograms_in_stats(doc)
    doc["latency_histograms_by_model"] = {"main": doc["requests"]["latency_histograms"],
                                          "light": light_doc["requests"]["latency_histograms"]}
    assert histograms_in_stats(doc)
    seen: list[str] = []
    snap = BundledEngineClient("e", "http://e:1", transport=_serve(doc, metrics + light_metrics, seen)).poll(1.0)
    assert seen == ["/stats"]
    assert sorted(snap.ttft_histogram_by_model) == ["light", "main"]
    assert snap.ttft_histogram_by_model["light"]["count"] == 11.0
    assert snap.ttft_histogram_by_model["main"]["count"] == 8.0 == snap.ttft_histogram["count"]


@pytest.mark.parametrize("mutate, where", [
    (lambda s: s.__setitem__("le", [0.1, 0.1]), "le"),
    (lambda s: s.__setitem__("le", "0.1"), "le"),
    (lambda s: s["ttft_seconds"].__setitem__("buckets", [1] * 3), "ttft_seconds"),
    (lambda s: s["ttft_seconds"]["buckets"].__setitem__(0, 99), "ttft_seconds"),        # decreasing
    (lambda s: s["ttft_seconds"].__setitem__("count", 1), "ttft_seconds"),              # below the last bucket
    (lambda s: s["ttft_seconds"].__setitem__("sum", -1.0), "ttft_seconds"),
    (lambda s: s["ttft_seconds"]["buckets"].__setitem__(3, True), "ttft_seconds"),
    (lambda s: s.__setitem__("ttft_seconds", "x"), "ttft_seconds"),
])
def test_a_malformed_section_is_no_data_and_named(mutate, where):
    doc, _ = _engine()
    mutate(doc["requests"]["latency_histograms"])
    invalid: list[str] = []
    out = stats_histograms(doc["requests"]["latency_histograms"], "requests.latency_histograms", invalid)
    assert "ttft_histogram" not in out
    assert len(invalid) == 1 and f"requests.latency_histograms.{where}" in invalid[0]
    if where != "le":                  # the other histograms of the section are still read
        assert out["e2e_histogram"]["count"] == 3.0
    seen: list[str] = []
    snap = BundledEngineClient("e", "http://e:1", transport=_serve(doc, "", seen)).poll(1.0)
    assert snap.ok and snap.ttft_histogram is None and "ttft_histogram" in snap.missing
    assert any(where in x for x in snap.invalid)


def test_an_absent_section_is_none_not_empty():
    assert stats_histograms(None, "x", []) is None


@pytest.mark.e2e
def test_poll_async_makes_one_get_for_a_new_engine_and_two_for_an_old_one():
    from inferctl.controller.scrape.aio import AsyncPoller

    doc, metrics = _engine()
    routes = {"/stats": (200, "application/json", json.dumps(doc)),
              "/old/stats": (200, "application/json", json.dumps(_without_section(doc))),
              "/old/metrics": (200, "text/plain", metrics)}
    poller = AsyncPoller()
    try:
        with TextServer(routes) as srv:
            new = BundledEngineClient("new", srv.url, timeout_s=2.0)
            old = BundledEngineClient("old", srv.url + "/old", timeout_s=2.0)
            s_new = poller.submit(new.poll_async(poller, 1.0)).result(10)
            s_old = poller.submit(old.poll_async(poller, 1.0)).result(10)
            paths = [r["path"] for r in srv.requests]
    finally:
        poller.close()
    assert paths == ["/stats", "/old/stats", "/old/metrics"]
    assert s_new.ok and s_new.ttft_histogram is not None and s_new.ttft_histogram == s_old.ttft_histogram
    assert s_new.e2e_histogram == s_old.e2e_histogram
