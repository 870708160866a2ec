"""Shared test fixtures: paths to the real model, data and captures in ../shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("INFERCTL_SHARED", ROOT.parent / "shared"))
STORIES_DIR = Path(os.environ.get("INFERCTL_STORIES260K", SHARED / "models" / "stories260K"))
FIXTURES = SHARED / "fixtures"
GUTENBERG = SHARED / "data" / "gutenberg"


@pytest.fixture(scope="session")
def stories_dir() -> Path:
    if not (STORIES_DIR / "stories260K.bin").exists():
        pytest.fail(f"stories260K not found at {STORIES_DIR} (set INFERCTL_STORIES260K)")
    return STORIES_DIR


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.exists():
        pytest.fail(f"fixtures not found at {FIXTURES} (set INFERCTL_SHARED)")
    return FIXTURES


@pytest.fixture(scope="session")
def gutenberg_dir() -> Path:
    if not GUTENBERG.exists():
        pytest.fail(f"Gutenberg texts not found at {GUTENBERG} (set INFERCTL_SHARED)")
    return GUTENBERG


@pytest.fixture(autouse=True)
def _root_logger_restored():
    """A CLI run in-process (``CliRunner`` → ``engine serve`` / ``router``) configures the root
    logger (contract/logs.py); put its handlers and level back after each test so no test's log
    configuration leaks into another's captured output."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session", autouse=True)
def _cpu_kernels_built():
    """Build the engine's CPU kernels (engine.cpu_kernels) once before any test, so the first-use
    compile (~45 s on a cold cache) never lands inside a server's start-up deadline; a no-op
    (cached load, ~1 s) afterwards, and a logged fallback where no compiler is there."""
    import torch

    from inferctl.engine import cpu_kernels

    cpu_kernels.ops_for("cpu", torch.float32)
    yield


#: Every process a test starts inherits this variable (``os.environ`` at session start), and so do
#: the processes those start (``inferctl up``'s engines, router and controller).
SESSION_MARK = "INFERCTL_TEST_SESSION"


def pytest_sessionstart(session) -> None:
    # always a new mark: a pytest run by a test marks its own children, never its parent's
    os.environ[SESSION_MARK] = f"{os.getpid()}-{os.urandom(6).hex()}"


def _marked_pids(mark: str) -> list[int]:
    """PIDs (not this one) whose environment holds ``SESSION_MARK=mark``, read from
    ``/proc/PID/environ`` (Linux; none elsewhere). multiprocessing's resource tracker (started
    with the first spawned engine core of this process, ``--core-process``) is not counted: it
    lives as long as this process and exits with it."""
    needle = f"{SESSION_MARK}={mark}".encode()
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        pid = int(d.name)
        if pid == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0") \
                    and b"multiprocessing.resource_tracker" not in (d / "cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def pytest_sessionfinish(session, exitstatus) -> None:
    """Stop what the tests left running. A test that fails while ``inferctl up`` runs kills ``up``
    (SIGKILL), which cannot stop its engines, router and controller: they would keep their ports
    and cores after the session (and slow down or break whatever runs next). SIGKILL every process
    still carrying this session's mark, and say so."""
    import signal

    mark = os.environ.get(SESSION_MARK)
    if not mark:
        return
    pids = _marked_pids(mark)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if pids:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"conftest: killed {len(pids)} process(es) the tests left running: {pids}")
