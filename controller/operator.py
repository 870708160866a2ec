"""Operator actions: what ``inferctl degrade|rollback|drain|undrain|restart|reset-gpu|unpin|
release-gpu`` and ``POST /actions/...`` run, synchronously, with the policies told first.

The policies are found by what they can do, not by name: the engine policy with
``operator_switch`` follows a manual degrade/rollback, the one with ``unpin`` releases its pin,
the GPU policy with ``release`` releases an isolated GPU.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from inferctl.contract.precision import MODE_FOR_ACTION
from inferctl.controller.actions import ActionResult, Actions
from inferctl.controller.dispatch import Dispatcher
from inferctl.controller.events import EventLog, json_safe
from inferctl.controller.exporter import Exporter
from inferctl.controller.reset import RELEASE_ACTION, lost_evidence
from inferctl.controller.state import ControllerState
from inferctl.controller.types import Decision

#: engine actions an operator may run (POST /actions/<name>, inferctl <name>)
MANUAL_ACTIONS = ("degrade", "rollback", "drain", "undrain", "restart")


class ReleaseRefused(RuntimeError):
    """An operator's GPU release that is refused (nothing to release, or the GPU source does not
    show the GPU back); the message says why."""


def _with(policies: Mapping[str, Any], method: str) -> tuple[str, Any] | tuple[None, None]:
    """The first policy (name, object) of ``policies`` that has ``method``."""
    for name, pol in policies.items():
        if callable(getattr(pol, method, None)):
            return name, pol
    return None, None


class OperatorActions:
    """The operator entry points over the controller's parts (all given at construction).

    ``poll_engine(name, force=True)`` and ``poll_gpu(force=True)`` are the loop's forced polls
    (an engine poll also reconciles); ``export_policies(now)`` refreshes the policy gauges.
    """

    def __init__(self, *, engines: Mapping[str, Any], policies: Mapping[str, Mapping[str, Any]],
                 gpu_policies: Mapping[str, Any], actions: Actions, dispatcher: Dispatcher,
                 state: ControllerState, exporter: Exporter, event_log: EventLog, resetter: Any,
                 poll_engine: Callable[..., Any], poll_gpu: Callable[..., Any],
                 export_policies: Callable[[float], None], clock: Callable[[], float]) -> None:
        self.engines = engines
        self.policies = policies
        self.gpu_policies = gpu_policies
        self.actions = actions
        self.dispatcher = dispatcher
        self.state = state
        self.exporter = exporter
        self.event_log = event_log
        self.resetter = resetter
        self.poll_engine = poll_engine
        self.poll_gpu = poll_gpu
        self.export_policies = export_policies
        self.clock = clock

    def _tell(self, policy: str, engine: str, fn: Callable[[float], list[Decision]]) -> None:
        """Run a policy call at the current time under the state lock and handle its decisions."""
        with self.state.lock:
            now = self.clock()
            for follow in self.dispatcher.safe(policy, engine, lambda: fn(now)):
                self.dispatcher.handle(follow, now)

    def manual(self, action: str, engine: str, actor: str = "operator", force: bool = False) -> ActionResult:
        """Run an operator action now (synchronously). Raises ``KeyError`` for an unknown
        engine and ``ValueError`` for an unknown action. ``force`` (restart only): skip the fleet
        rails (controller/fleet.py: max_unavailable, the last ready replica with work).

        For ``degrade``/``rollback`` the engine policy with ``operator_switch(now, mode, who)``
        (the precision policy) is told first; without one the policy sees the change in the
        next poll (it adopts a manual int8 and rolls back after its hold, and re-applies int8
        after a manual rollback while it holds int8)."""
        if engine not in self.engines:
            raise KeyError(engine)
        if action not in MANUAL_ACTIONS:
            raise ValueError(f"action: {action!r} is not one of {', '.join(MANUAL_ACTIONS)}")
        d = Decision(actor, engine, action, None, None, f"{action} requested by {actor}"
                     + (" (forced)" if force else ""), {"force": True} if force else {})
        switch = action in MODE_FOR_ACTION
        name, pol = _with(self.policies.get(engine, {}), "operator_switch") if switch else (None, None)
        if pol is not None:
            # tell the policy first, so it does not undo the operator's switch
            mode = MODE_FOR_ACTION[action]
            self._tell(name, engine, lambda now: pol.operator_switch(now, mode, actor))
        res = self.actions.execute(d)
        if pol is not None and res is not None and not res.ok:
            # the operator's switch failed: the policy returns to where it was (its own rules)
            report = getattr(pol, "record_action_result", None)
            if report is not None:
                self._tell(name, engine, lambda now: report(now, action, False, res.message))
        self.poll_engine(engine, force=True)
        return res

    def reset_gpu(self, gpu: int, dry_run: bool | None = None, actor: str = "operator") -> ActionResult:
        """Operator GPU reset through the rails."""
        d = Decision(actor, f"gpu:{gpu}", "reset_gpu", None, None, f"GPU reset requested by {actor}",
                     {"gpu": gpu, "dry_run": dry_run})
        return self.actions.execute(d, dry_run=dry_run)

    def unpin(self, engine: str, who: str = "operator") -> list[Decision]:
        """Release the precision flap guard's pin (the engine policy with ``unpin``). Raises
        ``KeyError`` (unknown engine or no such policy) or the policy's ``PolicyError`` (not
        pinned)."""
        _, pol = _with(self.policies.get(engine, {}), "unpin")
        if engine not in self.engines or pol is None:
            raise KeyError(engine)
        with self.state.lock:
            now = self.clock()
            decisions = pol.unpin(now, who)
            for d in decisions:
                self.dispatcher.handle(d, now)
            self.export_policies(now)
        return decisions

    def release_gpu(self, gpu_index: int, actor: str = "operator") -> dict:
        """Release GPU ``gpu_index`` after the node was rebooted or the GPU replaced: the
        GPU policy's ISOLATED entries with that index go back to HEALTHY
        (``HardwarePolicy.release``, their history cleared) and the reset rails forget their lost
        mark (``GpuResetter.forget_lost``). Recorded as one ``action`` event (source ``actor``,
        target ``gpu:N``, outcome ``{"gpu": N, "released": True}``) that a restarted controller's
        rails honour while no newer lost mark follows it.

        The GPU source is polled first: the release is refused when telemetry is down, when the
        source does not show GPU N, or when it shows GPU N lost now (``lost_evidence``: NVML
        GpuIsLost, health ``lost``, Xid 79) — a release never overrides current evidence.

        Returns ``{"ok": True, "action": "release_gpu", "target", "message", "event_id",
        "decisions"}``. Raises ``ValueError`` for a negative or non-integer ``gpu_index`` and
        :class:`ReleaseRefused` when the GPU is neither isolated nor marked lost, or when the
        GPU source does not show it present and not lost."""
        if isinstance(gpu_index, bool) or not isinstance(gpu_index, int) or gpu_index < 0:
            raise ValueError(f"gpu: must be a non-negative integer, got {gpu_index!r}")
        n = gpu_index
        _, hw = _with(self.gpu_policies, "release")
        is_lost = getattr(self.resetter, "is_lost", None)
        nothing = (f"GPU {n} is neither isolated by the hardware policy nor marked lost by the reset"
                   " rails: nothing to release")
        if not self._isolated_uuids(hw, n) and not (is_lost is not None and is_lost(n)):
            raise ReleaseRefused(nothing)
        snap = self._present_gpu(n)
        with self.state.lock:
            now = self.clock()
            decisions: list[Decision] = []
            for uuid in self._isolated_uuids(hw, n):
                decisions += hw.release(now, uuid, actor)
            rails = bool(is_lost is not None and is_lost(n) and self.resetter.forget_lost(n))
            if not decisions and not rails:
                raise ReleaseRefused(nothing)
            for d in decisions:
                self.dispatcher.handle(d, now)
            done = ([f"hardware policy: {len(decisions)} isolated entr{'y' if len(decisions) == 1 else 'ies'}"
                     " -> healthy"] if decisions else []) + (["reset rails: lost mark cleared"] if rails else [])
            message = (f"GPU {n} ({snap.uuid}) released by {actor} ({'; '.join(done)}): the source shows"
                       " it present and not lost")
            event_id = self.event_log.append(
                "action", actor, message, target=f"gpu:{n}", severity="warning", time=now,
                inputs={"gpu": n, "uuid": snap.uuid, "action": RELEASE_ACTION, "actor": actor,
                        "hardware_released": [d.target for d in decisions], "rails_lost_cleared": rails},
                outcome={"gpu": n, "released": True})
            self.export_policies(now)
        return {"ok": True, "action": RELEASE_ACTION, "target": f"gpu:{n}", "message": message,
                "event_id": event_id, "decisions": [json_safe(d) for d in decisions]}

    def _present_gpu(self, n: int) -> Any:
        """Poll the GPU source now: GPU ``n``'s snapshot when the source shows it present and not
        lost; else :class:`ReleaseRefused` saying why."""
        reading = self.poll_gpu(force=True)
        if reading is None or not getattr(reading, "ok", False):
            why = "no reading" if reading is None else (reading.error or "no detail")
            raise ReleaseRefused(f"GPU telemetry is down ({why}): cannot check that GPU {n} is back;"
                                 " nothing released")
        snap = next((s for s in reading.gpus.values() if s.index == n), None)
        if snap is None:
            raise ReleaseRefused(f"GPU {n} is not in the GPU source's reading ({reading.source}): it"
                                 " is not back; nothing released")
        evidence = lost_evidence(snap)
        if evidence is not None:
            raise ReleaseRefused(f"GPU {n} ({snap.uuid}) is lost now ({evidence}): a release does not"
                                 " override current evidence; drain the node and reboot it")
        return snap

    def _isolated_uuids(self, hw: Any, index: int) -> list[str]:
        """UUIDs of the GPU policy's GPUs with ``index`` (its own or, for a GPU it knows only
        by UUID, the last reading's) that are ISOLATED."""
        state = getattr(hw, "state", None)
        if state is None:
            return []
        gpus = (state(self.clock()) or {}).get("gpus") or {}
        return [u for u, g in gpus.items() if g.get("policy_state") == "isolated"
                and (g.get("index") if g.get("index") is not None else self.state.gpu_index_of(u)) == index]
