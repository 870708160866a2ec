"""Forwarding one validated request to a replica: retries before the first byte, streaming after.

:meth:`Forwarder.forward` tries at most :meth:`RouterConfig.attempts` replicas, each chosen by
:func:`inferctl.router.balancer.choose` among the routable ones not tried yet:

* a connect error or timeout marks the replica ``down`` until its next probe, and retries;
* a 503 answer (the engine refuses: draining, overloaded, out of memory) retries; when every
  attempt got a 503 the last one is passed to the client unchanged (status, headers, body);
* a transport error before the first body byte arrived retries (reason ``upstream_error``);
* a non-streamed answer that breaks after some of its bytes arrived (none are sent to the client
  before the whole body is in) retries too, under its own reason ``partial_body``: the client
  loses nothing, but the first replica's generation ran to its end, so the retry runs it again;
* any other answer (2xx, 4xx, other 5xx) is passed through unchanged: a non-streamed body
  whole, a ``text/event-stream`` body chunk by chunk as the replica sends it
  (:class:`RelayResponse`); once a byte is sent to the client there is no retry, and a client
  that goes away closes the upstream stream (the engine sees the disconnect and aborts the request);
* a client that goes away while the router still waits for the answer (a non-streamed one, or a
  stream's first chunk) closes the upstream connection too (:class:`~inferctl.router.asgi.
  ClientWatch` cancels the wait): the engine aborts the request instead of generating for nobody.

No routable replica (or none left) → 503 ``no_ready_replica`` with ``Retry-After``.
Response headers carry ``X-Request-Id`` and ``X-Inferctl-Replica`` (the replica that answered).

The client's ``Authorization`` is forwarded unchanged, except behind a router with both its own
key (``--api-key``, checked before this point) and the replicas' key (``--upstream-api-key-env``):
the request then carries the replicas' key instead, so clients hold only the router's key. A
router without its own key never sends the replicas' key on a client's request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial

import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from inferctl.contract.errors import APIError
from inferctl.router.asgi import ClientWatch, PassThrough, response_headers
from inferctl.router.balancer import choose
from inferctl.router.config import RouterConfig
from inferctl.router.ratelimit import UsageMeter
from inferctl.router.replicas import Replica, ReplicaSet
from inferctl.router.ring import AffinityTable, HashRing
from inferctl.router.upstream import Upstream, UpstreamConnectError, UpstreamError, UpstreamResponse

log = logging.getLogger("inferctl.router.access")

#: Headers never forwarded either way (RFC 9110 section 7.6.1 hop-by-hop, plus those the
#: router sets itself).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
                        "x-request-id"})


#: End-to-end fields a client's ``Connection`` header cannot make hop-by-hop: the body's
#: ``Content-Type`` (the router validated the body under it and forwards the same bytes; dropped,
#: the engine answered 415 "got none" to a body the router had accepted) and ``Authorization``
#: (credentials for the origin server, RFC 9110 section 11.6.2; dropped, a key-protected engine
#: answered 401 to a request it accepts directly). RFC 9110 section 7.6.1 forbids a sender to name
#: an end-to-end field in ``Connection``; the router answers such a request as the engine does.
END_TO_END = frozenset({"content-type", "authorization"})


def forward_headers(headers: "Mapping[str, str]", request_id: str) -> dict[str, str]:
    """Client (or upstream) headers minus :data:`HOP_BY_HOP` and the fields their ``Connection``
    header names (RFC 9110 section 7.6.1) except :data:`END_TO_END`, plus ``x-request-id``.

    A header whose value is not printable ASCII (RFC 9110 section 5.5 allows obs-text, but
    nothing the engine reads needs it, and the HTTP client refuses to send it) is left out
    rather than failing the request: the routing already used what it needed (e.g. a
    non-ASCII ``X-Session-Id`` still pins the session)."""
    drop = HOP_BY_HOP
    listed = headers.get("connection")
    if listed:      # RFC 9110 section 7.6.1: the fields Connection names are hop-by-hop too
        drop = HOP_BY_HOP | ({t.strip().lower() for t in listed.split(",")} - END_TO_END)
    out = {k: v for k, v in headers.items() if k.lower() not in drop and _printable_ascii(v)}
    out["x-request-id"] = request_id
    return out


#: A header value of tab and printable ASCII only (RFC 9110 section 5.5 field-vchar, SP, HTAB).
_PRINTABLE = re.compile(r"[\t\x20-\x7e]*")


def _printable_ascii(value: str) -> bool:
    if value.isascii() and value.isprintable():    # the usual case, without the regular expression
        return True
    return _PRINTABLE.fullmatch(value) is not None


class RelayResponse(StreamingResponse):
    """A StreamingResponse that watches for the client's disconnect (whatever the ASGI spec
    version) and always closes its body iterator, shielded from cancellation, so the upstream
    stream is closed as soon as the client goes away."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def run(func) -> None:
                    try:
                        await func()
                    except OSError:  # the client went away while we were sending
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(run, partial(self.stream_response, send))
                await run(partial(self.listen_for_disconnect, receive))
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()


