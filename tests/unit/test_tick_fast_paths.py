"""The reconcile tick's fast paths give the values of the slow ones: the quality summaries
memoised per recent-requests window (controller/signals/memo.py, used by the exporter) are
recomputed whenever the window changes and count invalid samples as a recomputation would; the
plain-float/plain-int path of ``check_number`` accepts and rejects what the general path does.
Speed itself is a benchmark: ``python -m bench.controller_tick``."""

from __future__ import annotations

import math
import sys

import pytest

from inferctl.controller.exporter import Exporter
from inferctl.controller.metrics import build_registry
from inferctl.controller.signals import InvalidSampleCounter, perplexity_summary, repetition_summary
from inferctl.controller.signals.memo import QualityMemo
from inferctl.controller.signals.validation import check_number
from tests.controller_helpers import engine_snapshot


def rec(i: int, rep: float, ppl: float | None = 2.0, prompt: int = 100, degenerate: bool | None = None) -> dict:
    r = {"request_id": f"r{i}", "prompt_tokens": prompt, "finish_reason": "length", "seq_rep": {"4": rep},
         "precision": "full", "perplexity": ppl}
    if degenerate is not None:
        r["degenerate"] = degenerate
    return r


def test_memoised_summaries_are_recomputed_when_the_window_changes():
    memo, c = QualityMemo(), InvalidSampleCounter()
    w1 = [rec(0, 0.1), rec(1, 0.3)]
    a = memo.summaries("e", w1, c)
    assert a.repetition.mean_seq_rep.value == pytest.approx(0.2)
    assert memo.summaries("e", [dict(r) for r in w1], c) is a            # equal window: reused
    w2 = w1[1:] + [rec(2, 0.9, ppl=4.0, prompt=9000)]                   # one finished, one left
    b = memo.summaries("e", w2, c)
    assert b.repetition.mean_seq_rep.value == pytest.approx(0.6)
    assert b.perplexity.value == pytest.approx(3.0)
    assert b.repetition.by_bucket == repetition_summary(w2).by_bucket
    # same ids, one field changed: recomputed (the key is the content, not the ids)
    w3 = [dict(r) for r in w2]
    w3[0]["seq_rep"] = {"4": 0.5}
    assert memo.summaries("e", w3, c).repetition.mean_seq_rep.value == pytest.approx(0.7)
    # an in-place edit of a record the memo saw is still seen as a change
    w3[0]["perplexity"] = 10.0
    assert memo.summaries("e", w3, c).perplexity.value == pytest.approx(7.0)
    # engines are kept apart
    assert memo.summaries("other", w1, c).repetition.mean_seq_rep.value == pytest.approx(0.2)
    assert memo.summaries("e", [], c).repetition.mean_seq_rep.value is None


def test_a_reused_window_counts_its_invalid_samples_again():
    """Each poll of a window with a bad record counts it, as the summaries recomputed would."""
    window = [rec(0, 0.1), rec(1, -0.5, ppl=0.5), rec(2, float("nan"), ppl=float("inf"))]
    direct, memoised, memo = InvalidSampleCounter(), InvalidSampleCounter(), QualityMemo()
    for _ in range(3):
        repetition_summary(window, counter=direct)
        perplexity_summary(window, counter=direct)
        memo.summaries("e", window, memoised)
    assert direct.snapshot() == memoised.snapshot()
    assert memoised.count("perplexity") == 6 and memoised.count() > 6


def test_exporter_gauges_follow_a_changing_window():
    registry, metrics = build_registry()
    ex = Exporter(metrics, InvalidSampleCounter())
    s1 = engine_snapshot("a", recent_requests=[rec(0, 0.2, degenerate=False), rec(1, 0.4, degenerate=False)])
    ex.export_engine("a", s1, None)
    ex.export_engine("a", engine_snapshot("a", recent_requests=list(s1.recent_requests)), s1)
    assert registry.get_sample_value("inferctl_repetition_ratio", {"engine": "a"}) == pytest.approx(0.3)
    s2 = engine_snapshot("a", recent_requests=[rec(1, 0.4, degenerate=False), rec(2, 0.8, ppl=6.0, degenerate=True)])
    ex.export_engine("a", s2, s1)
    assert registry.get_sample_value("inferctl_repetition_ratio", {"engine": "a"}) == pytest.approx(0.6)
    assert registry.get_sample_value("inferctl_perplexity", {"engine": "a"}) == pytest.approx(4.0)
    assert registry.get_sample_value("inferctl_degenerate_ratio",
                                     {"engine": "a", "prompt_len_bucket": "<512"}) == pytest.approx(0.5)


