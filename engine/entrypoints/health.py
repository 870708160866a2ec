"""Health, stats, metrics and the model list: ``GET /health``, ``/stats``, ``/metrics``, ``/v1/models``.

* ``/health`` — always 200 while the process serves: ``{"status": "ok"|"degraded"|"draining",
  "precision": <main model's mode>, "models": {...}, "routes": {...}, "instance_id": <uuid4 hex>}``.
  ``instance_id`` is made once at the process's start (also ``engine.instance_id`` in
  ``/stats``): a changed id proves a restart (a failed poll does not). ``degraded`` while
  any served model runs int8, a route sends one model's traffic to another, or an engine's
  stepping thread is not running; ``draining`` wins over both.
* ``/ready`` — readiness (Kubernetes readinessProbe, the router): 200 ``{"ready": true,
  "status": <the /health status>, "model": <default>, "models": {name: {"ready", "reason"}}}``
  when a request for the default model would be admitted; 503 ``{"ready": false, "reason":
  "starting"|"draining"|"stopping"|"unresponsive", ...}`` with ``Retry-After`` (seconds) otherwise
  (:meth:`~inferctl.engine.entrypoints.state.ServerState.readiness`). Readiness follows the
  main (default) model and the model serving it after a route: draining only the light model
  leaves the server ready, and ``models`` shows it. Liveness is ``/health``, never ``/ready``.
* ``/stats[?model=NAME]`` — the engine's ``stats()`` document (docs/architecture.md), strictly
  valid JSON; ``engine.models`` lists the served set and ``routes`` the active routes. With more
  than one served model, ``latency_histograms_by_model`` gives every served model's
  ``requests.latency_histograms`` by name (a controller reads the latency breaker's per-model
  TTFT from one ``GET /stats``, without ``/metrics``); a model whose engine core process is
  gone or silent is left out of it (no data). With ``--core-process``, a dead core's document
  holds only ``engine.core_process`` (``alive: false``, ``exit_code``, ``error``) and
  ``engine.step_thread_alive: false``; a live core that does not answer in time is a 503.
* ``/metrics`` — Prometheus text of the engine registries, merged (:class:`MergedCollector`).
  An engine core process's families are fetched first, within a few seconds; a core that is
  gone or too slow has none (no data) and ``inferctl_engine_core_process_up{model}`` 0.
* ``/v1/models`` — the served models (never the route table); each card has ``max_model_len``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from inferctl.contract.openai import ModelCard, ModelList
from inferctl.contract.openapi import Param, route_doc
from inferctl.engine.async_engine import EngineDeadError
from inferctl.engine.entrypoints.errors import unavailable
from inferctl.engine.entrypoints.sse import json_response
from inferctl.engine.entrypoints.state import ServerState, server_state

State = Annotated[ServerState, Depends(server_state)]
#: The documented shapes of ``/health`` and ``/ready`` (their OpenAPI schemas).
HEALTH_SCHEMA = {"type": "object", "required": ["status", "precision", "models", "routes", "instance_id"],
                 "properties": {"status": {"enum": ["ok", "degraded", "draining"]}, "precision": {"type": "string"},
                                "models": {"type": "object"}, "routes": {"type": "object"},
                                "instance_id": {"type": "string"}}}
READY_SCHEMA = {"type": "object", "required": ["ready", "status", "model", "models"],
                "properties": {"ready": {"type": "boolean"},
                               "reason": {"enum": ["starting", "draining", "stopping", "unresponsive"]},
                               "status": {"type": "string"}, "model": {"type": "string"}, "models": {"type": "object"}}}
log = logging.getLogger(__name__)
router = APIRouter()


def health_document(state: ServerState) -> dict:
    """The ``/health`` document (see the module docstring for the status rule)."""
    per_model = {}
    for name, served in state.models.items():
        per_model[name] = {"precision": served.precision(), "draining": bool(state.draining.get(name)),
                           "engine_running": bool(served.async_engine.is_running)}
    main = per_model[state.default_model]
    if any(m["draining"] for m in per_model.values()):
        status = "draining"
    elif (any(m["precision"] == "int8" or not m["engine_running"] for m in per_model.values())
          or state.routes):
        status = "degraded"
    else:
        status = "ok"
    return {"status": status, "precision": main["precision"], "models": per_model, "routes": dict(state.routes),
            "instance_id": state.instance_id}


@router.get("/health", **route_doc(response_schema=HEALTH_SCHEMA))
async def health(state: State) -> Response:
    """Liveness and the serving mode (never an error while the process serves)."""
    return json_response(health_document(state))


def ready_document(state: ServerState) -> tuple[bool, dict]:
    """``(ready, the /ready document)`` (see the module docstring)."""
    ready, reason = state.readiness()
    per_model = {}
    for name, served in state.models.items():
        why = state.not_ready_reason(served)
        per_model[name] = {"ready": why is None, "reason": why}
    doc: dict = {"ready": ready}
    if not ready:
        doc["reason"] = reason
    doc.update(status=health_document(state)["status"], model=state.default_model, models=per_model)
    return ready, doc


@router.get("/ready", **route_doc(response_schema=READY_SCHEMA, errors=(503,), extra={
    503: {"content": {"application/json": {"schema": READY_SCHEMA}}}}))
async def ready(state: State) -> Response:
    """Readiness: 200 when the default model admits requests, else 503 with ``Retry-After``."""
    is_ready, doc = ready_document(state)
    if is_ready:
        return json_response(doc)
    return json_response(doc, status=503, headers={"Retry-After": str(state.retry_after_seconds)})


@router.get("/stats", **route_doc(response_schema={"type": "object", "required": ["engine"]}, errors=(404, 503),
                                  params=[Param("model", {"type": "string"}, "a served model (default: main)")]))
async def stats(request: Request, state: State) -> Response:
    """The named (default: main) model's ``/stats`` document; 404 for an unknown model."""
    served = state.lookup(request.query_params.get("model"))
    try:
        doc = await served.stats()
    except TimeoutError as exc:
        raise unavailable("engine_unavailable", f"model {served.name!r}: {exc}", state.retry_after_seconds) from None
    doc = dict(doc) if isinstance(doc, dict) else {"engine": {}}
    engine_part = dict(doc.get("engine") or {})
    engine_part["model"] = served.name
    engine_part["models"] = sorted(state.models)
    engine_part["instance_id"] = state.instance_id
    engine_part["draining"] = bool(state.draining.get(served.name, engine_part.get("draining", False)))
    doc["engine"] = engine_part
    doc["routes"] = dict(state.routes)
    if len(state.models) > 1:
        by_model = {}
        for name, other in state.models.items():
            try:
                by_model[name] = await other.latency_histograms()
            except (EngineDeadError, TimeoutError) as exc:   # that model's are no data; the rest stand
                log.warning("latency histograms of %s not read: %s", name, exc)
        doc["latency_histograms_by_model"] = by_model
    return json_response(doc)