class Forwarder:
    """Chooses replicas and relays one request (module docstring).

    ``upstream``: the router's :class:`~inferctl.router.upstream.Upstream` client (aiohttp in
    production); ``metrics``: catalog name → metric.
    """

    def __init__(self, config: RouterConfig, replicas: ReplicaSet, upstream: Upstream,
                 metrics: dict) -> None:
        self.config = config
        self.replicas = replicas
        self.upstream = upstream
        self.metrics = metrics
        self.ring = AffinityTable(HashRing([e.name for e in config.engines], config.vnodes))
        self._tie = itertools.count()
        self._children: dict[tuple, object] = {}
        # read when /metrics is scraped, not set twice per request (each set takes a lock)
        for r in replicas:
            self._child("inferctl_router_outstanding_requests", r.name).set_function(partial(_outstanding, r))
        #: the replicas' key, sent instead of the client's ``Authorization`` only when the router
        #: admitted the client with its own key (docs/router.md "API keys": one key at the front door)
        self.upstream_authorization = (f"Bearer {config.upstream_api_key}"
                                       if config.api_key is not None and config.upstream_api_key else None)

    def _child(self, name: str, *labels: str):
        """``metrics[name].labels(*labels)``, looked up once (prometheus_client's ``labels``
        validates and locks on every call; the hot path calls it several times per request)."""
        key = (name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.metrics[name].labels(*labels)
        return child

    def update_affinity_gauge(self) -> None:
        """``inferctl_router_affinity_keys{replica}`` from the affinity table's live keys
        (:meth:`~inferctl.router.ring.AffinityTable.keys_per_replica`; idle keys expire first)."""
        for name, n in self.ring.keys_per_replica().items():
            self._child("inferctl_router_affinity_keys", name).set(n)

    def _inc_outstanding(self, r: Replica, delta: int) -> None:
        r.outstanding += delta     # inferctl_router_outstanding_requests reads it at scrape time

    def _retry(self, r: Replica, reason: str, rid: str, detail: str,
               what: str = "failed before the first byte") -> None:
        self._child("inferctl_router_retries_total", r.name, reason).inc()
        log.warning("attempt on %s %s (%s: %s); retrying on another replica", r.name, what, reason, detail,
                    extra={"request_id": rid, "replica": r.name, "reason": reason})

    def _observe(self, r: Replica, ttfb: float, overhead: float) -> None:
        """The successful attempt's upstream time to first byte and the router's overhead (s)."""
        self._child("inferctl_router_upstream_latency_seconds", r.name).observe(ttfb)
        self.metrics["inferctl_router_overhead_seconds"].observe(max(0.0, overhead))

    def _client_gone(self, r: Replica, rid_raw: bytes, rid: str, path: str, t0: float, attempts: int,
                     reason: str | None) -> PassThrough:
        """The client left while the router waited for ``r``'s answer: counted in
        ``inferctl_router_client_disconnects_total{replica}`` and ``inferctl_router_requests_total
        {replica, status="499"}`` (nginx's "client closed request", the engine's log status too),
        logged with ``client_disconnect``; the 499 returned goes nowhere (the server drops it)."""
        self._child("inferctl_router_client_disconnects_total", r.name).inc()
        self._child("inferctl_router_requests_total", r.name, "499").inc()
        self.access(rid, path, r.name, 499, t0, attempts, reason, client_disconnect=True)
        return PassThrough(499, [(b"x-request-id", rid_raw), (b"x-inferctl-replica", r.name.encode("latin-1"))], b"")

    def access(self, rid: str, path: str, replica: str | None, status: int, t0: float, attempts: int,
                reason: str | None, **extra) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        log.info("%s %s -> %s %d", "POST", path, replica, status,
                 extra={"request_id": rid, "path": path, "replica": replica, "status": status,
                        "duration_seconds": round(time.monotonic() - t0, 6), "attempts": attempts,
                        "reason": reason, **extra})

    async def forward(self, client_headers: Mapping[str, str], path: str, body: bytes, *, model: str | None,
                      session: str | None, prefix: str | None, rid: str, t0: float,
                      charge: Callable[[int], None] | None = None, watch: ClientWatch | None = None) -> Response:
        """Send ``body`` (the client's bytes, unchanged) with ``client_headers`` (lower-case name →
        value; :func:`forward_headers` picks what goes on) to ``path`` of a replica; the answer.
        ``charge``: called once with the answer's tokens at its end (a per-key tokens limit).
        ``watch``: the client's :class:`~inferctl.router.asgi.ClientWatch`; when it cancels the wait
        (the client left), the upstream connection is closed (the replica aborts the request) and
        the answer is a 499 nobody receives (counted and logged, :meth:`_client_gone`)."""
        headers = forward_headers(client_headers, rid)
        rid_raw = rid.encode("latin-1")
        if self.upstream_authorization is not None:
            headers["authorization"] = self.upstream_authorization
        tried: set[str] = set()
        last_503: tuple[str, UpstreamResponse, bytes] | None = None
        reason = None
        for attempt in range(self.config.attempts()):
            cands = self.replicas.candidates(model, tried)
            if not cands:
                break
            decision = choose([c.load() for c in cands], self.ring, session=session, prefix=prefix,
                              epsilon=self.config.epsilon, tie=next(self._tie), retry=attempt > 0)
            reason = decision.reason
            self._child("inferctl_router_routing_decisions_total", reason).inc()
            r = self.replicas[decision.replica]
            tried.add(r.name)
            self._inc_outstanding(r, +1)
            handed_off = False
            resp = None
            try:
                sent = time.monotonic()
                try:
                    resp = await self.upstream.send("POST", r.url + path, content=body, headers=headers)
                except UpstreamConnectError as exc:
                    r.ready, r.reason = False, "down"
                    self.metrics["inferctl_router_replica_ready"].labels(r.name).set(0)
                    self.metrics["inferctl_router_replicas_ready"].set(len(self.replicas.routable()))
                    self._retry(r, "connect_error", rid, str(exc))
                    continue
                except UpstreamError as exc:
                    self._retry(r, "upstream_error", rid, str(exc))
                    continue
                if resp.status == 503:
                    try:
                        last_503 = (r.name, resp, await resp.read())
                    except UpstreamError:
                        pass
                    finally:
                        await resp.close()
                    self._retry(r, "unavailable", rid, "503")
                    continue
                chunks = resp.chunks()
                try:
                    first = await anext(chunks, b"")
                except UpstreamError as exc:
                    await resp.close()
                    self._retry(r, "upstream_error", rid, str(exc))
                    continue
                first_at = time.monotonic()
                ttfb = first_at - sent
                out_headers = response_headers(resp.raw_headers, rid_raw, r.name.encode("latin-1"))
                if _event_stream(out_headers):
                    self._observe(r, ttfb, first_at - t0 - ttfb)
                    handed_off = True
                    relay = self._relay(r, resp, chunks, first, rid=rid, path=path, t0=t0,
                                        attempts=attempt + 1, reason=reason, charge=charge)
                    streamed = RelayResponse(relay, status_code=resp.status)
                    streamed.raw_headers = out_headers
                    return streamed
                try:
                    rest = [chunk async for chunk in chunks]
                except UpstreamError as exc:
                    # nothing reached the client, so another replica may answer; but this one's
                    # generation ran (its answer was being written): the retry runs it again
                    self._retry(r, "partial_body", rid, f"{exc} after {len(first)}+ bytes of the answer",
                                what="answer broke after some of its bytes arrived (none sent to the client)")
                    continue
                finally:
                    await resp.close()
                # observed once the attempt succeeded (an answer broken mid-way is not the answer)
                self._observe(r, ttfb, first_at - t0 - ttfb)
                self._child("inferctl_router_requests_total", r.name, str(resp.status)).inc()
                self.access(rid, path, r.name, resp.status, t0, attempt + 1, reason)
                answer = first + b"".join(rest)
                if charge is not None:
                    meter = UsageMeter(stream=False)
                    meter.feed(answer)
                    charge(meter.tokens)
                return PassThrough(resp.status, out_headers, answer)
            except asyncio.CancelledError:
                if watch is None or not watch.gone:
                    raise
                asyncio.current_task().uncancel()      # our own cancel: the client left (ClientWatch)
                if resp is not None:
                    await resp.close()                 # not read to its end: the connection closes
                return self._client_gone(r, rid_raw, rid, path, t0, attempt + 1, reason)
            finally:
                if not handed_off:
                    self._inc_outstanding(r, -1)
        if last_503 is not None:
            name, resp503, body503 = last_503
            self.metrics["inferctl_router_requests_total"].labels(name, "503").inc()
            self.access(rid, path, name, 503, t0, len(tried), reason)
            return PassThrough(503, response_headers(resp503.raw_headers, rid_raw, name.encode("latin-1")), body503)
        self.metrics["inferctl_router_rejected_total"].labels("no_ready_replica").inc()
        self.access(rid, path, None, 503, t0, len(tried), reason)
        err = APIError(503, f"no ready replica to serve this request (tried {len(tried)}: "
                            f"{', '.join(sorted(tried)) or 'none ready'})", code="no_ready_replica",
                       err_type="service_unavailable_error",
                       headers={"Retry-After": str(self.config.retry_after_seconds), "x-request-id": rid})
        return Response(_dumps(err.body()), status_code=503, headers=err.headers, media_type="application/json")

    async def _relay(self, r: Replica, resp: UpstreamResponse, chunks: AsyncIterator[bytes], first: bytes, *,
                     rid: str, path: str, t0: float, attempts: int, reason: str | None,
                     charge: Callable[[int], None] | None = None) -> AsyncIterator[bytes]:
        """The upstream body, chunk by chunk; closes the upstream stream however it ends.
        ``charge`` gets the stream's tokens (:class:`UsageMeter`) however it ends.

        A stream the replica cuts after its first byte (never retried) ends as the engine ends a
        stream it fails itself (engine/entrypoints/sse.py): an SSE ``error`` event holding the OpenAI
        error object (502, ``upstream_stream_cut``), then ``data: [DONE]`` (after a blank line when
        the cut fell inside an event), so the client's library raises instead of taking the cut
        answer for a whole one (the ``openai`` client raises ``APIError`` on such an event)."""
        outcome = "disconnected"
        meter = UsageMeter(stream=True) if charge is not None else None
        tail = b""
        try:
            if first:
                if meter is not None:
                    meter.feed(first)
                tail = first[-2:]
                yield first
            async for chunk in chunks:
                if meter is not None:
                    meter.feed(chunk)
                if chunk:
                    tail = (tail + chunk)[-2:]
                yield chunk
            outcome = "complete"
        except UpstreamError as exc:
            outcome = "stream_error"
            self.metrics["inferctl_router_stream_errors_total"].labels(r.name).inc()
            log.warning("stream from %s cut after the first byte: %s", r.name, exc,
                        extra={"request_id": rid, "replica": r.name})
            yield stream_cut_events(r.name, tail)
        finally:
            with anyio.CancelScope(shield=True):
                await resp.close()
            self._inc_outstanding(r, -1)
            if meter is not None:
                charge(meter.tokens)
            if outcome == "disconnected":
                self.metrics["inferctl_router_client_disconnects_total"].labels(r.name).inc()
            self._child("inferctl_router_requests_total", r.name, str(resp.status)).inc()
            self.access(rid, path, r.name, resp.status, t0, attempts, reason, stream=outcome)


def stream_cut_events(replica: str, tail: bytes) -> bytes:
    """The bytes that end a stream ``replica`` cut (:meth:`Forwarder._relay`): a blank line unless the
    stream's last bytes (``tail``) already closed an event, the SSE ``error`` event, ``data: [DONE]``."""
    err = APIError(502, f"the replica {replica} cut the stream after it had started (the answer is incomplete; "
                        "it is not retried once bytes were sent)", code="upstream_stream_cut",
                   err_type="server_error")
    return (b"" if tail.endswith(b"\n\n") or not tail else b"\n\n") + b"data: " + _dumps(err.body()) \
        + b"\n\ndata: [DONE]\n\n"


def _outstanding(r: Replica) -> int:
    """``r.outstanding`` (the gauge's function: :meth:`Forwarder.__init__`)."""
    return r.outstanding


def _event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    """The answer is ``text/event-stream`` (its ``content-type`` among ASGI ``headers``; the media
    type in any case, RFC 9110 section 8.3.1)."""
    return any(k == b"content-type" and v[:17].lower() == b"text/event-stream" for k, v in headers)


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()
