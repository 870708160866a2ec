"""Engine processes the controller launches: start, watch, restart, stop — and adopt after a
controller crash.

:class:`EngineSupervisor` runs one ``inferctl engine serve`` process: start, wait for
``/health``, restart, stop (SIGTERM, then SIGKILL after a timeout).

**A controller that dies does not take its engines with it, and a restarted controller does
not orphan them.** Engines run in a session of their own and survive a controller killed with
SIGKILL (serving goes on; the control plane's death is not a data-plane outage — for that
reason inferctl does not set ``PR_SET_PDEATHSIG``, which would also fire when the *thread* that
started the engine exits, e.g. an action worker). Each launched process carries two
environment variables: :data:`OWNER_ENV` (a digest of the event log's absolute path and the
engine's name: "launched by the controller of this event log, as engine NAME") and
:data:`TOKEN_ENV` (a fresh random launch token, recorded in the launch's lifecycle event). At
start, :meth:`EngineSupervisor.adopt_or_clear` finds the processes that carry its owner key
(Linux ``/proc/PID/environ``; processes of the same user) and, for each:

* **adopts** it — supervises it without relaunching — when its command line
  (``/proc/PID/cmdline``) is exactly the one it would launch now (same port, model, options),
  it carries the admin token the controller would give it, and it answers ``/health`` 200 on
  the configured URL (one at most);
* otherwise **stops** it cleanly: SIGTERM, wait ``stop_timeout_seconds``, SIGKILL — so the port
  is free for the new launch.

An adopted process is not the controller's child: its exit code is unknown (``-1``), and it is
identified by pid *and* its start time (``/proc/PID/stat`` field 22), so a reused pid is never
mistaken for it. On a clean controller exit every supervised engine, adopted ones included, is
stopped. Without ``/proc`` (not Linux) nothing is adopted and a leftover engine's port makes
the new launch fail with a clear error.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

#: environment variable naming who launched the engine (:func:`owner_key`)
OWNER_ENV = "INFERCTL_ENGINE_OWNER"
#: environment variable with the launch's random token (recorded in the lifecycle event)
TOKEN_ENV = "INFERCTL_LAUNCH_TOKEN"
#: the engine's admin token variable (what the controller gives the engines it launches)
ADMIN_TOKEN_ENV = "INFERCTL_ADMIN_TOKEN"
#: exit code reported for an adopted process (not our child: its real code is unknown)
UNKNOWN_EXIT = -1
PROC = Path("/proc")


def owner_key(event_log_path: str | Path, engine: str) -> str:
    """The owner key of engine ``engine`` launched by the controller of ``event_log_path``:
    sha256 of the absolute path and the name (32 hex digits)."""
    path = str(event_log_path) if str(event_log_path) == ":memory:" else os.path.abspath(event_log_path)
    return hashlib.sha256(f"{path}\0{engine}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class ProcessInfo:
    """One live process as ``/proc`` shows it (``start_ticks``: field 22 of ``/proc/PID/stat``,
    clock ticks after boot; with the pid it identifies the process)."""

    pid: int
    start_ticks: int
    cmdline: tuple[str, ...]
    environ: dict[str, str]


def read_process(pid: int, proc: Path = PROC) -> ProcessInfo | None:
    """The live process ``pid`` (None: gone, a zombie, or unreadable)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()      # after "(comm) "
        if fields[0] in ("Z", "X"):
            return None
        start = int(fields[19])                            # field 22 overall
        cmdline = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        environ = (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None
    env = {}
    for item in environ:
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[key] = value
    return ProcessInfo(pid, start, tuple(a.decode(errors="replace") for a in cmdline if a), env)


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """Every process below ``pid`` (children, their children, …), from
    ``/proc/PID/task/TID/children`` (Linux 3.5+); empty when ``pid`` is gone or unreadable. An
    engine started with ``--core-process`` runs its model in a child: that child's GPU memory is
    the engine's (the GPU reset rails count it as ours)."""
    out: list[int] = []
    todo, seen = [pid], {pid}
    while todo:
        current = todo.pop()
        try:
            tasks = list((proc / str(current) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            for child in children:
                if child not in seen:
                    seen.add(child)
                    out.append(child)
                    todo.append(child)
    return out


def owned_pids(supervisors: Iterable, proc: Path = PROC) -> list[int]:
    """The pids of the supervised engines (``.pid``, None when not running) and of every process
    below them (:func:`descendants`): the processes the GPU reset rails allow on a GPU."""
    out: list[int] = []
    for sup in supervisors:
        if sup.pid is not None:
            out += [sup.pid, *descendants(sup.pid, proc)]
    return out


def find_owned(owner: str, proc: Path = PROC) -> list[ProcessInfo]:
    """Live processes whose environment carries ``OWNER_ENV=owner`` (empty without ``/proc``)."""
    found = []
    try:
        entries = [p.name for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    for name in entries:
        pid = int(name)
        if pid == os.getpid():
            continue
        info = read_process(pid, proc)
        if info is not None and info.environ.get(OWNER_ENV) == owner:
            found.append(info)
    return found


class AdoptedProcess:
    """A ``subprocess.Popen``-like handle over a live process that is not our child (adopted
    after a controller restart): ``poll``/``wait``/``send_signal``/``kill``. It counts as exited
    once its pid is gone, a zombie, or carries another start time; ``returncode`` is then
    :data:`UNKNOWN_EXIT`."""

    def __init__(self, info: ProcessInfo, proc: Path = PROC) -> None:
        self.pid = info.pid
        self.args = list(info.cmdline)
        self.start_ticks = info.start_ticks
        self.returncode: int | None = None
        self._proc = proc

    def poll(self) -> int | None:
        if self.returncode is None:
            info = read_process(self.pid, self._proc)
            if info is None or info.start_ticks != self.start_ticks:
                self.returncode = UNKNOWN_EXIT
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.05)
        return self.returncode if self.returncode is not None else UNKNOWN_EXIT

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class EngineSupervisor:
    """Starts, watches, restarts and stops one engine process the controller launched.

    Args:
        name: the engine's configured name.
        argv: the command (an argv list, run without a shell), e.g.
            ``[sys.executable, "-m", "inferctl", "engine", "serve", "--port", "8000"]``.
        base_url: where the engine listens (``/health`` is polled there).
        env: extra environment variables (the admin token travels here, not on argv).
        health_timeout_seconds: how long :meth:`start` waits for ``/health`` 200.
        stop_timeout_seconds: SIGTERM grace before SIGKILL.
        log_path: file for the engine's stdout/stderr (None: inherit ours).
        owner: the owner key (:func:`owner_key`) put in the process's environment; None: the
            engine cannot be adopted after a controller restart.
        on_launch: called with the supervisor after each launch is healthy (the caller records
            pid, port and launch token as a lifecycle event).
        proc: the ``/proc`` file system (tests).
    """

    def __init__(self, name: str, argv: list[str], base_url: str, env: dict[str, str] | None = None,
                 health_timeout_seconds: float = 60.0, stop_timeout_seconds: float = 10.0,
                 log_path: str | Path | None = None, *, owner: str | None = None,
                 on_launch: Callable[["EngineSupervisor"], None] | None = None, proc: Path = PROC) -> None:
        if not argv:
            raise ValueError("argv: must not be empty")
        self.name = name
        self.argv = list(argv)
        self.base_url = base_url.rstrip("/")
        self.env = dict(env or {})
        self.health_timeout_seconds = health_timeout_seconds
        self.stop_timeout_seconds = stop_timeout_seconds
        self.log_path = Path(log_path) if log_path else None
        self.owner = owner
        self.on_launch = on_launch
        self.restarts = 0
        #: the current process's launch token (:data:`TOKEN_ENV`) and start time (``/proc``)
        self.launch_token: str | None = None
        self.start_ticks: int | None = None
        #: True while the process is one adopted from a previous controller
        self.adopted = False
        #: the crash-loop guard: times of the restarts after crashes (controller/loop.py's
        #: ``supervise`` keeps it; an operator restart clears it)
        self.crash_restarts: list[float] = []
        self._procfs = proc
        self._proc: Any = None     # subprocess.Popen, or AdoptedProcess
        self._log_file: Any = None
        self._lock = threading.RLock()
        self._stopping = False
        #: the process's own state: ``starting``, ``running``, ``stopped`` (:attr:`lifecycle`)
        self.process_state = "stopped"
        #: set while an action holds the replica out of rotation (``draining``, ``restarting``,
        #: ``starting``, ``resetting``: controller/fleet.py), else None
        self.hold_state: str | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def lifecycle(self) -> str:
        """What ``/status`` shows (``engines[NAME].lifecycle``): the hold of an action, else the
        process's state; ``down`` when the process exited on its own."""
        if self.hold_state is not None:
            return self.hold_state
        if self.process_state == "running" and not self.running:
            return "down"
        return self.process_state

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exited_unexpectedly(self) -> int | None:
        """The exit code if the process died on its own (not stopped by us), else None. None at
        once, without waiting, while a start, stop or restart holds this supervisor (a start
        waits for ``/health`` up to its timeout): the supervise job must not block behind it
        (it runs every second; APScheduler would skip and log each run it blocked)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._proc is None or self._stopping:
                return None
            return self._proc.poll()
        finally:
            self._lock.release()

    def start(self) -> None:
        """Start the process and wait for ``/health`` 200.

        Raises:
            RuntimeError: the process exited, or was not healthy within the timeout (it is
                stopped then); the message carries the exit code / the last health error.
        """
        with self._lock:
            if self.running:
                return
            env = {**os.environ, **self.env}
            out = None
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
                out = self._log_file
            self._stopping = False
            self.process_state = "starting"
            self.launch_token = secrets.token_hex(16)
            env[TOKEN_ENV] = self.launch_token
            if self.owner is not None:
                env[OWNER_ENV] = self.owner
            # a session of its own: a Ctrl-C on the terminal reaches the controller, which
            # then stops the engine in order (drain → SIGTERM → SIGKILL); it also outlives a
            # controller killed with SIGKILL (adopted by the next one: adopt_or_clear)
            self._proc = subprocess.Popen(self.argv, env=env, stdout=out, stderr=out,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            self.adopted = False
            info = read_process(self._proc.pid, self._procfs)
            self.start_ticks = None if info is None else info.start_ticks
        self.wait_healthy(self.health_timeout_seconds)
        self.process_state = "running"
        if self.on_launch is not None:
            self.on_launch(self)

    def reset_crash_guard(self) -> int:
        """Forget the crash restarts (an operator restarted the engine). Returns how many there were."""
        with self._lock:
            n = len(self.crash_restarts)
            self.crash_restarts = []
            return n

    def adopt_or_clear(self) -> dict:
        """After a controller restart: adopt the healthy engine a previous controller of the same
        event log launched as this engine, stop any other (module docstring). Call before
        :meth:`start` (which then returns at once when one was adopted).

        Returns ``{"adopted": pid | None, "stopped": [{"pid", "why", "exit_code"}], "found": int,
        "launch_token": str | None}``; ``found`` 0 also without ``/proc`` or without an ``owner``.
        """
        out: dict = {"adopted": None, "stopped": [], "found": 0, "launch_token": None}
        if self.owner is None:
            return out
        with self._lock:
            if self.running:
                return out
            found = find_owned(self.owner, self._procfs)
            out["found"] = len(found)
            for info in sorted(found, key=lambda i: i.start_ticks, reverse=True):
                why = None if out["adopted"] is None else "another process was adopted"
                why = why or self._not_adoptable(info)
                if why is None:
                    self._proc = AdoptedProcess(info, self._procfs)
                    self._stopping = False
                    self.adopted = True
                    self.process_state = "running"
                    self.launch_token = info.environ.get(TOKEN_ENV)
                    self.start_ticks = info.start_ticks
                    out["adopted"] = info.pid
                    out["launch_token"] = self.launch_token
                    continue
                handle = AdoptedProcess(info, self._procfs)
                out["stopped"].append({"pid": info.pid, "why": why, "exit_code": self._terminate(handle)})
        return out

    def _not_adoptable(self, info: ProcessInfo) -> str | None:
        """Why ``info`` may not be adopted (None: it may)."""
        if list(info.cmdline) != self.argv:
            return "its command line differs from the configured launch"
        want = {**os.environ, **self.env}.get(ADMIN_TOKEN_ENV, "")
        if not hmac.compare_digest(info.environ.get(ADMIN_TOKEN_ENV, "").encode(), want.encode()):
            return "it was given another admin token"
        try:
            r = httpx.get(f"{self.base_url}/health", timeout=2.0)
        except httpx.HTTPError as exc:
            return f"{self.base_url}/health did not answer ({type(exc).__name__})"
        if r.status_code != 200:
            return f"{self.base_url}/health answered HTTP {r.status_code}"
        return None

    def _terminate(self, proc: Any) -> int | None:
        """SIGTERM, wait ``stop_timeout_seconds``, SIGKILL; the exit code (None: still there)."""
        try:
            proc.send_signal(signal.SIGTERM)
            return proc.wait(timeout=self.stop_timeout_seconds)
        except subprocess.TimeoutExpired:
            try:
                proc.kill()
                return proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                return None
        except ProcessLookupError:
            return proc.poll()

    def wait_healthy(self, timeout: float) -> None:
        """Poll ``GET /health`` until 200; raises ``RuntimeError`` on exit or timeout."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                proc = self._proc
                if proc is None or proc.poll() is not None:
                    code = None if proc is None else proc.returncode
                    raise RuntimeError(f"engine {self.name!r} exited with code {code} before it was"
                                       " healthy" + (f" (log: {self.log_path})" if self.log_path else ""))
                try:
                    r = client.get(f"{self.base_url}/health")
                    if r.status_code == 200:
                        return
                    last = f"HTTP {r.status_code}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"engine {self.name!r} not healthy at {self.base_url}/health within"
                           f" {timeout:g} s (last: {last}); a large model may need longer: raise"
                           f" launch.health_timeout_seconds in the --config file (docs/configuration.md)")

    def wait_ready(self, timeout: float) -> bool:
        """Poll ``GET /ready`` until 200 (an engine without ``/ready``, 404: ``/health`` 200);
        True when ready within ``timeout`` seconds, False otherwise (never raises)."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                try:
                    r = client.get(f"{self.base_url}/ready")
                    if r.status_code == 404:
                        r = client.get(f"{self.base_url}/health")
                    if r.status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= deadline or not self.running:
                    return False
                time.sleep(0.1)

    def stop(self) -> int | None:
        """Stop the process: SIGTERM, then SIGKILL after ``stop_timeout_seconds``. Returns its
        exit code (None if it was not started). Idempotent."""
        with self._lock:
            self._stopping = True
            self.process_state = "stopped"
            proc = self._proc
            if proc is None:
                return None
            if proc.poll() is None:
                self._terminate(proc)
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            return proc.returncode

    def restart(self) -> None:
        """Stop, then start again (waits for health). Raises ``RuntimeError`` like :meth:`start`."""
        with self._lock:
            self.stop()
            self._proc = None
            self.restarts += 1
            self.start()


def engine_serve_argv(port: int, host: str = "127.0.0.1", model: str | None = None,
                      memory_budget: str | None = None, extra: list[str] | None = None,
                      shutdown_grace_seconds: float | None = None) -> list[str]:
    """The argv that runs ``inferctl engine serve`` with this interpreter (no shell, no PATH).

    The supervised engine runs without uvicorn's access log: the controller polls it every
    second, and those lines would bury everything else in ``inferctl up``'s terminal.
    ``shutdown_grace_seconds`` (None: the engine's default) becomes ``--shutdown-grace-seconds``
    unless ``extra`` gives it (controller/config.py ``LaunchConfig.grace_seconds``: it fits
    inside the supervisor's stop timeout)."""
    argv = [sys.executable, "-m", "inferctl", "engine", "serve", "--host", host, "--port", str(port),
            "--no-access-log"]
    if model:
        argv += ["--model", str(model)]
    if memory_budget:
        argv += ["--memory-budget", str(memory_budget)]
    extra = list(extra or [])
    given = any(a == GRACE_FLAG or a.startswith(GRACE_FLAG + "=") for a in extra)
    if shutdown_grace_seconds is not None and not given:
        argv += [GRACE_FLAG, f"{shutdown_grace_seconds:g}"]
    return argv + extra


#: the engine's flag for its SIGTERM drain (engine/cli.py)
GRACE_FLAG = "--shutdown-grace-seconds"


