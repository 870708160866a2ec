"""The GPU reset rails' own processes: an engine and everything below it (``--core-process``)."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

from inferctl.controller.supervisor import descendants, owned_pids


def _fake_proc(tmp_path, tree: dict[int, dict[int, list[int]]]):
    """``/proc`` with ``PID/task/TID/children`` files: ``{pid: {tid: [child, ...]}}``."""
    for pid, tasks in tree.items():
        for tid, children in tasks.items():
            d = tmp_path / str(pid) / "task" / str(tid)
            d.mkdir(parents=True)
            (d / "children").write_text(" ".join(map(str, children)) + (" " if children else ""))
    return tmp_path


def test_descendants_walk_every_thread_and_generation(tmp_path):
    proc = _fake_proc(tmp_path, {100: {100: [101], 102: [103]},      # two threads, a child each
                                 101: {101: [104]}, 103: {103: []}, 104: {104: []},
                                 200: {200: [201]}, 201: {201: []}})
    assert sorted(descendants(100, proc)) == [101, 103, 104]
    assert descendants(999, proc) == []                                # gone
    sups = [SimpleNamespace(pid=100), SimpleNamespace(pid=None), SimpleNamespace(pid=200)]
    assert sorted(owned_pids(sups, proc)) == [100, 101, 103, 104, 200, 201]


def test_descendants_of_a_real_process_include_its_child():
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
                               "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        found: list[int] = []
        while not found and time.monotonic() < deadline:
            found = descendants(parent.pid)
            time.sleep(0.05)
        assert len(found) == 1 and found[0] != parent.pid
    finally:
        for pid in descendants(parent.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.kill()
        parent.wait(5)
