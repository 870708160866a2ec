"""The router's view of its replicas, refreshed every ``--probe-interval`` seconds.

Per replica, concurrently, each round:

* ``GET /ready`` — 200 → ready; 503 → not ready, ``reason`` from the body (``starting``,
  ``draining``, ``stopping``); another status → not ready (``http_<status>``); a connect
  error or timeout → ``down``. An engine without ``/ready`` (404) is judged by ``GET
  /health``: 200 with ``status`` other than ``draining`` → ready.
* ``GET /stats`` (ready replicas) — ``kv_cache.usage_ratio`` and ``scheduler.waiting`` for
  the load score; a failed read leaves them None (no data), it does not change readiness.
* ``GET /v1/models`` (ready replicas whose list is not known yet, and every
  :data:`MODELS_EVERY` rounds) — the served names.

With ``--controller URL``, ``GET URL/status`` each round: an engine the controller reports
``draining``, or with a ``state``/``lifecycle`` in :data:`BLOCKING_STATES` (or ``routable:
false``) is blocked. ``up: false`` alone is not: it means the controller's last poll of the
engine failed (on a busy machine a poll times out while the engine serves), and blocking on it
once took every replica of a loaded fleet out of rotation (217 requests answered 503 in a fleet
test); whether a replica answers is this prober's own ``/ready`` verdict. Engines are matched by
URL, then by name. When the controller cannot be read the last known view is kept
(``inferctl_router_controller_up`` 0).

With ``api_key`` (the replicas' ``--api-key``, ``--upstream-api-key-env``), every request to a
replica carries ``Authorization: Bearer <key>``: an engine guards ``/v1/*`` (``/v1/models``) with
it and leaves ``/ready``, ``/health``, ``/stats`` open, other servers may guard more. The
controller's ``/status`` never gets it (another service, another secret).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from collections.abc import Awaitable, Callable

import httpx

from inferctl.router.replicas import Replica, ReplicaSet

log = logging.getLogger(__name__)

#: Controller engine states that keep traffic away.
BLOCKING_STATES = frozenset({"draining", "isolated", "restarting", "stopping", "starting", "down", "stopped",
                             "resetting"})
#: Re-read each ready replica's model list every this many rounds.
MODELS_EVERY = 10
#: failed controller reads in a row, before it ever answered, after which the router warns (one probe
#: round each: ~5 s at the default interval); earlier failures log at INFO, as ``inferctl up`` starts
#: its router before the controller's API answers
CONTROLLER_GRACE_FAILURES = 5


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


#: transport failures that mean "no engine answers there" (reason ``down``); any other httpx error is ``error``
_DOWN_ERRORS = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)


class Prober:
    """Refreshes a :class:`ReplicaSet` (and the ready gauges) from the replicas and the controller.

    ``client``: the shared httpx.AsyncClient; ``timeout``: one probe's deadline (s);
    ``controller``: the controller's base URL or None; ``metrics``: the router registry's
    metrics dict (catalog name → metric); ``api_key``: the replicas' API key or None.
    """

    def __init__(self, replicas: ReplicaSet, client: httpx.AsyncClient, *, timeout: float,
                 controller: str | None, metrics: dict, api_key: str | None = None) -> None:
        self.replicas = replicas
        self.client = client
        self.timeout = timeout
        self.controller = controller.rstrip("/") if controller else None
        self.metrics = metrics
        self.rounds = 0
        self.controller_ok: bool | None = None
        self._ctl_answered = False   # the controller has answered once (since the start)
        self._ctl_failures = 0       # failed reads in a row
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else None

    async def round(self) -> None:
        """One probe round over every replica (and the controller), then the gauges."""
        jobs = [self.probe(r) for r in self.replicas]
        if self.controller:
            jobs.append(self.read_controller())
        await asyncio.gather(*jobs)
        self.rounds += 1
        self.update_gauges()

    async def run(self, interval: float, after: Callable[[], Awaitable[None]] | None = None) -> None:
        """Probe rounds every ``interval`` seconds until cancelled (errors logged, never raised);
        ``after`` (the HAProxy data plane's sync, :mod:`inferctl.router.dataplane`) is awaited after
        each round, its errors logged the same way."""
        while True:
            started = time.monotonic()
            try:
                await self.round()
            except Exception:  # a probe bug must not stop routing
                log.exception("probe round failed")
            if after is not None:
                try:
                    await after()
                except Exception:
                    log.exception("data plane sync failed")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    def update_gauges(self) -> None:
        """``inferctl_router_replica_ready``, ``_replicas_ready`` (``_outstanding_requests`` is read
        from each replica when scraped: :class:`~inferctl.router.proxy.Forwarder`)."""
        for r in self.replicas:
            self.metrics["inferctl_router_replica_ready"].labels(r.name).set(1 if r.routable else 0)
        self.metrics["inferctl_router_replicas_ready"].set(len(self.replicas.routable()))

    async def _get(self, url: str, replica: bool = True) -> httpx.Response:
        """GET ``url`` within the probe deadline; a replica's URL with the API key (if any)."""
        return await self.client.get(url, timeout=self.timeout, headers=self._auth if replica else None)

    async def probe(self, r: Replica) -> None:
        """Readiness, then load and models of one replica (module docstring)."""
        was = r.ready
        r.ready, r.reason = await self.readiness(r)
        r.last_probe = time.time()
        if r.ready != was:
            log.info("replica %s is %s", r.name, "ready" if r.ready else f"not ready ({r.reason})",
                     extra={"replica": r.name, "ready": r.ready, "reason": r.reason})
        if not r.ready:
            r.waiting = r.kv_usage_ratio = None
            return
        await self.read_stats(r)
        if r.models is None or self.rounds % MODELS_EVERY == 0:
            await self.read_models(r)

    async def readiness(self, r: Replica) -> tuple[bool, str | None]:
        """``(ready, reason)`` from ``/ready``, or ``/health`` when ``/ready`` is 404."""
        try:
            resp = await self._get(r.url + "/ready")
            if resp.status_code == 404:
                resp = await self._get(r.url + "/health")
                if resp.status_code != 200:
                    return False, f"http_{resp.status_code}"
                status = _json(resp).get("status")
                return (False, "draining") if status == "draining" else (True, None)
        except httpx.HTTPError as exc:
            # refused, timed out, reset, or closed without an answer (a reused keep-alive connection
            # to a process that was killed reads EOF: RemoteProtocolError): the replica is down
            return False, "down" if isinstance(exc, _DOWN_ERRORS) else "error"
        if resp.status_code == 200:
            return True, None
        reason = _json(resp).get("reason")
        return False, str(reason) if reason else f"http_{resp.status_code}"

    async def read_stats(self, r: Replica) -> None:
        """``waiting`` and ``kv_usage_ratio`` from ``/stats`` (None when unreadable)."""
        try:
            doc = _json(await self._get(r.url + "/stats"))
        except httpx.HTTPError:
            doc = {}
        kv = doc.get("kv_cache") if isinstance(doc.get("kv_cache"), dict) else {}
        sched = doc.get("scheduler") if isinstance(doc.get("scheduler"), dict) else {}
        r.kv_usage_ratio = _num(kv.get("usage_ratio"))
        waiting = _num(sched.get("waiting"))
        r.waiting = None if waiting is None else int(waiting)

    async def read_models(self, r: Replica) -> None:
        """``models`` from ``/v1/models`` (unchanged when unreadable)."""
        try:
            doc = _json(await self._get(r.url + "/v1/models"))
        except httpx.HTTPError:
            return
        data = doc.get("data")
        if isinstance(data, list):
            r.models = frozenset(str(c["id"]) for c in data if isinstance(c, dict) and "id" in c)

    async def read_controller(self) -> None:
        """Block the engines the controller keeps away; keep the last view on failure."""
        try:
            resp = await self._get(self.controller + "/status", replica=False)
            resp.raise_for_status()
            engines = resp.json().get("engines")
            if not isinstance(engines, dict):
                raise ValueError("/status has no engines object")
        except (httpx.HTTPError, ValueError) as exc:
            reason = str(exc) or type(exc).__name__
            self._ctl_failures += 1
            if self._ctl_failures == CONTROLLER_GRACE_FAILURES and not self._ctl_answered:
                log.warning("controller unreachable (%s): it has not answered %d reads since the start; "
                            "routing on the replicas' own readiness", reason, self._ctl_failures)
            elif self.controller_ok is None:   # a fleet starting: the controller may come up after us
                log.info("controller not answering yet (%s): routing on the replicas' own readiness", reason)
            elif self.controller_ok:
                log.warning("controller unreachable (%s): keeping its last known view", reason)
            self.controller_ok = False
            self.metrics["inferctl_router_controller_up"].set(0)
            return
        self.controller_ok = self._ctl_answered = True
        self._ctl_failures = 0
        self.metrics["inferctl_router_controller_up"].set(1)
        by_url = {str(e.get("url") or "").rstrip("/"): e for e in engines.values() if isinstance(e, dict)}
        for r in self.replicas:
            entry = by_url.get(r.url) or engines.get(r.name)
            r.blocked = controller_block(entry) if isinstance(entry, dict) else None


def controller_block(entry: dict) -> str | None:
    """The reason the controller's engine entry keeps traffic away, or None (module docstring)."""
    for key in ("state", "lifecycle"):
        value = entry.get(key)
        if isinstance(value, str) and value in BLOCKING_STATES:
            return value
    if entry.get("routable") is False:
        return "not_routable"
    if entry.get("draining") is True:
        return "draining"
    return None   # ``up: false`` alone (the controller's poll failed) is not a block: /ready judges


def _json(resp: httpx.Response) -> dict:
    try:
        doc = resp.json()
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
