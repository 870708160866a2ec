"""libcurl's timer on the poller's loop (controller/scrape/curl.py ``_on_timer``): "0 ms" runs
once soon (coalesced) and leaves the armed timer alone, a request for the expiry already armed
keeps it, an earlier or later one re-arms it, -1 cancels it; every run reaches
``socket_action(SOCKET_TIMEOUT)``. The GETs' own deadlines through libcurl's timer are covered by
tests/unit/test_sources_async.py."""

from __future__ import annotations

import asyncio

import pycurl

from inferctl.controller.scrape.aio import BodyTooLarge
from inferctl.controller.scrape.curl import CurlTransport


def test_the_timer_requests_map_to_loop_timers_and_runs():
    loop = asyncio.new_event_loop()
    try:
        t = CurlTransport(loop, BodyTooLarge)
        runs: list[int] = []
        t._action = lambda fd, event: runs.append(fd)

        async def scenario() -> None:
            t._on_timer(500)
            first = t._timer
            assert first is not None and abs(t._timer_when - (loop.time() + 0.5)) < 0.01
            t._on_timer(0)
            t._on_timer(0)                      # coalesced with the first
            assert t._timer is first and t._soon
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert runs == [pycurl.SOCKET_TIMEOUT] and not t._soon
            t._on_timer(int(round((t._timer_when - loop.time()) * 1000)))   # the same expiry again
            assert t._timer is first
            t._on_timer(200)                    # earlier: re-armed
            assert t._timer is not first and first.cancelled()
            second = t._timer
            t._on_timer(900)                    # later: re-armed too (never a late wake-up)
            assert t._timer is not second and second.cancelled()
            t._on_timer(-1)
            assert t._timer is None
            t._on_timer(20)
            await asyncio.sleep(0.1)
            assert runs == [pycurl.SOCKET_TIMEOUT, pycurl.SOCKET_TIMEOUT] and t._timer is None

        loop.run_until_complete(scenario())
        t.close()
    finally:
        loop.close()
