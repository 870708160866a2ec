"""The engine server's shutdown: count in-flight requests, drain on SIGTERM/SIGINT, then exit 0.

Order on the first SIGTERM or SIGINT (:class:`GracefulServer`):

1. ``ServerState.stopping`` is set in the signal handler: ``/ready`` answers 503
   ``{"ready": false, "reason": "stopping"}`` at once and every new generation or tokenizer
   request gets 503 ``engine_draining`` with ``Retry-After`` (the listening socket stays open, so
   load balancers and the router see a fast, retryable refusal rather than a refused connection).
2. :func:`drain` waits for the in-flight requests (streams included) to finish, up to the grace
   period (``--shutdown-grace-seconds``). Past it, every request still open is aborted in its
   engine (KV blocks freed, ``finish_reason`` ``abort`` in ``/stats``) and its client gets the
   error: a stream ends with an SSE ``error`` event (``engine_unavailable``, the message names the
   grace period) then ``data: [DONE]``; a JSON request gets that 503. Nothing is dropped silently.
   The requests of an engine core process that does not answer (``--core-process``, readiness
   ``unresponsive``) are failed so at once: they could not finish within any grace period.
3. Then uvicorn's own shutdown runs: it closes the listening socket and idle keep-alive
   connections, waits for what is left (``flush_seconds`` at most), and the lifespan stops the
   engines' stepping threads. The process exits 0 (uvicorn's habit of re-raising the captured
   signal, which would exit by SIGTERM, is not kept).

Time from the signal to the exit: the drain (at most the grace period), then, only when requests
had to be aborted, up to ``flush_seconds`` for their errors to be written and up to as long
again in uvicorn's final wait, then the engines' stepping threads are joined (one step each).
A supervisor's kill timeout (Kubernetes ``terminationGracePeriodSeconds`` after preStop) should
exceed grace + 2 × flush (5 s each by default) + a few seconds.

A second signal during the drain exits at once (uvicorn's force exit): open requests are cut and
the exit code is 1 (:attr:`GracefulServer.forced`).

An engine core process (``--core-process``) that dies, or that its watchdog killed for answering
nothing, sets its ``fatal`` reason: the server then stops as on a signal (readiness 503, the
other models' in-flight requests drain; the dead core's already failed) and exits 1
(:attr:`GracefulServer.engine_failure`), so the supervisor that restarts a crashed engine
restarts this one too. The pattern is Kubernetes' pod termination
(kubernetes.io, "Pod Lifecycle: Termination of Pods"): the pod leaves the Service endpoints
when readiness fails, in-flight work gets ``terminationGracePeriodSeconds``.
"""

from __future__ import annotations

import asyncio
import logging
from types import FrameType
from typing import Any

import uvicorn

from inferctl.engine.entrypoints.state import ServerState

log = logging.getLogger(__name__)

#: Paths not counted as in-flight work: probes and scrapes (they must not hold a drain open).
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})
#: Default grace period (seconds) for in-flight requests after SIGTERM (``--shutdown-grace-seconds``).
DEFAULT_SHUTDOWN_GRACE_SECONDS = 30.0
#: Seconds the aborted requests get to write their error, and uvicorn's final wait for connections.
DEFAULT_FLUSH_SECONDS = 5.0