SLOW_PATH_CASES = [0.0, -0.0, 0.5, 1.0, 1.0000001, 7.0, -1e-300, -3.0, float("nan"), float("inf"), float("-inf"),
                   sys.float_info.max, 5e-324, 0, 1, 2, -1, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, 10 ** 400, True,
                   False, None, "0.5", [0.5]]


@pytest.mark.parametrize("upper", [None, 1.0])
@pytest.mark.parametrize("x", SLOW_PATH_CASES, ids=repr)
def test_check_number_fast_path_answers_as_the_general_rules(x, upper):
    c = InvalidSampleCounter()
    s = check_number(x, "v", c, upper)
    finite_number = (not isinstance(x, bool) and isinstance(x, (int, float)) and abs(x) < 10 ** 309
                     and not math.isnan(x) and not math.isinf(x))
    ok = finite_number and x >= 0 and (upper is None or x <= upper)
    assert (s.value is not None) == ok
    if ok:
        assert type(s.value) is float and s.value == float(x) and s.inputs == {"raw": float(x)}
        assert math.copysign(1, s.value) == math.copysign(1, float(x)) and c.count() == 0
    else:
        assert s.invalid == (x is not None) and c.count() == (0 if x is None else 1)


def test_an_engine_client_builds_its_sync_http_client_on_first_use_only():
    """Polls go through the shared aiohttp pool; the httpx client (an SSL context each) is
    built for the first synchronous call, once, and a closed client stays closed."""
    import httpx

    from inferctl.controller.engines import make_engine_client

    seen = []
    transport = httpx.MockTransport(lambda req: seen.append(req.headers.get("x-k")) or httpx.Response(
        200, json={"ok": True}))
    c = make_engine_client("bundled", "e", "http://127.0.0.1:9", timeout_s=1.0)
    assert c._sync is None                                   # nothing built by the constructor
    c.close()
    with pytest.raises(RuntimeError):                        # closed before any use: still refuses
        c._client.get("/x")
    c2 = make_engine_client("bundled", "e", "http://127.0.0.1:9", timeout_s=1.0)
    c2._transport, c2._headers = transport, {"x-k": "v"}
    first = c2._client
    assert c2._client is first and first.get("/stats").json() == {"ok": True} and seen == ["v"]
    c2.close()
    assert first.is_closed


def test_engine_gauge_sets_and_removes_the_series_gauge_does():
    """``engine_gauge`` (the engine-only key without the label pass) shares ``gauge``'s series:
    a value set one way is unchanged the other way, None removes it whichever set it, and a
    metric with more labels than ``engine`` (or one absent from the catalog) falls back to
    ``gauge`` and so raises for the missing label / does nothing."""
    registry, metrics = build_registry()
    ex = Exporter(metrics, InvalidSampleCounter())
    ex.engine_gauge("inferctl_kv_cache_usage_ratio", "a", 0.25)
    assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "a"}) == 0.25
    ex.gauge("inferctl_kv_cache_usage_ratio", 0.5, engine="a")
    assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "a"}) == 0.5
    ex.engine_gauge("inferctl_kv_cache_usage_ratio", "a", None)
    assert registry.get_sample_value("inferctl_kv_cache_usage_ratio", {"engine": "a"}) is None
    ex.gauge("inferctl_perplexity", 3.0, engine="b")
    ex.engine_gauge("inferctl_perplexity", "b", None)
    assert registry.get_sample_value("inferctl_perplexity", {"engine": "b"}) is None
    ex.engine_gauge("inferctl_no_such_metric", "a", 1.0)      # absent: no-op, as gauge()
    with pytest.raises(KeyError):
        ex.engine_gauge("inferctl_precision_mode", "a", 1.0)  # needs a mode label too
