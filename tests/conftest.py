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
