"""The engine's metric catalog: the request latency histograms come from one table, with vLLM's
names, one shape (per model, seconds, LATENCY_BUCKETS) and their order in the catalog kept."""

from __future__ import annotations

from inferctl.engine.metrics import ENGINE_METRICS, LATENCY_BUCKETS, REQUEST_LATENCY_HISTOGRAMS


def test_request_latency_histograms_share_one_shape():
    by_name = {m["name"]: m for m in ENGINE_METRICS}
    names = [f"inferctl_engine_{n}_seconds" for n, _ in REQUEST_LATENCY_HISTOGRAMS]
    assert names == ["inferctl_engine_time_to_first_token_seconds", "inferctl_engine_inter_token_latency_seconds",
                     "inferctl_engine_e2e_request_latency_seconds", "inferctl_engine_request_queue_time_seconds",
                     "inferctl_engine_request_prefill_time_seconds", "inferctl_engine_request_decode_time_seconds"]
    for name, (_, text) in zip(names, REQUEST_LATENCY_HISTOGRAMS):
        m = by_name[name]
        assert (m["type"], m["unit"], tuple(m["labels"]), tuple(m["buckets"])) == \
            ("histogram", "seconds", ("model",), LATENCY_BUCKETS)
        assert m["help"] == text and "finished successfully" in text
    # the six sit together, right after the token counters, as before
    order = [m["name"] for m in ENGINE_METRICS]
    start = order.index("inferctl_engine_generation_tokens_total") + 1
    assert order[start:start + 6] == names
    assert len(order) == len(set(order))
