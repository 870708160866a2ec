"""The first thing an engine core process runs (``--core-process``), before anything heavy.

A ``multiprocessing`` spawn child unpickles its target and arguments before the target runs:
were they :func:`inferctl.engine.core_process.core_main` and a
:class:`~inferctl.engine.core_process.CoreSpec`, torch and the engine (over a second) would be
imported first, a window in which the child is not yet tied to its parent — a child stopped
then (SIGSTOP) outlived a killed server. So the target is :func:`boot`, in this module that
imports only the standard library, and the spec travels pickled: the child asks for the
parent-death signal first, then unpickles the spec (importing the engine) and runs
``core_main``. What is left before the prctl is the spawn bootstrap and the main module's import
(the CLI: about 0.2 s).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import pickle
import signal
import sys
from multiprocessing.connection import Connection

#: prctl(2) option: the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux ``prctl``); then exit
    at once if the parent is already gone. Returns False where that is not available. (The
    kernel means the parent *thread*: the API process creates its cores on its main thread.)"""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid != os.getppid():   # it died before the prctl
        os._exit(1)
    return True


def boot(conn: Connection, spec_bytes: bytes) -> None:
    """The core process's target: tie it to its parent, ignore SIGINT/SIGTERM (the server drains
    first, then stops it), then unpickle the spec and run
    :func:`~inferctl.engine.core_process.core_main`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent()
    spec = pickle.loads(spec_bytes)
    from inferctl.engine.core_process import core_main

    core_main(conn, spec)
