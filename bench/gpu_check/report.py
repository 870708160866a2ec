"""Check results and the two files written under ``--out``: ``gpu-check.json`` and ``gpu-check.md``."""

from __future__ import annotations

import datetime as dt
import json
import math
import platform
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"
NO_CUDA = "skipped: no CUDA device"


@dataclass
class Check:
    """One named check. ``gpu``: it needs a CUDA device (never ``pass`` without one).
    ``status``: pass | fail | skipped; ``reason``: why (always set unless passed);
    ``numbers``: what was measured (bytes, seconds, ratios; None = no data)."""

    name: str
    title: str
    gpu: bool
    status: str = SKIPPED
    reason: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None

    def skip(self, reason: str) -> "Check":
        self.status, self.reason = SKIPPED, reason
        return self

    def verdict(self, problems: list[str]) -> "Check":
        """``pass`` when ``problems`` is empty, else ``fail`` with the problems as the reason."""
        self.status = PASS if not problems else FAIL
        self.reason = None if not problems else "; ".join(problems)
        return self


def run_check(check: Check, fn: Callable[[Check], Any]) -> Check:
    """Run ``fn(check)``; an exception makes the check ``fail`` with the error (never a crash)."""
    t0 = time.perf_counter()
    try:
        fn(check)
    except Exception as exc:  # a broken check is a failed check, the others still run
        check.status = FAIL
        check.reason = f"{type(exc).__name__}: {exc}"
        check.numbers["traceback"] = traceback.format_exc(limit=8)
    check.seconds = round(time.perf_counter() - t0, 2)
    if check.gpu and check.status == PASS and not check.numbers.get("cuda_device"):
        # a GPU check may only pass with a CUDA device it named
        check.status, check.reason = FAIL, "internal: GPU check passed without naming its CUDA device"
    return check


def environment(device: str) -> dict[str, Any]:
    """Versions and the device: Python, torch, CUDA, driver (from torch / NVML when present)."""
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "machine": platform.machine(), "device_asked": device,
                           "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        env["gpu_name"] = torch.cuda.get_device_name(0)
        env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
            env["cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            pynvml.nvmlShutdown()
        except Exception as exc:  # versions are informative; their absence is reported
            env["driver_error"] = f"{type(exc).__name__}: {exc}"
    return env


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write(out: Path, checks: list[Check], env: dict[str, Any], command: str) -> tuple[Path, Path]:
    """Write ``gpu-check.json`` and ``gpu-check.md`` under ``out`` (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    doc = {"command": command, "finished": when, "environment": env,
           "summary": {s: sum(1 for c in checks if c.status == s) for s in (PASS, FAIL, SKIPPED)},
           "checks": [_clean(asdict(c)) for c in checks]}
    jpath = out / "gpu-check.json"
    jpath.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    mpath = out / "gpu-check.md"
    mpath.write_text(render_markdown(doc), encoding="utf-8")
    return jpath, mpath


def render_markdown(doc: dict[str, Any]) -> str:
    """The summary: command, date, versions, one row per check, then each check's numbers."""
    env = doc["environment"]
    lines = ["# inferctl GPU check", "", f"Command: `{doc['command']}`  ", f"Finished: {doc['finished']}  ",
             "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), "",
             "| check | needs GPU | status | reason |", "|---|---|---|---|"]
    for c in doc["checks"]:
        reason = (c["reason"] or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {c['name']} ({c['title']}) | {'yes' if c['gpu'] else 'no'} | {c['status']} | {reason} |")
    for c in doc["checks"]:
        nums = {k: v for k, v in c["numbers"].items() if k not in ("traceback", "ids")}
        if not nums:
            continue
        lines += ["", f"## {c['name']}: {c['status']}", "", "```json",
                  json.dumps(nums, indent=1, default=str)[:6000], "```"]
    return "\n".join(lines) + "\n"
