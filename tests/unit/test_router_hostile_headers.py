"""Hostile request headers on the router's ASGI hot path (router/asgi.py), against a fake replica
(raw ASGI, in process): a repeated singleton header counts by its FIRST value, as on the engine
(Starlette's ``Headers.get``, :func:`inferctl.contract.client_key.api_key_refusal`), so the router
neither refuses what the engine accepts nor forwards a joined value the engine would refuse."""

from __future__ import annotations

import asyncio
import json

import httpx

from inferctl.router.app import create_app
from inferctl.router.asgi import response_headers
from inferctl.router.config import EngineSpec, RouterConfig

J = (b"content-type", b"application/json")
OK = json.dumps({"model": "m", "prompt": "hi"}).encode()


def _router():
    seen: list[list[tuple[bytes, bytes]]] = []

    async def replica(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            body = b'{"object":"list","data":[{"id":"m"}]}' if scope["path"] == "/v1/models" else b'{"ready":true}'
        else:
            while (await receive()).get("more_body"):
                pass
            seen.append(scope["headers"])
            body = b'{"ok":1}'
        await send({"type": "http.response.start", "status": 200, "headers": [J]})
        await send({"type": "http.response.body", "body": body})

    client = httpx.AsyncClient(mounts={"http://a.test": httpx.ASGITransport(app=replica)})
    return create_app(RouterConfig(engines=(EngineSpec("a", "http://a.test"),)), client=client), seen


async def _post(app, headers) -> tuple[int, dict, bytes]:
    await app.state.router.prober.round()
    sent: list[dict] = []
    messages = iter([{"type": "http.request", "body": OK}])

    async def receive():
        return next(messages, {"type": "http.disconnect"})

    async def send(m):
        sent.append(m)
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers, "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("r", 80), "client": ("c", 1), "http_version": "1.1",
             "asgi": {"version": "3.0"}}
    await app(scope, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_a_repeated_content_type_counts_by_its_first_value_as_on_the_engine():
    app, seen = _router()
    status, _, body = asyncio.run(_post(app, [J, (b"content-type", b"text/plain")]))
    assert (status, body) == (200, b'{"ok":1}')
    assert [v for k, v in seen[0] if k == b"content-type"] == [b"application/json"]


def test_a_repeated_content_length_counts_by_its_first_value():
    app, _ = _router()
    n = str(len(OK)).encode()
    status, _, body = asyncio.run(_post(app, [J, (b"content-length", n), (b"content-length", n)]))
    assert (status, body) == (200, b'{"ok":1}')


def test_a_repeated_request_id_echoes_the_first_as_the_engine_does():
    app, seen = _router()
    status, headers, _ = asyncio.run(_post(app, [J, (b"x-request-id", b"abc"), (b"x-request-id", b"def")]))
    assert status == 200 and headers[b"x-request-id"] == b"abc"
    assert [v for k, v in seen[0] if k == b"x-request-id"] == [b"abc"]


def test_a_repeated_authorization_is_forwarded_as_its_first_value_not_joined():
    app, seen = _router()
    status, _, _ = asyncio.run(_post(app, [J, (b"authorization", b"Bearer a"), (b"authorization", b"Bearer b")]))
    assert status == 200
    assert [v for k, v in seen[0] if k == b"authorization"] == [b"Bearer a"]


def test_headers_a_client_names_in_connection_are_not_forwarded():
    """RFC 9110 section 7.6.1: a proxy removes the fields its ``Connection`` header lists."""
    app, seen = _router()
    status, _, _ = asyncio.run(_post(app, [J, (b"connection", b"X-Secret, x-other"), (b"x-secret", b"s"),
                                           (b"x-other", b"o"), (b"x-kept", b"k")]))
    assert status == 200
    names = [k for k, _ in seen[0]]
    assert b"x-secret" not in names and b"x-other" not in names and b"x-kept" in names


def test_a_connection_header_naming_content_type_or_authorization_does_not_strip_them():
    """RFC 9110 section 7.6.1 forbids naming an end-to-end field in ``Connection``; the engine
    ignores such a listing (200 straight to it), so the router forwards the ``Content-Type`` it
    validated the body under and the client's ``Authorization`` (before: both dropped, and the
    engine answered 415 "got none" / 401 to what it accepts directly)."""
    app, seen = _router()
    status, _, _ = asyncio.run(_post(app, [J, (b"connection", b"Content-Type, Authorization, x-hop"),
                                           (b"authorization", b"Bearer k"), (b"x-hop", b"1")]))
    assert status == 200
    forwarded = dict(seen[0])
    assert forwarded[b"content-type"] == b"application/json" and forwarded[b"authorization"] == b"Bearer k"
    assert b"x-hop" not in forwarded


def test_headers_a_replica_names_in_connection_are_not_passed_on():
    raw = [(b"Content-Type", b"application/json"), (b"Connection", b"X-Hop, keep-alive"), (b"x-hop", b"1"),
           (b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")]
    assert response_headers(raw, b"r1", b"a") == [(b"content-type", b"application/json"), (b"set-cookie", b"a=1"),
                                                  (b"set-cookie", b"b=2"), (b"x-request-id", b"r1"),
                                                  (b"x-inferctl-replica", b"a")]


class _Stream:
    """A replica's streamed answer (fake :class:`~inferctl.router.upstream.UpstreamResponse`) that
    counts the chunks it gave out."""

    def __init__(self, content_type: bytes, parts: list[bytes]) -> None:
        self.status, self.raw_headers, self.headers = 200, [(b"content-type", content_type)], {}
        self.parts, self.given, self.closed = parts, 0, 0

    async def chunks(self):
        for part in self.parts:
            await asyncio.sleep(0.01)
            self.given += 1
            yield part

    async def read(self) -> bytes:
        return b"".join(self.parts)

    async def close(self) -> None:
        self.closed += 1


def test_an_event_stream_in_upper_case_is_relayed_chunk_by_chunk():
    """RFC 9110 section 8.3.1: a media type's type and subtype are case-insensitive; buffered
    whole, a long stream reached the client at its end and a client gone never aborted it."""
    parts = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    answer = _Stream(b"Text/Event-Stream; charset=utf-8", parts)

    class Upstream:
        async def send(self, method, url, *, content, headers):
            return answer

        async def aclose(self):
            pass
    app, _ = _router()
    app = create_app(app.state.router.config, client=app.state.router.client, upstream=Upstream())
    sent: list[tuple[dict, int]] = []

    async def go():
        await app.state.router.prober.round()
        messages = iter([{"type": "http.request", "body": OK}])

        async def receive():
            msg = next(messages, None)
            if msg is None:
                await asyncio.sleep(3600)
            return msg

        async def send(m):
            sent.append((m, answer.given))
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [J], "query_string": b"",
                 "root_path": "", "scheme": "http", "server": ("r", 80), "client": ("c", 1),
                 "http_version": "1.1", "asgi": {"version": "3.0"}}
        await asyncio.wait_for(app(scope, receive, send), 10)
    asyncio.run(go())
    bodies = [(m["body"], given) for m, given in sent if m["type"] == "http.response.body" and m["body"]]
    assert [b for b, _ in bodies] == parts
    assert bodies[0][1] == 1          # the first chunk went out before the replica gave the second
    assert answer.closed == 1 and app.state.router.replicas["a"].outstanding == 0
