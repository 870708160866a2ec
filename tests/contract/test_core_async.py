"""AsyncLLMEngine: streaming, admission errors before the first yield, cancellation frees
blocks, admin calls between steps, clean shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.core_helpers import drain
from inferctl.engine.async_engine import AsyncLLMEngine, EngineDeadError
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_llama2c
from inferctl.engine.sampling_params import SamplingParams
from inferctl.engine.scheduler import AdmissionError


@pytest.fixture(scope="module")
def bundle(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin", stories_dir / "tok512.bin")


@pytest.fixture
def aengine(bundle):
    engine = AsyncLLMEngine(LLMEngine(bundle, EngineConfig()))
    engine.start()
    yield engine
    engine.shutdown()
    bundle.model.set_precision("full")


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


async def collect(aengine, rid, ids, params):
    outs = []
    async for out in aengine.generate(rid, ids, params):
        outs.append(out)
    return outs


def wait_until(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return False


def test_streams_match_the_synchronous_engine(bundle, aengine):
    prompts = {"a": "Once upon a time", "b": "Tom", "c": "The cat"}
    sync = LLMEngine(bundle, EngineConfig())
    for rid, p in prompts.items():
        sync.add_request(rid, bundle.tokenizer.encode(p), greedy(25))
    expected = drain(sync)[0]

    async def main():
        return await asyncio.gather(*(collect(aengine, rid, bundle.tokenizer.encode(p), greedy(25))
                                      for rid, p in prompts.items()))

    results = asyncio.run(main())
    for rid, outs in zip(prompts, results):
        assert [t for o in outs for t in o.new_token_ids] == expected[rid]
        assert outs[-1].finished and outs[-1].finish_reason == "length"
        assert all(not o.finished for o in outs[:-1])
        assert "".join(o.new_text for o in outs) == bundle.tokenizer.decode(expected[rid])


def test_admission_error_before_the_first_yield(bundle, aengine):
    async def main():
        gen = aengine.generate("x", [1] * 600, greedy(4))   # 604 > max_model_len 512
        with pytest.raises(AdmissionError) as ei:
            await gen.__anext__()
        return ei.value

    err = asyncio.run(main())
    assert err.status == 400 and "> max_model_len 512" in err.message
    assert not aengine.engine.has_unfinished_requests()


def test_cancelled_consumer_aborts_and_frees_blocks(bundle, aengine):
    async def main():
        got = []

        async def consume():
            async for out in aengine.generate("long", bundle.tokenizer.encode("Tom"), greedy(400)):
                got.append(out)

        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return got

    got = asyncio.run(main())
    assert len(got) >= 3
    assert wait_until(lambda: not aengine.engine.has_unfinished_requests())
    stats = aengine.stats()
    assert stats["kv_cache"]["blocks_used"] == 0
    assert stats["requests"]["by_finish_reason"]["abort"] == 1
    assert stats["requests"]["recent"][-1]["completion_tokens"] < 400


def test_breaking_out_of_the_stream_aborts(bundle, aengine):
    async def main():
        gen = aengine.generate("brk", bundle.tokenizer.encode("Tom"), greedy(400))
        async for _ in gen:
            break
        await gen.aclose()

    asyncio.run(main())
    assert wait_until(lambda: not aengine.engine.has_unfinished_requests())
    assert aengine.stats()["kv_cache"]["blocks_used"] == 0


def test_admin_calls_apply_between_steps_even_when_idle(bundle, aengine):
    aengine.request_precision("int8")
    assert wait_until(lambda: aengine.precision == "int8")
    aengine.inject_fault("oom", 1)

    async def main():
        return await collect(aengine, "r", bundle.tokenizer.encode("Once upon a time"), greedy(10))

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "length" and sum(len(o.new_token_ids) for o in outs) == 10
    stats = aengine.stats()
    assert stats["faults"]["oom_total"] == 1 and stats["faults"]["last_oom"]["source"] == "injected"
    assert stats["faults"]["last_oom"]["precision"] == "int8"
    aengine.set_draining(True)

    async def refused():
        with pytest.raises(AdmissionError) as ei:
            await aengine.generate("d", [1, 2], greedy(2)).__anext__()
        return ei.value.status

    assert asyncio.run(refused()) == 503
    with pytest.raises(ValueError):
        aengine.inject_fault("oom", 0)


def test_shutdown_ends_open_streams(bundle):
    aengine = AsyncLLMEngine(LLMEngine(bundle, EngineConfig()))

    async def not_started():
        with pytest.raises(RuntimeError, match="not started"):
            await aengine.generate("a", [1], greedy(1)).__anext__()

    asyncio.run(not_started())
    aengine.start()

    async def main():
        got = []

        async def consume():
            async for out in aengine.generate("a", bundle.tokenizer.encode("Tom"), greedy(400)):
                got.append(out)
                if len(got) == 2:
                    await asyncio.get_running_loop().run_in_executor(None, aengine.shutdown)

        with pytest.raises(EngineDeadError):
            await consume()
        return got

    got = asyncio.run(main())
    assert len(got) >= 2
    assert not aengine.is_running


def test_a_failed_step_fails_the_queued_requests_too_and_is_counted(bundle, aengine):
    # A request submitted while a step is failing gets the failure on its stream; it must
    # then not run on with nobody listening. The failure shows in /stats like a step error.
    engine = aengine.engine
    real_step = engine.step
    entered, go = threading.Event(), threading.Event()

    def failing_step():
        engine.step = real_step
        entered.set()
        go.wait(5)
        raise RuntimeError("boom")

    engine.step = failing_step
    ids = bundle.tokenizer.encode("Once upon a time")

    async def main():
        a = asyncio.create_task(collect(aengine, "a", ids, greedy(5)))
        assert await asyncio.get_running_loop().run_in_executor(None, entered.wait, 5)
        b = asyncio.create_task(collect(aengine, "b", ids, greedy(300)))
        await asyncio.sleep(0.05)   # b is queued for the next step
        go.set()
        return await asyncio.gather(a, b, return_exceptions=True)

    results = asyncio.run(main())
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    assert all("boom" in str(r) for r in results)
    time.sleep(0.3)
    stats = aengine.stats()
    assert stats["engine"]["unfinished_requests"] == 0
    assert stats["requests"]["by_finish_reason"] == {**stats["requests"]["by_finish_reason"],
                                                     "abort": 1, "length": 0}
    assert stats["scheduler"]["step_errors_total"] == 1
    assert "boom" in stats["scheduler"]["last_step_error"]


def test_redirect_hands_the_rest_of_a_stream_to_a_callback(bundle, aengine):
    ids = bundle.tokenizer.encode("Once upon a time")
    expected = asyncio.run(collect(aengine, "ref", ids, greedy(30)))
    aborted_before = aengine.stats()["requests"]["by_finish_reason"]["abort"]

    async def main():
        agen = aengine.generate("r", ids, greedy(30))
        first = await agen.__anext__()
        got, ended = [first], asyncio.get_running_loop().create_future()

        def sink(item):
            got.append(item)
            if isinstance(item, BaseException) or item.finished:
                ended.set_result(None)
        aengine.redirect("r", sink)
        await asyncio.wait_for(ended, 10)
        await agen.aclose()      # after the end: no abort
        with pytest.raises(KeyError):
            aengine.redirect("r", sink)
        return got

    got = asyncio.run(main())
    assert [t for o in got for t in o.new_token_ids] == [t for o in expected for t in o.new_token_ids]
    assert got[-1].finished and got[-1].finish_reason == "length" and not any(o.finished for o in got[:-1])
    assert aengine.stats()["requests"]["by_finish_reason"]["abort"] == aborted_before


def test_redirected_stream_gets_the_shutdown_error_and_closing_early_aborts(bundle):
    aengine = AsyncLLMEngine(LLMEngine(bundle, EngineConfig()))
    aengine.start()
    ids = bundle.tokenizer.encode("Tom")

    async def main():
        # closed before its end: the request is aborted in the engine
        early = aengine.generate("early", ids, greedy(400))
        await early.__anext__()
        aengine.redirect("early", lambda item: None)
        await early.aclose()
        # open at shutdown: the sink gets the EngineDeadError
        agen = aengine.generate("late", ids, greedy(400))
        await agen.__anext__()
        got, ended = [], asyncio.get_running_loop().create_future()

        def sink(item):
            got.append(item)
            if isinstance(item, BaseException) and not ended.done():
                ended.set_result(None)
        aengine.redirect("late", sink)
        await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
            lambda: aengine.stats()["requests"]["by_finish_reason"]["abort"] == 1))
        await asyncio.get_running_loop().run_in_executor(None, aengine.shutdown)
        await asyncio.wait_for(ended, 10)
        await agen.aclose()
        return got

    got = asyncio.run(main())
    assert isinstance(got[-1], EngineDeadError)
    assert all(not isinstance(o, BaseException) and not o.finished for o in got[:-1])
