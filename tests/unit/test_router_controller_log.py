"""The router's log when the controller does not answer (router/probe.py, Prober.read_controller).

``inferctl up`` starts its router before the controller's API answers, and stops the controller
first: a fleet starting must not print a warning, a controller that never comes up or goes away
after answering must, and a reason with an empty message still names the exception's type."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from inferctl.router.config import EngineSpec
from inferctl.router.metrics import build_router_registry
from inferctl.router.probe import CONTROLLER_GRACE_FAILURES, Prober
from inferctl.router.replicas import ReplicaSet


def _run_reads(answers: list[bool]) -> tuple[Prober, list[logging.LogRecord]]:
    """Read the controller once per entry of ``answers`` (True: it answers /status, False: the
    connection fails with an empty message); the prober and its router.probe records."""
    state = {"i": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        ok = answers[state["i"]]
        state["i"] += 1
        if not ok:
            raise httpx.ConnectError("")
        return httpx.Response(200, json={"engines": {}})

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("inferctl.router.probe")
    keep, level = Keep(level=logging.DEBUG), logger.level
    logger.addHandler(keep)
    logger.setLevel(logging.DEBUG)

    async def go() -> Prober:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            replicas = ReplicaSet.from_specs((EngineSpec("a", "http://a.test"),))
            _reg, metrics = build_router_registry()
            prober = Prober(replicas, client, timeout=5, controller="http://ctl.test", metrics=metrics)
            for _ in answers:
                await prober.read_controller()
            return prober

    try:
        prober = asyncio.run(go())
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
    return prober, records


def _levels(records: list[logging.LogRecord]) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in records]


def test_a_controller_coming_up_after_the_router_is_not_a_warning():
    prober, records = _run_reads([False, False, True])
    assert prober.controller_ok is True
    assert [lvl for lvl, _ in _levels(records)] == [logging.INFO]
    assert "ConnectError" in records[0].getMessage()      # an empty message names the type, not "()"


def test_a_controller_that_never_answers_warns_once_after_the_grace():
    prober, records = _run_reads([False] * (CONTROLLER_GRACE_FAILURES + 3))
    warnings = [m for lvl, m in _levels(records) if lvl == logging.WARNING]
    assert len(warnings) == 1 and f"not answered {CONTROLLER_GRACE_FAILURES} reads" in warnings[0]
    assert prober.controller_ok is False
    assert prober.metrics["inferctl_router_controller_up"]._value.get() == 0


@pytest.mark.parametrize("failures", [1, CONTROLLER_GRACE_FAILURES + 2])
def test_a_controller_lost_after_answering_warns_at_once_and_once(failures):
    _prober, records = _run_reads([True] + [False] * failures)
    warnings = [m for lvl, m in _levels(records) if lvl == logging.WARNING]
    assert len(warnings) == 1 and "keeping its last known view" in warnings[0]
