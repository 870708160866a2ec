"""A round of engine polls bounds its calls with one deadline timer (controller/scrape/deadlines.py) instead
of an ``asyncio.timeout`` per call: a slow call is marked exactly as the per-call timeout marked
it (the same failed result, error, backoff and poll count), each call's deadline starts when a
worker takes it, a call that outlives its cancel keeps its result, and a cancel from outside
stays a cancel."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time

import pytest

from inferctl.controller.scrape.aio import AsyncPoller
from inferctl.controller.scrape.deadlines import RoundDeadlines
from inferctl.controller.sources import AsyncSourceJob, _round


class _Result:
    def __init__(self, ok: bool, tag: str) -> None:
        self.ok = ok
        self.tag = tag


def _job(name: str, afn, poller: AsyncPoller, timeout: float = 0.3) -> AsyncSourceJob:
    return AsyncSourceJob(name, afn, lambda now, err: _Result(False, err), interval=5.0, timeout=timeout,
                          max_backoff=10.0, metrics={}, poller=poller)


def _sleeper(seconds: float, tag: str):
    async def afn(now: float) -> _Result:
        await asyncio.sleep(seconds)
        return _Result(True, tag)
    return afn


def _run_round(poller: AsyncPoller, jobs, concurrency: int) -> list:
    out: list = []
    poller.submit(_round(jobs, 1.0, True, None, cf.Future(), out, concurrency)).result(10)
    return out


@pytest.fixture
def poller():
    p = AsyncPoller(client="aiohttp")
    yield p
    p.close()


def test_a_slow_call_in_a_round_fails_as_the_per_call_timeout_made_it_fail(poller):
    alone = _job("engine:alone", _sleeper(5.0, "late"), poller)
    before = alone.run(1.0, force=True)                    # asyncio.timeout per call
    jobs = [(n, _job(f"engine:{n}", _sleeper(5.0 if n == "slow" else 0.01, n), poller))
            for n in ("a", "slow", "b", "c")]
    t0 = time.monotonic()
    out = dict(_run_round(poller, jobs, concurrency=2))
    assert time.monotonic() - t0 < 3.0                     # bounded by the deadline, not the 5 s call
    slow = dict(jobs)["slow"]
    assert (out["slow"].ok, out["slow"].tag) == (before.ok, before.tag) == (False, "timed out after 0.3 s")
    assert (slow.failures, slow.polls, slow.last_error, slow.next_attempt - 1.0) == \
           (alone.failures, alone.polls, alone.last_error, alone.next_attempt - 1.0)
    assert all(out[n].ok and out[n].tag == n for n in ("a", "b", "c"))
    assert all(dict(jobs)[n].failures == 0 for n in ("a", "b", "c"))


def test_each_deadline_starts_when_a_worker_takes_the_call(poller):
    # one worker, calls of 0.2 s each under a 0.3 s timeout: 1 s in all, none timed out
    jobs = [(f"e{i}", _job(f"engine:e{i}", _sleeper(0.2, f"e{i}"), poller)) for i in range(5)]
    out = dict(_run_round(poller, jobs, concurrency=1))
    assert all(r.ok for r in out.values()) and len(out) == 5
    # several slow calls in turn on one worker: each times out at its own deadline
    jobs = [(f"s{i}", _job(f"engine:s{i}", _sleeper(5.0, f"s{i}"), poller, timeout=0.2)) for i in range(3)]
    t0 = time.monotonic()
    out = dict(_run_round(poller, jobs, concurrency=1))
    took = time.monotonic() - t0
    assert all(r.tag == "timed out after 0.2 s" for r in out.values()) and len(out) == 3
    assert 0.55 < took < 2.5


def test_a_call_that_outlives_its_cancel_keeps_its_result_and_the_worker_goes_on(poller):
    async def stubborn(now: float) -> _Result:
        try:
            await asyncio.sleep(5.0)
        except asyncio.CancelledError:
            return _Result(True, "finished anyway")
        return _Result(True, "slept")

    async def check_not_cancelling(now: float) -> _Result:
        await asyncio.sleep(0.01)
        return _Result(asyncio.current_task().cancelling() == 0, "next")

    jobs = [("stubborn", _job("engine:stubborn", stubborn, poller)),
            ("next", _job("engine:next", check_not_cancelling, poller))]
    out = dict(_run_round(poller, jobs, concurrency=1))
    assert out["stubborn"].ok and out["stubborn"].tag == "finished anyway"
    assert out["next"].ok                      # the deadline's cancel was withdrawn (uncancel)


def test_a_cancel_from_elsewhere_is_not_a_timeout_and_an_abandoned_round_stays_bounded(poller):
    async def cancelled(now: float) -> _Result:
        asyncio.current_task().cancel()
        await asyncio.sleep(1.0)
        return _Result(True, "never")

    job = _job("engine:x", cancelled, poller)
    out = _run_round(poller, [("x", job)], 4)
    assert out == [] and job.failures == 0 and job.polls == 0      # propagated, as asyncio.timeout does
    # the round itself cancelled (poll_engines gave up on it): its workers' calls still time out
    slow = _job("engine:slow", _sleeper(5.0, "slow"), poller)
    out = []
    fut = poller.submit(_round([("slow", slow)], 1.0, True, None, cf.Future(), out, 4))
    time.sleep(0.05)
    fut.cancel()
    deadline = time.monotonic() + 3.0
    while not out and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [(n, r.tag) for n, r in out] == [("slow", "timed out after 0.3 s")] and slow.failures == 1


def test_the_timer_is_armed_once_per_earliest_deadline_and_stopped_with_the_round():
    loop = asyncio.new_event_loop()
    try:
        async def main() -> tuple[int, bool]:
            d = RoundDeadlines(asyncio.get_running_loop())
            armed = []
            real = d.schedule
            d.schedule = lambda when: (armed.append(when), real(when))
            slots = [d.slot(asyncio.current_task()) for _ in range(3)]
            for s in slots:
                s.arm(10.0)
                s.disarm()
                s.arm(10.0)
            d.close()
            return len(armed), d._handle is None
        assert loop.run_until_complete(main()) == (1, True)
    finally:
        loop.close()