class InFlightMiddleware:
    """Pure ASGI middleware: ``state.in_flight`` = HTTP requests being answered, a stream until
    its last byte; :data:`PROBE_PATHS` are not counted."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1


async def drain(state: ServerState, grace_seconds: float, *, poll_seconds: float = 0.05,
                flush_seconds: float = DEFAULT_FLUSH_SECONDS) -> bool:
    """Stop admitting, wait for ``state.in_flight`` to reach 0 within ``grace_seconds``, else abort.

    Returns True when every request finished within the grace period; False when some had to be
    aborted (each open engine request fails with ``EngineDeadError`` naming the grace period,
    which the HTTP layer answers as 503 ``engine_unavailable``, an SSE error event in a stream);
    after an abort it waits up to ``flush_seconds`` for those answers to be written.
    Raises ValueError for a negative grace or flush time.
    """
    if not grace_seconds >= 0 or not flush_seconds >= 0:
        raise ValueError(f"grace_seconds and flush_seconds must be >= 0, got {grace_seconds}, {flush_seconds}")
    state.stopping = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_seconds
    log.info("draining: %d request(s) in flight, grace period %.3g s", state.in_flight, grace_seconds)
    failed: set[str] = set()
    while state.in_flight > 0 and loop.time() < deadline:
        _fail_unresponsive(state, failed)
        await asyncio.sleep(poll_seconds)
    if state.in_flight == 0:
        if failed:
            log.warning("drained: the requests of %s were failed (its engine core does not answer)",
                        ", ".join(sorted(failed)))
            return False
        log.info("drained: every in-flight request finished")
        return True
    message = (f"the engine is shutting down and its shutdown grace period ({grace_seconds:g} s) ran out "
               "before this request finished; the request was aborted, retry it")
    aborted = sum(served.async_engine.abort_all(message) for served in state.models.values())
    log.warning("shutdown grace period of %g s exceeded: %d request(s) in flight, %d engine request(s) aborted",
                grace_seconds, state.in_flight, aborted)
    flush_deadline = loop.time() + flush_seconds
    while state.in_flight > 0 and loop.time() < flush_deadline:
        await asyncio.sleep(poll_seconds)
    return False


def _fail_unresponsive(state: ServerState, failed: set[str]) -> None:
    """Fail at once the open requests of each model whose engine core process does not answer
    (``CoreClient.responsive`` false): they cannot finish within any grace period, and waiting for
    them would only delay the stop. ``failed`` collects the models already failed."""
    for name, served in state.models.items():
        if name in failed or getattr(served.async_engine, "responsive", True) is not False:
            continue
        failed.add(name)
        n = served.async_engine.abort_all(f"the engine core of {name} does not answer and the server is stopping; "
                                          "the request was aborted, retry it")
        log.warning("stopping: the engine core of %s does not answer: %d open request(s) failed now", name, n)


class GracefulServer(uvicorn.Server):
    """uvicorn's server with a drain before its shutdown (see the module docstring).

    ``config.timeout_graceful_shutdown`` is uvicorn's last wait after the drain (seconds).
    ``drained`` is True/False once :func:`drain` ran (False: requests were aborted), ``forced``
    True after a second signal.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState,
                 grace_seconds: float = DEFAULT_SHUTDOWN_GRACE_SECONDS,
                 flush_seconds: float = DEFAULT_FLUSH_SECONDS) -> None:
        super().__init__(config)
        self.state = state
        self.grace_seconds = float(grace_seconds)
        self.flush_seconds = float(flush_seconds)
        self.signalled = False
        self.forced = False
        self.drained: bool | None = None
        #: ``"<model>: <why>"`` once an engine core process died (the server then stops, exit 1)
        self.engine_failure: str | None = None
        self._drain_task: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler: the first signal starts the drain, a second one forces the exit.
        (Nothing here logs or touches the loop: it runs between two bytecodes of the loop.)"""
        if self.signalled:
            self.forced = True
            self.force_exit = True
            self.should_exit = True
            return
        self.signalled = True
        self.state.stopping = True

    def _check_engines(self) -> None:
        for served in self.state.models.values():
            fatal = getattr(served.async_engine, "fatal", None)
            if isinstance(fatal, str) and fatal:
                self.engine_failure = f"{served.name}: {fatal}"
                log.error("the engine of %s failed (%s): stopping the server (exit 1) for its supervisor to "
                          "restart it", served.name, fatal)
                self.signalled = True
                self.state.stopping = True
                return

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's 0.1 s tick: start the drain after a signal or an engine core's death, exit
        once it is done."""
        if self.engine_failure is None and not self.should_exit:
            self._check_engines()
        if self.signalled and self._drain_task is None and not self.should_exit:
            log.info("%s: readiness is now 503, draining",
                     "stop signal received" if self.engine_failure is None else "stopping after the engine failure")
            self._drain_task = asyncio.ensure_future(
                drain(self.state, self.grace_seconds, flush_seconds=self.flush_seconds))
        if self._drain_task is not None and self._drain_task.done() and not self.should_exit:
            try:
                self.drained = self._drain_task.result()
            except Exception:  # noqa: BLE001 - never keep a stopping server alive
                log.exception("the drain failed; shutting down anyway")
                self.drained = False
            self.should_exit = True
        if self.forced:
            log.warning("second stop signal: exiting now, in-flight requests are cut")
        return await super().on_tick(counter)
