"""The engine's /metrics values are computed at scrape time (issue 12: the step only adds to plain
ints and publishes one tuple); on a scripted run of the real stories260K engine every scrape must
show what the per-step updates used to show: gauges = the live state read after the step
(``LLMEngine._scheduler_stats``, what ``set_gauges`` was handed every step), per-step counters =
the /stats accumulation of the same IterationStats, generation tokens = the tokens handed out."""

from __future__ import annotations

import math
import threading

import pytest

from inferctl.contract.precision import PRECISION_MODES
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.stat_loggers import PrometheusStatLogger
from inferctl.engine.stats import IterationStats, SchedulerStats

MODEL = "stories260K"


def _get(engine: LLMEngine, name: str, labels: dict | None = None) -> float | None:
    return engine.registry.get_sample_value(name, labels or {})


def _expected(engine: LLMEngine, generated: int) -> dict[tuple[str, tuple], float | None]:
    """The values the per-step updates left in the registry after the last step."""
    s = engine._scheduler_stats()
    st = engine.stats_
    m = {"model": engine.model_name}
    exp: dict[tuple[str, tuple], float | None] = {
        ("inferctl_engine_num_requests_running", ()): s.running,
        ("inferctl_engine_num_requests_waiting", ()): s.waiting,
        ("inferctl_engine_kv_cache_blocks", (("state", "used"),)): s.kv_blocks_used,
        ("inferctl_engine_kv_cache_blocks", (("state", "free"),)): s.kv_blocks_free,
        ("inferctl_engine_kv_cache_usage_ratio", ()): s.kv_usage_ratio,
        ("inferctl_engine_kv_cache_waste_ratio", ()): math.nan if s.kv_waste_ratio is None else s.kv_waste_ratio,
        ("inferctl_engine_memory_allocated_bytes", ()): s.allocated_bytes,
        ("inferctl_engine_memory_reserved_bytes", ()): s.reserved_bytes,
        ("inferctl_engine_memory_weights_bytes", ()): s.weights_bytes,
        ("inferctl_engine_draining", ()): 1 if s.draining else 0,
        ("inferctl_engine_steps_total", ()): st.steps_total,
        ("inferctl_engine_step_sequences_total", ()): st.step_sequences_total,
        ("inferctl_engine_step_real_tokens_total", ()): st.real_tokens_total,
        ("inferctl_engine_prefix_cache_queries_total", ()): st.prefix_cache_queries_total,
        ("inferctl_engine_prefix_cache_hits_total", ()): st.prefix_cache_hits_total,
        ("inferctl_engine_prompt_tokens_total", tuple(m.items())): st.prompt_tokens_total or None,
        ("inferctl_engine_generation_tokens_total", tuple(m.items())): generated or None,
    }
    for mode in PRECISION_MODES:
        exp[("inferctl_engine_precision_mode", (("mode", mode),))] = 1 if s.precision == mode else 0
    return exp


def _check(engine: LLMEngine, generated: int) -> None:
    for (name, labels), want in _expected(engine, generated).items():
        got = _get(engine, name, dict(labels))
        if isinstance(want, float) and math.isnan(want):
            assert got is not None and math.isnan(got), name
        else:
            assert got == want, (name, labels, got, want)


@pytest.fixture()
def engine(bundle):
    # a small pool and 2-token prefix-cache hits: preemption and prefix caching both show up
    return LLMEngine(bundle, EngineConfig(num_kv_blocks=12, max_num_batched_tokens=40, enable_prefix_caching=True))


def _script(engine: LLMEngine, bundle, scrape_every_step: bool) -> int:
    """Run a scripted mix (shared prefix, different lengths, an abort, a drain toggle); returns the
    tokens handed out. Scrapes (and checks) after every step when asked."""
    enc = bundle.tokenizer.encode
    prompt = enc("Once upon a time, there was a little girl named Lily. She loved to play")
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (30, 12, 45)]
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", prompt[: len(prompt) - i], p)
    generated = steps = 0
    while engine.has_unfinished_requests():
        generated += sum(len(o.new_token_ids) for o in engine.step())
        steps += 1
        if scrape_every_step:
            _check(engine, generated)
        if steps == 5:     # commands record (and publish) between steps, as the old gauges were set
            engine.abort_request("r1")
            engine.set_draining(True)
            if scrape_every_step:
                _check(engine, generated)
        if steps == 9:     # a request added between steps shows at the next step, as before
            engine.set_draining(False)
            engine.add_request("late", prompt[:6], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    return generated


def test_every_scrape_equals_the_per_step_values(bundle, engine):
    _check(engine, 0)    # before any step: the gauges of the idle engine, no generation series
    assert _get(engine, "inferctl_engine_generation_tokens_total", {"model": engine.model_name}) is None
    generated = _script(engine, bundle, scrape_every_step=True)
    assert generated > 60 and engine.stats_.steps_total > 10
    assert engine.stats_.prefix_cache_hits_total > 0    # the script exercised the prefix counters
    _check(engine, generated)
    _check(engine, generated)     # a second scrape adds nothing: counters are synced by difference


def test_one_scrape_after_many_steps_holds_them_all(bundle, engine):
    generated = _script(engine, bundle, scrape_every_step=False)
    _check(engine, generated)
    assert _get(engine, "inferctl_engine_requests_total", {"model": engine.model_name, "finish_reason": "abort"}) == 1


def test_gauges_are_read_at_scrape_time_from_the_live_source():
    def snap(running: int) -> SchedulerStats:
        return SchedulerStats(running=running, waiting=0, preemptions_total=0, kv_blocks_used=3, kv_blocks_free=7,
                              kv_usage_ratio=0.3, kv_waste_ratio=0.5, kv_tokens_stored=24, allocated_bytes=100,
                              reserved_bytes=200, weights_bytes=50, precision="int8", draining=False,
                              pending_injected=0)

    current = {"s": snap(1)}
    log = PrometheusStatLogger("m", 1000, live=lambda: current["s"])
    log.record(None, IterationStats(ran_forward=True, batch_size=2, real_tokens=2, num_generation_tokens=2))
    current["s"] = snap(4)        # changed after the step: the scrape shows the live value
    reg = log.registry
    assert reg.get_sample_value("inferctl_engine_num_requests_running") == 4
    assert reg.get_sample_value("inferctl_engine_precision_mode", {"mode": "int8"}) == 1
    assert reg.get_sample_value("inferctl_engine_steps_total") == 1
    assert reg.get_sample_value("inferctl_engine_generation_tokens_total", {"model": "m"}) == 2


def test_concurrent_scrapes_never_count_a_step_twice():
    log = PrometheusStatLogger("m", 1000)
    it = IterationStats(ran_forward=True, batch_size=3, real_tokens=5, num_generation_tokens=3)
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            log.registry.get_sample_value("inferctl_engine_steps_total")

    threads = [threading.Thread(target=scrape) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(2000):
        log.record(None, it)
    stop.set()
    for t in threads:
        t.join()
    reg = log.registry
    assert reg.get_sample_value("inferctl_engine_steps_total") == 2000
    assert reg.get_sample_value("inferctl_engine_step_sequences_total") == 6000
    assert reg.get_sample_value("inferctl_engine_step_real_tokens_total") == 10000
    assert reg.get_sample_value("inferctl_engine_generation_tokens_total", {"model": "m"}) == 6000
