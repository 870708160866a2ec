"""An installed inferctl exposes its code under ``inferctl.*`` only.

``pip install .`` into a fresh virtual environment (no dependencies: the check is about
what the wheel puts in site-packages), then, from a folder outside the repository:
``import inferctl`` and the dependency-free contract modules work, and no generic top-level
module (``engine``, ``controller``, ``dashboards``, ``contract``, ``tools``, ``router``) is
importable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib.util, json
import inferctl, inferctl.contract.units as units, inferctl.contract.precision as precision
print(json.dumps({
    "file": inferctl.__file__,
    "size": units.parse_size("512MiB"),
    "modes": list(precision.PRECISION_MODES),
    "generic": {n: importlib.util.find_spec(n) is not None
                for n in ("engine", "controller", "dashboards", "contract", "tools", "router")},
}))
"""


@pytest.mark.e2e
def test_pip_install_puts_everything_under_the_inferctl_namespace(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    build = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            str(ROOT)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    if build.returncode != 0 and "setuptools" in build.stderr:
        # a venv without setuptools cannot build without isolation: let pip fetch the backend
        build = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(ROOT)],
                               capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    probe = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, timeout=60, cwd=outside)
    assert probe.returncode == 0, probe.stderr[-2000:]
    got = json.loads(probe.stdout)
    assert Path(got["file"]).is_relative_to(env_dir)          # the installed copy, not the checkout
    assert got["size"] == 512 * 1024 * 1024
    assert got["modes"] == ["full", "int8", "int4"]
    assert got["generic"] == {n: False for n in got["generic"]}
    installed = env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert (installed / "inferctl" / "engine" / "engine.py").exists()
    assert (installed / "inferctl" / "controller" / "loop.py").exists()
    assert not (installed / "engine").exists() and not (installed / "controller").exists()
