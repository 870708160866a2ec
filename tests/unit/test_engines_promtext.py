"""Prometheus-text engines: vLLM (old and new names, data parallel), TGI, llama.cpp (F01, F02)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from inferctl.controller.engines import EngineAdminError, make_engine_client
from inferctl.controller.engines.promtext import PromTextEngineClient, parse_prometheus_text, snapshot_from_metrics_text
from tests.gpu_helpers import TextServer

F01 = ('# TYPE vllm:kv_cache_usage_perc gauge\n'
       'vllm:kv_cache_usage_perc{engine="0",model_name="M"} 0.41\n'
       'vllm:kv_cache_usage_perc{engine="3",model_name="M"} -0.3875395987328405\n')


def vllm(text: str):
    return snapshot_from_metrics_text(text, name="e", flavor="vllm", now=1.0)


@pytest.fixture(scope="module")
def fragments(fixtures_dir: Path) -> dict[str, str]:
    text = (fixtures_dir / "vllm" / "metrics_samples.txt").read_text(encoding="utf-8")
    parts = re.split(r"(?m)^# SOURCE ([A-D]) ", text)
    return {parts[i]: f"# SOURCE {parts[i]} " + parts[i + 1] for i in range(1, len(parts), 2)}


def test_f01_negative_kv_sample_is_invalid_and_fleet_uses_valid_only() -> None:
    s = vllm(F01)
    assert s.ok and s.kv_usage_ratio == 0.41
    assert s.per_engine["0"]["kv_usage_ratio"] == 0.41
    assert s.per_engine["3"]["kv_usage_ratio"] is None
    assert s.invalid == ['vllm:kv_cache_usage_perc{engine="3",model_name="M"} -0.3875395987328405']


@pytest.mark.parametrize("name", ["vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"])
def test_f02_old_and_new_kv_names_map_to_one_signal(name: str) -> None:
    s = vllm(f'{name}{{model_name="M"}} 0.93\nvllm:num_requests_waiting{{model_name="M"}} 2\n')
    assert s.kv_usage_ratio == 0.93
    assert s.running is None and "running" in s.missing          # missing, never 0 running
    assert s.waiting == 2 and "waiting" not in s.missing


def test_new_name_wins_when_both_are_present() -> None:
    s = vllm('vllm:gpu_cache_usage_perc{model_name="M"} 0.5\nvllm:kv_cache_usage_perc{model_name="M"} 0.25\n')
    assert s.kv_usage_ratio == 0.25


def test_fragment_a_v1_with_engine_label(fragments: dict[str, str]) -> None:
    s = vllm(fragments["A"])
    assert s.kv_usage_ratio == pytest.approx(9.75010481363281e-06)
    assert s.prefix_cache_queries_total == 32.0
    assert s.prefix_cache_hits_total == 0.0                 # only the deprecated gpu_ name is present
    assert s.model == "zai-org/GLM-4.5" and list(s.per_engine) == ["0"]
    assert s.running is None and s.waiting is None and s.invalid == []


def test_fragment_b_early_v1_old_kv_name(fragments: dict[str, str]) -> None:
    s = vllm(fragments["B"])
    assert (s.running, s.waiting, s.kv_usage_ratio) == (0, 0, 0.0)
    assert s.model == "Qwen/Qwen2.5-Coder-32B-Instruct"
    assert "ttft_histogram" in s.missing and "running" not in s.missing


def test_fragment_c_nim_with_cache_config_info(fragments: dict[str, str]) -> None:
    s = vllm(fragments["C"])
    assert s.kv_usage_ratio == 0.0 and s.model == "qwen3-vl-235b-awq"
    assert s.running is None and s.invalid == []


def test_fragment_d_design_doc_histogram_and_finish_reasons(fragments: dict[str, str]) -> None:
    s = vllm(fragments["D"])
    assert s.running == 8 and s.generation_tokens_total == 27453.0
    assert s.finished_total == 132.0
    assert s.by_finish_reason == {"stop": 1.0, "length": 131.0, "abort": 0.0}
    h = s.ttft_histogram
    assert h["buckets"] == [(0.001, 0.0), (0.005, 0.0), (0.01, 0.0), (0.02, 13.0), (0.04, 97.0),
                            (0.06, 123.0), (0.08, 138.0), (0.1, 140.0)]
    assert h["count"] == 140.0 and h["sum"] is None            # the excerpt has no _sum: no data
    assert s.invalid == ["unparsed: ..."] * 3                  # the doc's elisions, reported not fatal


def test_data_parallel_engines_are_summed_and_kv_averaged() -> None:
    text = "".join(
        f'vllm:num_requests_running{{engine="{e}",model_name="M"}} {r}\n'
        f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="M"}} {kv}\n'
        f'vllm:num_preemptions_total{{engine="{e}",model_name="M"}} {p}\n'
        f'vllm:e2e_request_latency_seconds_bucket{{engine="{e}",le="1.0",model_name="M"}} {b1}\n'
        f'vllm:e2e_request_latency_seconds_bucket{{engine="{e}",le="+Inf",model_name="M"}} {b2}\n'
        f'vllm:e2e_request_latency_seconds_count{{engine="{e}",model_name="M"}} {b2}\n'
        f'vllm:e2e_request_latency_seconds_sum{{engine="{e}",model_name="M"}} {sm}\n'
        for e, r, kv, p, b1, b2, sm in (("0", 3, 0.2, 1, 4, 5, 2.5), ("1", 5, 0.6, 2, 6, 9, 7.0)))
    s = vllm(text)
    assert s.running == 8 and s.preemptions_total == 3.0
    assert s.kv_usage_ratio == pytest.approx(0.4)
    assert s.per_engine["1"]["running"] == 5.0
    assert s.e2e_histogram["buckets"] == [(1.0, 10.0), (float("inf"), 14.0)]
    assert (s.e2e_histogram["count"], s.e2e_histogram["sum"]) == (14.0, 9.5)


def test_decreasing_histogram_is_invalid() -> None:
    s = vllm('vllm:time_to_first_token_seconds_bucket{le="0.1"} 5\n'
             'vllm:time_to_first_token_seconds_bucket{le="0.5"} 3\n')
    assert s.ttft_histogram is None and "ttft_histogram" in s.missing
    assert any("decrease" in x for x in s.invalid)


def test_tgi_names() -> None:
    text = ("# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 4\n"
            "# TYPE tgi_queue_size gauge\ntgi_queue_size 2\n"
            "# TYPE tgi_request_success counter\ntgi_request_success 10\n"
            "# TYPE tgi_request_duration histogram\n"
            'tgi_request_duration_bucket{le="0.5"} 7\ntgi_request_duration_bucket{le="+Inf"} 10\n'
            "tgi_request_duration_sum 4.2\ntgi_request_duration_count 10\n"
            "# TYPE tgi_request_generated_tokens histogram\n"
            'tgi_request_generated_tokens_bucket{le="+Inf"} 10\ntgi_request_generated_tokens_sum 640\n'
            "tgi_request_generated_tokens_count 10\n")
    s = snapshot_from_metrics_text(text, name="t", flavor="tgi")
    assert (s.running, s.waiting, s.finished_total) == (4, 2, 10.0)
    assert s.e2e_histogram["sum"] == 4.2 and s.generation_tokens_total == 640.0
    assert s.kind == "tgi" and sorted(s.missing) == ["kv_usage_ratio", "preemptions_total", "ttft_histogram"]


def test_llamacpp_names_old_and_current_builds() -> None:
    old = ("llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\nllamacpp:kv_cache_usage_ratio 0.63\n"
           "llamacpp:prompt_tokens_total 1000\nllamacpp:tokens_predicted_total 5000\n")
    s = snapshot_from_metrics_text(old, name="l", flavor="llamacpp")
    assert (s.running, s.waiting, s.kv_usage_ratio) == (2, 1, 0.63)
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (1000.0, 5000.0)
    new = snapshot_from_metrics_text("llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n",
                                     name="l", flavor="llamacpp")
    assert new.running == 0 and new.kv_usage_ratio is None and "kv_usage_ratio" in new.missing
    over = snapshot_from_metrics_text("llamacpp:kv_cache_usage_ratio 1.7\n", name="l", flavor="llamacpp")
    assert over.kv_usage_ratio is None and over.invalid == ["llamacpp:kv_cache_usage_ratio{} 1.7"]


def test_parser_recovers_from_garbage_lines() -> None:
    samples, bad = parse_prometheus_text("a 1\n!!garbage\nb{x=\"y\"} 2\n")
    assert [(s.name, s.value) for s in samples] == [("a", 1.0), ("b", 2.0)] and bad == ["!!garbage"]


def test_unknown_flavor_and_admin_not_available() -> None:
    with pytest.raises(ValueError, match="flavor 'sglang'"):
        PromTextEngineClient("x", "http://127.0.0.1:1", flavor="sglang")
    c = make_engine_client("vllm", "v", "http://127.0.0.1:1")
    with pytest.raises(EngineAdminError) as err:
        c.set_precision("int8")
    assert err.value.status == 501


def test_client_with_mock_transport_counts_invalid_and_keeps_polling() -> None:
    answers = iter([httpx.Response(200, text=F01), httpx.Response(500, text="boom"),
                    httpx.Response(200, text=F01)])
    c = PromTextEngineClient("v", "http://vllm:8000", transport=httpx.MockTransport(lambda req: next(answers)))
    a, b, d = c.poll(1.0), c.poll(2.0), c.poll(3.0)
    assert a.ok and a.kv_usage_ratio == 0.41
    assert b.ok is False and b.error == "GET /metrics: HTTP 500" and b.kv_usage_ratio is None
    assert d.ok and c.invalid_samples_total == 2


@pytest.mark.e2e
def test_client_over_real_http(fragments: dict[str, str]) -> None:
    with TextServer({"/metrics": (200, "text/plain; version=0.0.4", F01 + fragments["D"])}) as srv:
        c = make_engine_client("vllm", "main", srv.url, timeout_s=1.0)
        s = c.poll(10.0)
        c.close()
    assert s.ok and s.kv_usage_ratio == 0.41 and s.running == 8 and s.ttft_histogram["count"] == 140.0
    assert c.invalid_samples_total == 4                       # the negative sample + 3 elisions
    refused = make_engine_client("tgi", "t", "http://127.0.0.1:9", timeout_s=0.5).poll(11.0)
    assert refused.ok is False and "ConnectError" in refused.error and refused.running is None
