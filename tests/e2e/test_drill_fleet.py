"""End to end: ``inferctl drill fleet --json`` starts ``inferctl up --replicas 3`` (real engines,
router, controller), drives 8 clients through the router, degrades main-0, restarts main-1 through
the controller's rolling path, SIGKILLs main-2, and exits 0 with numbers that add up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_drill_fleet_exits_0_and_its_summary_adds_up(stories_dir, tmp_path):
    r = subprocess.run([sys.executable, "-m", "inferctl", "drill", "fleet", "--replicas", "3", "--clients", "8",
                        "--phase-seconds", "3", "--model", str(stories_dir / "stories260K.bin"), "--json",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=170,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    s = json.loads(r.stdout)
    print({k: s[k] for k in ("requests", "failed", "lost", "by_phase", "killed_started_streams", "by_replica")})
    assert s["ok"] and s["verdict"] == "ok" and s["lost"] == 0
    assert [p["name"] for p in s["phases"]] == ["baseline", "degrade", "restart", "kill"]
    for phase in ("baseline", "degrade", "restart"):
        assert s["by_phase"][phase]["failed"] == 0 and s["by_phase"][phase]["requests"] >= 8, s["by_phase"]
    assert s["requests"] == sum(v["requests"] for v in s["by_phase"].values()) == sum(s["by_replica"].values())
    assert s["failed"] == s["by_phase"]["kill"]["failed"] == s["kill_failures_attributable"]
    assert s["failed"] <= s["killed_started_streams"] <= 8
    assert set(s["by_replica"]) == {"main-0", "main-1", "main-2"}
    detail = {p["name"]: p["detail"] for p in s["phases"]}
    assert detail["degrade"]["degrade"]["answer"]["details"]["engine_precision"] == "int8"
    assert detail["restart"]["restart"]["status"] == 200 and detail["restart"]["back_in_rotation"]
    assert detail["restart"]["pid_after"] != detail["restart"]["pid_before"]
    # after the kill main-2 answers nothing new (the controller may relaunch it later)
    kill_t = s["phases"][-1]["t"]
    counts, t = s["share"]["counts"]["main-2"], s["share"]["t"]
    assert sum(c for c, b in zip(counts, t) if kill_t + 1 <= b < kill_t + 3) == 0   # (before any relaunch)
    png = tmp_path / "drill-fleet.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
