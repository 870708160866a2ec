"""The CPU kernels' build cache (engine/cpu_kernels.py): a stale build lock is removed, a fresh one
is left alone, and two installs of the same sources build under different names."""

from __future__ import annotations

import logging
import os
import shutil

from inferctl.engine import cpu_kernels


def test_a_lock_older_than_the_limit_is_removed_with_a_warning(tmp_path, caplog):
    lock = tmp_path / "lock"
    lock.touch()
    os.utime(lock, (1_000.0, 1_000.0))
    with caplog.at_level(logging.WARNING, logger="inferctl.engine.cpu_kernels"):
        assert cpu_kernels.clear_stale_lock(tmp_path, now=1_000.0 + cpu_kernels.STALE_LOCK_SECONDS + 1) is True
    assert not lock.exists()
    assert "stale build lock" in caplog.text and "601 s old" in caplog.text


def test_a_lock_of_a_build_in_progress_is_kept(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    os.utime(lock, (1_000.0, 1_000.0))
    assert cpu_kernels.clear_stale_lock(tmp_path, now=1_000.0 + cpu_kernels.STALE_LOCK_SECONDS) is False
    assert lock.exists()


def test_no_lock_is_nothing_to_do(tmp_path):
    assert cpu_kernels.clear_stale_lock(tmp_path, now=1e12) is False
    assert cpu_kernels.clear_stale_lock(tmp_path / "missing-dir", now=1e12) is False


def test_two_installs_of_the_same_sources_build_under_different_names(tmp_path, monkeypatch):
    """With one name for both, torch's build.ninja named different source paths, so each install's
    load rebuilt over the other's (~45 s under the build lock, an engine start waiting on it)."""
    copies = []
    for where in ("a", "b"):
        d = tmp_path / where
        d.mkdir()
        copies.append(tuple(_copy(f, d) for f in cpu_kernels.SOURCES + cpu_kernels.HEADERS))
    n = len(cpu_kernels.SOURCES)
    tags = []
    for files in copies:
        monkeypatch.setattr(cpu_kernels, "SOURCES", files[:n])
        monkeypatch.setattr(cpu_kernels, "HEADERS", files[n:])
        tags.append(cpu_kernels._cpu_tag())
    assert tags[0] != tags[1]
    # the same install asked twice: the same name (the cache is reused)
    assert cpu_kernels._cpu_tag() == tags[1]
    # a changed source changes the name too
    files[0].write_bytes(files[0].read_bytes() + b"\n// changed\n")
    assert cpu_kernels._cpu_tag() != tags[1]


def _copy(src, d):
    dst = d / src.name
    shutil.copyfile(src, dst)
    return dst


def _first_start_messages(monkeypatch, caplog, build_dir, with_library: bool) -> list[str]:
    """INFO messages of one ``load_ops`` whose build directory is ``build_dir`` (holding the built
    library or not) and whose build fails (so nothing real is built or loaded)."""
    import torch.utils.cpp_extension as cpp

    seen: list[str] = []

    def build_dir_of(name, verbose):
        seen.append(name)
        if with_library:
            (build_dir / f"{name}.so").touch()
        return str(build_dir)

    def no_build(*a, **k):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(cpp, "_get_build_directory", build_dir_of)
    monkeypatch.setattr(cpp, "load", no_build)
    cpu_kernels.load_ops.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="inferctl.engine.cpu_kernels"):
            assert cpu_kernels.load_ops() is None
    finally:
        cpu_kernels.load_ops.cache_clear()   # the next caller loads the real (cached) build again
    assert seen and all(n.startswith("inferctl_cpu_kernels_") for n in seen)
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]


def test_a_first_build_says_so_before_the_quiet_minute(monkeypatch, caplog, tmp_path):
    msgs = [m for m in _first_start_messages(monkeypatch, caplog, tmp_path, False) if "building" in m]
    assert len(msgs) == 2                                  # the OpenMP build and the serial retry
    assert str(tmp_path) in msgs[0] and "INFERCTL_CPU_KERNELS=0" in msgs[0]


def test_a_cached_build_starts_without_the_message(monkeypatch, caplog, tmp_path):
    assert not [m for m in _first_start_messages(monkeypatch, caplog, tmp_path, True) if "building" in m]
