"""The router's ASGI hot-path pieces (router/asgi.py) and the outstanding-requests gauge read at
scrape time (router/proxy.py): headers in and out, the body source, the pass-through response."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import ClientDisconnect

from inferctl.contract.http import BodyRejected, read_body
from inferctl.router.asgi import AsgiBody, ClientWatch, PassThrough, response_headers, scope_headers
from inferctl.router.config import EngineSpec, RouterConfig
from inferctl.router.metrics import build_router_registry
from inferctl.router.proxy import Forwarder
from inferctl.router.replicas import ReplicaSet


def _receiver(messages):
    it = iter(messages)

    async def receive():
        return next(it)
    return receive


def test_scope_headers_decode_latin1_and_keep_the_first_of_repeated_names():
    scope = {"headers": [(b"content-type", b"application/json"), (b"x-a", b"1"), (b"x-a", b"2"),
                         (b"x-session-id", "é".encode("latin-1"))]}
    assert scope_headers(scope) == {"content-type": "application/json", "x-a": "1", "x-session-id": "é"}
    assert scope_headers({}) == {}


def test_the_body_source_reads_every_chunk_and_a_disconnect_is_the_readers_400():
    headers = {"content-type": "application/json"}
    whole = AsgiBody(headers, _receiver([{"type": "http.request", "body": b'{"a":', "more_body": True},
                                         {"type": "http.request", "body": b"", "more_body": True},
                                         {"type": "http.request", "body": b"1}", "more_body": False}]))
    assert asyncio.run(read_body(whole, 100, require_json_type=True)) == b'{"a":1}'
    cut = AsgiBody(headers, _receiver([{"type": "http.request", "body": b'{"a":', "more_body": True},
                                       {"type": "http.disconnect"}]))
    with pytest.raises(BodyRejected) as exc:
        asyncio.run(read_body(cut, 100))
    assert exc.value.status == 400 and exc.value.reason == "disconnected"

    async def first_then_disconnect():
        gone = AsgiBody(headers, _receiver([{"type": "http.disconnect"}]))
        return [chunk async for chunk in gone.stream()]
    with pytest.raises(ClientDisconnect):
        asyncio.run(first_then_disconnect())


def test_response_headers_pass_the_replicas_own_and_drop_what_the_router_sets():
    raw = [(b"Content-Type", b"application/json"), (b"Date", b"Wed, 02 Dec 2026 06:00:00 GMT"),
           (b"server", b"uvicorn"), (b"content-length", b"99"), (b"Connection", b"keep-alive"),
           (b"x-request-id", b"engine-side"), (b"x-custom", b"kept"), (b"x-bad", b"caf\xe9"),
           (b"x-ctl", b"a\x01b"), (b"x-tab", b"a\tb")]
    out = response_headers(raw, b"rid-1", b"main-0")
    assert out == [(b"content-type", b"application/json"), (b"x-custom", b"kept"), (b"x-tab", b"a\tb"),
                   (b"x-request-id", b"rid-1"), (b"x-inferctl-replica", b"main-0")]


def test_pass_through_sends_the_status_headers_and_body_with_its_length():
    sent = []

    async def send(message):
        sent.append(message)
    resp = PassThrough(418, [(b"content-type", b"text/plain")], b"short and stout")
    asyncio.run(resp({"type": "http"}, _receiver([]), send))
    assert sent == [{"type": "http.response.start", "status": 418,
                     "headers": [(b"content-type", b"text/plain"), (b"content-length", b"15")]},
                    {"type": "http.response.body", "body": b"short and stout"}]


def test_the_outstanding_gauge_reads_each_replica_when_scraped():
    config = RouterConfig(engines=(EngineSpec("a", "http://a"), EngineSpec("b", "http://b")))
    registry, metrics = build_router_registry()
    replicas = ReplicaSet.from_specs(config.engines)
    Forwarder(config, replicas, upstream=None, metrics=metrics)
    replicas["a"].outstanding, replicas["b"].outstanding = 3, 1      # no gauge call on the way
    got = {s.labels["replica"]: s.value for m in registry.collect() for s in m.samples
           if s.name == "inferctl_router_outstanding_requests"}
    assert got == {"a": 3.0, "b": 1.0}


class _Cycle:
    """uvicorn's per-request cycle as ClientWatch sees it (uvicorn/protocols/http/httptools_impl.py):
    ``message_event`` set on a lost connection (``disconnected`` True) or a complete response."""

    def __init__(self) -> None:
        self.message_event = asyncio.Event()
        self.disconnected = False
        self.reads = 0

    async def receive(self):
        self.reads += 1
        await self.message_event.wait()
        self.message_event.clear()
        return {"type": "http.disconnect"}


async def _watched(receive, *, leave_after: float | None, stop_at: float = 1.0, on_leave=None):
    """Wait ``stop_at`` s under a ClientWatch of ``receive``; ``on_leave`` (the client leaving) runs
    after ``leave_after`` s. Returns (cancelled by the watch, watch.gone)."""
    loop = asyncio.get_running_loop()
    if leave_after is not None:
        loop.call_later(leave_after, on_leave)
    watch = ClientWatch(receive)
    try:
        await asyncio.sleep(stop_at)
        return False, watch.gone
    except asyncio.CancelledError:
        asyncio.current_task().uncancel()
        return True, watch.gone
    finally:
        watch.stop()


def _lose(cycle: _Cycle) -> None:
    cycle.disconnected = True
    cycle.message_event.set()


def test_client_watch_on_uvicorns_cycle_cancels_on_a_disconnect_and_runs_no_task():
    async def go():
        cycle = _Cycle()
        gone = await _watched(cycle.receive, leave_after=0.01, on_leave=lambda: _lose(cycle))
        tasks = len(asyncio.all_tasks())
        quiet = _Cycle()
        stays = await _watched(quiet.receive, leave_after=None, stop_at=0.02)
        return gone, stays, cycle.reads + quiet.reads, tasks, quiet.message_event._waiters
    gone, stays, reads, tasks, waiters = asyncio.run(go())
    assert gone == (True, True) and stays == (False, False)
    assert reads == 0 and tasks == 1 and not waiters     # no receive() call, no task, no waiter left


def test_client_watch_keeps_watching_through_a_wakeup_that_is_not_a_disconnect():
    async def go():
        cycle = _Cycle()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, cycle.message_event.set)       # e.g. a late body event
        loop.call_later(0.02, cycle.message_event.clear)
        return await _watched(cycle.receive, leave_after=0.05, on_leave=lambda: _lose(cycle))
    assert asyncio.run(go()) == (True, True)


def test_client_watch_after_stop_cancels_nothing():
    async def go():
        cycle = _Cycle()
        watch = ClientWatch(cycle.receive)
        watch.stop()
        _lose(cycle)
        await asyncio.sleep(0.01)
        return watch.gone
    assert asyncio.run(go()) is False


def test_client_watch_over_another_servers_receive_uses_a_task_and_consumes_nothing_when_stopped():
    async def go():
        queue: asyncio.Queue = asyncio.Queue()

        async def receive():          # a queue-based server (one message per call)
            return await queue.get()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, queue.put_nowait, {"type": "http.disconnect"})
        left = await _watched(receive, leave_after=None, stop_at=1.0)
        stopped = await _watched(receive, leave_after=None, stop_at=0.01)
        queue.put_nowait({"type": "http.disconnect"})
        await asyncio.sleep(0.01)
        return left, stopped, queue.qsize()
    left, stopped, left_in_queue = asyncio.run(go())
    assert left == (True, True) and stopped == (False, False)
    assert left_in_queue == 1          # the stopped watch took no message (a stream's listener gets it)


def test_client_watch_survives_a_receive_that_fails():
    async def go():
        async def receive():
            raise RuntimeError("receive after the response")
        return await _watched(receive, leave_after=None, stop_at=0.01)
    assert asyncio.run(go()) == (False, False)