@router.get("/metrics", **route_doc(metrics=True))
async def metrics(state: State) -> Response:
    """Prometheus text exposition of every served engine's registry, merged."""
    for served in state.models.values():
        refresh = getattr(served.async_engine, "refresh_metrics", None)
        if refresh is not None:   # an engine core process: fetch its families first
            try:
                await refresh()
            except Exception as exc:  # noqa: BLE001 - a dead or silent core: its series absent, up 0
                log.warning("metrics of %s not refreshed: %s", served.name, exc)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedCollector(state))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", **route_doc(response=ModelList))
async def models(state: State) -> Response:
    """The OpenAI model list: one card per served model."""
    created = int(state.started)
    cards = [ModelCard(id=name, created=created, max_model_len=m.max_model_len).model_dump()
             for name, m in state.models.items()]
    return json_response(ModelList(data=cards).model_dump())


class MergedCollector:
    """Collects every served engine's registry into one exposition.

    Families are merged by name. Samples carrying a ``model`` label come from every engine
    (their label values are the served names, so they never collide); samples without one
    (process-level gauges and counters: KV blocks, memory, queue) come from the default
    model's engine only, so the output never has duplicate series. The light model's are in
    ``/stats?model=<light>``.
    """

    def __init__(self, state: ServerState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        """The merged metric families (prometheus-client's collector protocol)."""
        order = [self._state.default_model] + [n for n in self._state.models if n != self._state.default_model]
        families: dict[str, Metric] = {}
        seen: set = set()
        for rank, name in enumerate(order):
            registry = self._state.models[name].registry
            if registry is None:
                continue
            for fam in registry.collect():
                merged = families.get(fam.name)
                if merged is None:
                    merged = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                    families[fam.name] = merged
                for sample in fam.samples:
                    if rank > 0 and "model" not in sample.labels:
                        continue
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key in seen:
                        continue
                    seen.add(key)
                    merged.samples.append(sample)
        yield from families.values()
