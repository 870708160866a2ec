"""GPU reset with rails: ``nvidia-smi --gpu-reset -i N``, never through a shell.

NVML has no reset call, so the reset goes through ``nvidia-smi`` (it needs root and no
process on the device; NVIDIA does not guarantee it and says to verify health afterwards:
nvidia-smi(1), "-r, --gpu-reset"). Every command is an argv list run with
``subprocess.run(argv, shell=False, timeout=...)``.

The flow of :meth:`GpuResetter.reset`, each step an event (kind ``step``, source
``gpu_reset``, target ``gpu:N``) and the result one ``action`` or ``refusal`` event:

1. Rails: never a simulated GPU; one reset at a time (a lock; a concurrent call is refused), at most one reset per
   GPU per ``min_interval_seconds`` (default 1800 s; refused with the time left; attempts
   are read back from the event log, so the limit survives a controller restart), a GPU
   once seen lost is never reset again — until an operator releases it after the node was
   rebooted or the GPU replaced (``inferctl release-gpu N``, :meth:`GpuResetter.forget_lost`).
2. Preconditions through the GPU source: the GPU index is known and telemetry works; a lost
   GPU (fell off the bus, NVML ``GpuIsLost``) is refused and escalated: a reset cannot help,
   the node must be drained and rebooted (Xid 79).
3. Preconditions through ``nvidia-smi``: no compute process on the GPU other than the PIDs
   we own (``allowed_pids``) — foreign processes are refused, naming the PIDs; persistence
   mode is read (``--query-gpu=persistence_mode``).
4. Dry run stops here and runs nothing: the refusal checks of 1–2 are made from the GPU
   source only, and the argv lists that would run are returned.
5. Persistence mode, if enabled, is disabled (``-i N -pm 0``: the persistence daemon holds
   the device, and the reset says "In use by another client", NVIDIA/NVSentinel#1690) and is
   restored (``-i N -pm 1``) afterwards on every path: success, failure, exception.
6. ``nvidia-smi --gpu-reset -i N``: exit 0 with "was successfully reset." → reset ran;
   exit 255 / "In use by another client" → failed; exit 15 / "GPU is lost" → failed, the
   GPU is marked lost and the failure escalated (critical). nvidia-smi(1) RETURN VALUE:
   15 = GPU is lost, 255 = other error.
7. Verification through the GPU source: the GPU is present, not lost, its memory readable
   (``memory_total_bytes`` not None). The outcome is ``success`` only when verified; a GPU
   the source shows lost after the reset fails and is escalated like exit 15.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from inferctl.controller.events import EventLog
from inferctl.controller.types import GpuReading, GpuSnapshot

OUTCOMES = ("success", "failed", "refused", "dry_run")
SOURCE = "gpu_reset"
#: ``action`` of the operator's release event (``Controller.release_gpu``): kind ``action``,
#: source the operator, target ``gpu:N``, outcome ``{"gpu": N, "released": True}``.
RELEASE_ACTION = "release_gpu"
EXIT_GPU_IS_LOST = 15      # nvidia-smi(1) RETURN VALUE
EXIT_OTHER_ERROR = 255


@dataclass
class ResetOutcome:
    """The result of one reset request.

    ``outcome`` is one of :data:`OUTCOMES`; ``steps`` the commands run (or, in a dry run,
    planned), each ``{"step", "argv", "returncode", "output", "ok"}``; ``retry_after_seconds``
    is set when refused by the rate limit; ``escalated`` when a person must act (lost GPU).
    """

    outcome: str
    message: str
    gpu: int
    steps: list[dict] = field(default_factory=list)
    escalated: bool = False
    retry_after_seconds: float | None = None
    event_id: int | None = None


class GpuResetter:
    """Resets one GPU at a time with rails (see the module docstring for the flow).

    Args:
        nvidia_smi: the program (name on PATH or absolute path), argv[0] of every command.
        gpu_source: any object with ``poll(now) -> GpuReading`` (controller/gpu).
        event_log: where every step and the outcome are recorded.
        min_interval_seconds: least time between two reset attempts on one GPU (≥ 0).
        dry_run: default for :meth:`reset` when its ``dry_run`` is None.
        allowed_pids: returns the PIDs allowed on the GPU (processes the controller owns).
        command_timeout_seconds: timeout of each nvidia-smi call.
        verify_attempts, verify_interval_seconds: polls of the GPU source after a reset.
        metrics: controller metrics; ``inferctl_gpu_resets_total{gpu,outcome}`` is counted.
        clock, sleep: time source and sleeper (injected by tests).

    Raises:
        ValueError: a negative interval/timeout or ``verify_attempts`` < 1.
    """

    def __init__(self, nvidia_smi: str = "nvidia-smi", gpu_source: Any = None,
                 event_log: EventLog | None = None, min_interval_seconds: float = 1800.0,
                 dry_run: bool = False, allowed_pids: Callable[[], Iterable[int]] | None = None,
                 command_timeout_seconds: float = 120.0, verify_attempts: int = 3,
                 verify_interval_seconds: float = 2.0, metrics: dict | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if min_interval_seconds < 0:
            raise ValueError(f"min_interval_seconds: must be >= 0, got {min_interval_seconds}")
        if command_timeout_seconds <= 0:
            raise ValueError(f"command_timeout_seconds: must be > 0, got {command_timeout_seconds}")
        if verify_attempts < 1:
            raise ValueError(f"verify_attempts: must be >= 1, got {verify_attempts}")
        if gpu_source is None:
            raise ValueError("gpu_source: required (verification reads the GPU through it)")
        self.nvidia_smi = nvidia_smi
        self.gpu_source = gpu_source
        self.event_log = event_log
        self.min_interval_seconds = float(min_interval_seconds)
        self.dry_run = dry_run
        self.allowed_pids = allowed_pids or (lambda: ())
        self.command_timeout_seconds = float(command_timeout_seconds)
        self.verify_attempts = verify_attempts
        self.verify_interval_seconds = verify_interval_seconds
        self.metrics = metrics
        self.clock = clock
        self.sleep = sleep
        # one reset at a time: held by reset() and, around a whole drain → reset → restart, by
        # reserve(); re-entrant so that the reserving thread's own reset() goes through
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0
        self._in_progress: int | None = None
        self._last_attempt: dict[int, float] = {}
        self._lost: set[int] = set()
        self._known: set[int] = set()     # GPU indices the source has shown (metric labels)
        self._load_history()

    # ------------------------------------------------------------------ public
    def state(self) -> dict:
        """JSON-able rails state: last attempt time per GPU, GPUs known lost, reset in progress."""
        return {"in_progress": self._in_progress,
                "last_attempt": {str(k): v for k, v in sorted(self._last_attempt.items())},
                "lost": sorted(self._lost), "dry_run": self.dry_run,
                "min_interval_seconds": self.min_interval_seconds}

    def reset(self, gpu_index: int, *, reason: str, dry_run: bool | None = None,
              actor: str = "controller") -> ResetOutcome:
        """Reset GPU ``gpu_index`` (the index nvidia-smi and the GPU source use).

        Never raises for device trouble: every failure is an outcome. Raises ``ValueError``
        only for a negative or non-integer ``gpu_index``.
        """
        if isinstance(gpu_index, bool) or not isinstance(gpu_index, int) or gpu_index < 0:
            raise ValueError(f"gpu: must be a non-negative integer, got {gpu_index!r}")
        dry = self.dry_run if dry_run is None else bool(dry_run)
        run = _Run(self, gpu_index, reason, dry, actor)
        if not self._acquire(gpu_index):
            return run.finish("refused", self._busy_message())
        try:
            return self._reset_locked(run)
        except Exception as exc:  # an unexpected bug must not escape the control loop
            return run.finish("failed", f"reset aborted by an internal error: {exc!r}")
        finally:
            self._release()

    @contextmanager
    def reserve(self, gpu_index: int) -> Iterator[bool]:
        """Hold the one-reset-at-a-time rail around a reset the caller prepares and finishes
        itself (drain and stop the GPU's engines, :meth:`reset`, start them again), so that a
        concurrent reset is refused before it touches any engine. Yields False — holding
        nothing — when another reset (or its preparation) is in progress; the caller then
        refuses with :meth:`refuse`. The holding thread's own :meth:`reset` goes through."""
        if not self._acquire(gpu_index):
            yield False
            return
        try:
            yield True
        finally:
            self._release()

    def refuse(self, gpu_index: int, *, reason: str, actor: str = "controller",
               message: str | None = None) -> ResetOutcome:
        """Record a refusal without checking or running anything (``message`` default: another
        reset is in progress) — the ``refusal`` event and the ``refused`` count."""
        run = _Run(self, gpu_index, reason, self.dry_run, actor)
        return run.finish("refused", message or self._busy_message())

    def _acquire(self, gpu_index: int) -> bool:
        if not self._lock.acquire(blocking=False):
            return False
        if self._owner is None:           # the outermost hold names the GPU
            self._owner, self._in_progress = threading.get_ident(), gpu_index
            self._depth = 1
        else:
            self._depth += 1
        return True

    def _release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner, self._in_progress = None, None
        self._lock.release()

    def mark_lost(self, gpu_index: int, why: str) -> bool:
        """Remember that GPU ``gpu_index`` was seen lost (``why``: e.g. an Xid 79 event the GPU
        source delivered once): every later reset of it is refused, even when the source shows
        it healthy again — a GPU that fell off the bus needs a node reboot. Recorded as an
        ``observation`` event (source ``gpu_reset``), so a restarted controller remembers.
        Returns True when it was not known lost before."""
        if isinstance(gpu_index, bool) or not isinstance(gpu_index, int) or gpu_index < 0:
            return False
        if gpu_index in self._lost:
            return False
        self._lost.add(gpu_index)
        if self.event_log is not None:
            self.event_log.append("observation", SOURCE, f"GPU {gpu_index} seen lost ({why}): every reset"
                                  " of it is refused from now on (drain the node and reboot it)",
                                  target=f"gpu:{gpu_index}", severity="critical",
                                  inputs={"gpu": gpu_index, "why": why},
                                  outcome={"gpu": gpu_index, "lost": True})
        return True

    def is_lost(self, gpu_index: int) -> bool:
        """Whether the rails remember GPU ``gpu_index`` as lost (every reset of it refused)."""
        return gpu_index in self._lost

    def forget_lost(self, gpu_index: int) -> bool:
        """Forget the lost mark of GPU ``gpu_index`` (an operator released it after the node
        was rebooted or the GPU replaced); resets of it go through the other rails again. Records
        nothing: the caller records the release as an ``action`` event (outcome
        ``{"gpu": N, "released": True}``, target ``gpu:N``), which :meth:`_load_history` honours
        after a restart when it is newer than the GPU's last lost mark. The per-GPU interval
        between reset attempts is kept. Returns True when the GPU was marked lost."""
        if gpu_index not in self._lost:
            return False
        self._lost.discard(gpu_index)
        return True

    def _busy_message(self) -> str:
        return f"another GPU reset is in progress (GPU {self._in_progress}); one reset at a time"

    # ------------------------------------------------------------------ flow
    def precheck(self, gpu_index: int) -> str | None:
        """Why a reset of ``gpu_index`` would be refused now by the rails or the GPU source, or
        None. Runs no command and records nothing (callers use it before draining engines).
        A reservation held by the calling thread (:meth:`reserve`) is not a refusal."""
        if self._in_progress is not None and self._owner != threading.get_ident():
            return self._busy_message()
        refusal, _snap = self._rails(gpu_index)
        return None if refusal is None else refusal[0]

    def _rails(self, n: int) -> tuple[tuple[str, bool, float | None] | None, GpuSnapshot | None]:
        """``((message, escalate, retry_after) or None when allowed, the GPU's snapshot)``."""
        if getattr(self.gpu_source, "simulated", False):
            return (f"GPU {n} is simulated (no NVIDIA driver): there is nothing to reset", False, None), None
        if n in self._lost:
            return (f"GPU {n} was found lost earlier: a reset cannot recover it; drain the node and"
                    " reboot it", True, None), None
        last = self._last_attempt.get(n)
        now = self.clock()
        if last is not None and now - last < self.min_interval_seconds:
            left = self.min_interval_seconds - (now - last)
            return (f"GPU {n} was reset {now - last:.0f} s ago; at most one reset per"
                    f" {self.min_interval_seconds:.0f} s: retry in {left:.0f} s", False, left), None
        snap, why = self._find(n)
        if snap is None:
            return (why, False, None), None
        lost = lost_evidence(snap)
        if lost is not None:
            self._lost.add(n)
            return (f"GPU {n} ({snap.uuid}) is lost ({lost}): a reset cannot recover it;"
                    " drain the node and reboot it", True, None), snap
        return None, snap

    def _reset_locked(self, run: "_Run") -> ResetOutcome:
        n = run.gpu
        refusal, snap = self._rails(n)
        if snap is not None:
            run.uuid = snap.uuid
        if refusal is not None:
            message, escalate, retry_after = refusal
            return run.finish("refused", message, escalate=escalate, retry_after=retry_after)
        allowed = {int(p) for p in self.allowed_pids()}
        if run.dry:
            foreign = sorted(p.pid for p in snap.processes if p.pid not in allowed)
            if foreign:
                return run.finish("refused", f"GPU {n} has processes we do not own: PIDs "
                                  + ", ".join(map(str, foreign)))
            for name, argv in self._plan(n, snap.persistence_mode):
                run.step(name, argv, planned=True)
            return run.finish("dry_run", f"dry run: GPU {n} passes the rails; would run "
                              f"{len(run.steps)} nvidia-smi command(s); nothing was run")

        # preconditions through nvidia-smi itself
        if shutil.which(self.nvidia_smi) is None:
            return run.finish("refused", f"{self.nvidia_smi!r} not found on PATH: cannot reset GPU {n}")
        res = run.cmd("query_processes", [self.nvidia_smi, "-i", str(n),
                      "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"])
        if res.lost:
            self._lost.add(n)
            return run.finish("refused", f"GPU {n} is lost (nvidia-smi exit {res.returncode}): a reset"
                              " cannot recover it; drain the node and reboot it", escalate=True)
        if not res.ok:
            return run.finish("refused", f"cannot list the processes on GPU {n}: {res.summary()}")
        pids = _parse_pids(res.output)
        foreign = sorted(set(pids) - allowed)
        if foreign:
            return run.finish("refused", f"GPU {n} has processes we do not own: PIDs "
                              + ", ".join(map(str, foreign)))
        res = run.cmd("query_persistence", [self.nvidia_smi, "-i", str(n),
                      "--query-gpu=persistence_mode", "--format=csv,noheader"])
        if not res.ok:
            return run.finish("refused", f"cannot read persistence mode of GPU {n}: {res.summary()}")
        persistence = res.output.strip().splitlines()[0].strip().lower() if res.output.strip() else ""
        if persistence not in ("enabled", "disabled"):
            return run.finish("refused", f"unexpected persistence mode {persistence!r} for GPU {n}")

        self._last_attempt[n] = self.clock()
        run.attempted = True
        reset_res = None
        try:
            if persistence == "enabled":
                res = run.cmd("disable_persistence", [self.nvidia_smi, "-i", str(n), "-pm", "0"])
                if not res.ok:
                    return run.finish("failed", f"could not disable persistence mode on GPU {n}:"
                                      f" {res.summary()}")
            reset_res = run.cmd("reset", [self.nvidia_smi, "--gpu-reset", "-i", str(n)])
        finally:
            if persistence == "enabled":
                restore = run.cmd("restore_persistence", [self.nvidia_smi, "-i", str(n), "-pm", "1"])
                run.persistence_restored = restore.ok
        if reset_res.lost:
            self._lost.add(n)
            return run.finish("failed", f"GPU {n} is lost (nvidia-smi exit {reset_res.returncode}):"
                              " a reset cannot recover it; drain the node and reboot it", escalate=True)
        if not reset_res.ok or "successfully reset" not in reset_res.output:
            if "in use by another client" in reset_res.output.lower():
                why = "in use by another client"
            else:
                why = reset_res.summary()
            return run.finish("failed", f"nvidia-smi could not reset GPU {n}: {why}")
        verified, detail = self._verify(n, run)
        if not verified:
            # lost after the reset: a person must reboot the node (escalated, remembered)
            return run.finish("failed", f"nvidia-smi reported GPU {n} reset, but verification failed:"
                              f" {detail}", escalate=n in self._lost)
        msg = f"GPU {n} was reset and verified ({detail})"
        if persistence == "enabled" and not run.persistence_restored:
            return run.finish("failed", msg + "; but persistence mode could not be restored")
        return run.finish("success", msg)

    def _plan(self, n: int, persistence: bool | None) -> list[tuple[str, list[str]]]:
        plan = [("query_processes", [self.nvidia_smi, "-i", str(n),
                 "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]),
                ("query_persistence", [self.nvidia_smi, "-i", str(n), "--query-gpu=persistence_mode",
                 "--format=csv,noheader"])]
        if persistence is not False:   # unknown or enabled: it would be handled
            plan.append(("disable_persistence_if_enabled", [self.nvidia_smi, "-i", str(n), "-pm", "0"]))
        plan.append(("reset", [self.nvidia_smi, "--gpu-reset", "-i", str(n)]))
        if persistence is not False:
            plan.append(("restore_persistence_if_enabled", [self.nvidia_smi, "-i", str(n), "-pm", "1"]))
        return plan

    def _find(self, n: int) -> tuple[GpuSnapshot | None, str]:
        from inferctl.controller.signals import clean_gpu_snapshot

        try:
            reading: GpuReading = self.gpu_source.poll(self.clock())
        except Exception as exc:
            return None, f"GPU source failed: {exc!r}; cannot check GPU {n} before a reset"
        if not reading.ok:
            return None, (f"GPU telemetry is down ({reading.error or 'no detail'}); cannot check"
                          f" GPU {n} before a reset")
        self._known.update(s.index for s in reading.gpus.values() if isinstance(s.index, int))
        for snap in reading.gpus.values():
            if snap.index == n:
                # impossible values (a string for memory, used above total) are no data: a
                # reading like that is not "memory readable" when the reset is verified
                snap = dataclasses.replace(snap)
                clean_gpu_snapshot(snap)
                return snap, ""
        known = sorted(s.index for s in reading.gpus.values() if s.index is not None)
        return None, f"GPU {n} is unknown to the GPU source ({reading.source}); known: {known}"

    def _verify(self, n: int, run: "_Run") -> tuple[bool, str]:
        detail = "no poll made"
        for attempt in range(1, self.verify_attempts + 1):
            snap, why = self._find(n)
            if snap is None:
                detail = why
            elif snap.lost:
                self._lost.add(n)
                detail = "GPU is lost after the reset"
                run.step("verify", None, ok=False, output=detail, attempt=attempt)
                return False, detail
            elif snap.memory_total_bytes is None:
                detail = "memory not readable"
            else:
                detail = f"present, not lost, memory total {snap.memory_total_bytes} bytes"
                run.step("verify", None, ok=True, output=detail, attempt=attempt)
                return True, detail
            run.step("verify", None, ok=False, output=detail, attempt=attempt)
            if attempt < self.verify_attempts:
                self.sleep(self.verify_interval_seconds)
        return False, detail

    def _load_history(self) -> None:
        """Rebuild the per-GPU last attempt and lost set from the event log (restart-safe).

        A GPU is lost when its newest lost mark (an ``escalation`` or a ``lost`` observation of
        the rails) is newer (higher event id) than its newest operator release (an ``action``
        event with outcome ``released: True``, target ``gpu:N``, :meth:`forget_lost`)."""
        if self.event_log is None:
            return
        lost_at: dict[int, int] = {}
        released_at: dict[int, int] = {}
        # The whole log, paged: a lost mark must never age out behind newer events.
        for ev in self.event_log.scan(kind="action"):
            out = ev["outcome"] or {}
            gpu = out.get("gpu")
            if isinstance(gpu, bool) or not isinstance(gpu, int):
                continue
            if ev["source"] != SOURCE:
                if out.get("released") is True and ev.get("target") == f"gpu:{gpu}":
                    released_at[gpu] = max(released_at.get(gpu, 0), ev["id"])
                continue
            when = out.get("attempt_time")
            if out.get("attempted") and isinstance(when, (int, float)):
                self._last_attempt[gpu] = max(self._last_attempt.get(gpu, float("-inf")), float(when))
        for ev in self.event_log.scan(kind="escalation", source=SOURCE):
            gpu = (ev["outcome"] or {}).get("gpu")
            if isinstance(gpu, int):
                lost_at[gpu] = max(lost_at.get(gpu, 0), ev["id"])
        for ev in self.event_log.scan(kind="observation", source=SOURCE):
            out = ev["outcome"] or {}
            if out.get("lost") is True and isinstance(out.get("gpu"), int):
                lost_at[out["gpu"]] = max(lost_at.get(out["gpu"], 0), ev["id"])
        self._lost.update(g for g, at in lost_at.items() if at > released_at.get(g, 0))


@dataclass
class _Result:
    returncode: int | None
    output: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def lost(self) -> bool:
        return self.returncode == EXIT_GPU_IS_LOST or "gpu is lost" in self.output.lower()

    def summary(self) -> str:
        text = self.error or (self.output.strip().splitlines()[0] if self.output.strip() else "no output")
        return f"exit {self.returncode}: {text}"


class _Run:
    """One reset request: runs commands, records steps as events, builds the outcome."""

    def __init__(self, owner: GpuResetter, gpu: int, reason: str, dry: bool, actor: str) -> None:
        self.o = owner
        self.gpu = gpu
        self.reason = reason
        self.dry = dry
        self.actor = actor
        self.uuid: str | None = None
        self.steps: list[dict] = []
        self.attempted = False
        self.persistence_restored: bool | None = None

    @property
    def target(self) -> str:
        return f"gpu:{self.gpu}"

    def cmd(self, name: str, argv: list[str]) -> _Result:
        try:
            proc = subprocess.run(argv, shell=False, capture_output=True, text=True,
                                  timeout=self.o.command_timeout_seconds, check=False)
            res = _Result(proc.returncode, (proc.stdout or "") + (proc.stderr or ""))
        except subprocess.TimeoutExpired:
            res = _Result(None, "", f"timed out after {self.o.command_timeout_seconds:g} s")
        except OSError as exc:
            res = _Result(None, "", f"could not run: {exc}")
        self.step(name, argv, ok=res.ok, returncode=res.returncode,
                  output=(res.error or res.output.strip())[:2000])
        return res

    def step(self, name: str, argv: list[str] | None, *, planned: bool = False, ok: bool | None = None,
             returncode: int | None = None, output: str = "", attempt: int | None = None) -> None:
        entry: dict[str, Any] = {"step": name, "argv": argv, "returncode": returncode,
                                 "output": output, "ok": ok}
        if planned:
            entry["planned"] = True
        if attempt is not None:
            entry["attempt"] = attempt
        self.steps.append(entry)
        if self.o.event_log is not None:
            verb = "would run" if planned else ("ran" if argv else "checked")
            self.o.event_log.append(
                "step", SOURCE, f"GPU {self.gpu} reset: {verb} {name}", target=self.target,
                severity="info" if ok is not False else "warning",
                inputs={"gpu": self.gpu, "argv": argv, "dry_run": self.dry},
                outcome={k: v for k, v in entry.items() if k != "argv"})

    def finish(self, outcome: str, message: str, *, escalate: bool = False,
               retry_after: float | None = None) -> ResetOutcome:
        result = ResetOutcome(outcome=outcome, message=message, gpu=self.gpu, steps=self.steps,
                              escalated=escalate, retry_after_seconds=retry_after)
        log = self.o.event_log
        if log is not None:
            severity = "critical" if escalate else ("warning" if outcome in ("failed", "refused") else "info")
            kind = "refusal" if outcome == "refused" else "action"
            result.event_id = log.append(
                kind, SOURCE, message, target=self.target, severity=severity,
                inputs={"gpu": self.gpu, "uuid": self.uuid, "reason": self.reason, "actor": self.actor,
                        "dry_run": self.dry},
                outcome={"gpu": self.gpu, "outcome": outcome, "attempted": self.attempted,
                         "attempt_time": self.o._last_attempt.get(self.gpu) if self.attempted else None,
                         "persistence_restored": self.persistence_restored,
                         "retry_after_seconds": retry_after, "escalated": escalate,
                         "steps": [s["step"] for s in self.steps]})
            if escalate:
                log.append("escalation", SOURCE, f"GPU {self.gpu} needs a person: drain the node and"
                           " reboot it (a GPU reset cannot recover a lost GPU)", target=self.target,
                           severity="critical", inputs={"gpu": self.gpu, "uuid": self.uuid},
                           outcome={"gpu": self.gpu, "action": "reboot_node"})
        # a label value never comes from a request: only a GPU the source has shown (or one
        # with a reset history) is counted; a refusal of an unknown index is the event alone
        known = self.gpu in self.o._known or self.gpu in self.o._lost or self.gpu in self.o._last_attempt
        if known and self.o.metrics is not None and "inferctl_gpu_resets_total" in self.o.metrics:
            self.o.metrics["inferctl_gpu_resets_total"].labels(gpu=str(self.gpu), outcome=outcome).inc()
        return result


def lost_evidence(snap: GpuSnapshot) -> str | None:
    """Why ``snap`` says its GPU is lost, or None: ``lost`` set (NVML ``GpuIsLost``), the
    source's health "lost", or an Xid 79 / "fallen off the bus" report among its events."""
    if snap.lost:
        return "fell off the bus"
    if str(snap.health or "").strip().lower() == "lost":
        return "the GPU source reports it lost"
    for ev in snap.xid_events or []:
        if getattr(ev, "lost", False) or getattr(ev, "xid", None) == 79:
            return f"Xid {getattr(ev, 'xid', None) or 79}: fell off the bus"
    return None


def _parse_pids(output: str) -> list[int]:
    """PIDs from ``--query-compute-apps=pid,...`` CSV lines (first column); other lines ignored."""
    pids = []
    for line in output.splitlines():
        first = line.split(",", 1)[0].strip()
        if first.isdigit():
            pids.append(int(first))
    return pids
