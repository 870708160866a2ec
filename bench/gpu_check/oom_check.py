"""Check 3, a real CUDA out-of-memory and the controller's switch to int8 (GPU only).

1. Calibrate, in a fresh process (``python -m bench.gpu_check.oom_check calibrate``): the
   random-weight SmolLM2-shaped model in float32 on CUDA under the stack's engine settings; the
   peak memory this process reserved (``torch.cuda.max_memory_reserved``) under the baseline load
   (2 short prompts) and under the pressure load (16 long prompts, ``CLIENTS``) in full precision,
   and under the pressure load in int8. The budget is the middle of the full-precision window:
   baseline fits, pressure does not, and int8 (weights ~4x smaller) fits under pressure.
2. ``inferctl up`` (tools.drill.stack) with that engine on CUDA, ``--memory-budget`` = the
   budget (the engine's accountant turns it into ``torch.cuda.set_per_process_memory_fraction``,
   so the CUDA caching allocator itself raises ``torch.OutOfMemoryError``; only the engine's own
   process is limited), and the controller's GPU source ``nvml``.
3. The drill (tools.drill.scenario.run_drill) with injection OFF: baseline, pressure until a real
   OOM, int8, recovery, rollback. Pass: the OOM's source is ``cuda`` (not injected), the first
   int8 token within 1 s of it, 0 failed and 0 lost requests, rolled back to full; the event log's
   OOM and switch events are reported with their numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

CLIENTS = 16
LONG_WORDS, SHORT_WORDS, MAX_TOKENS = 900, 60, 32
ENGINE_ARGS = ["--device", "cuda", "--dtype", "float32", "--max-num-batched-tokens", "2048",
               "--num-kv-blocks", str(CLIENTS * ((LONG_WORDS + MAX_TOKENS + 2) // 16 + 2)),
               "--max-num-seqs", str(CLIENTS), "--max-model-len", "1024"]
MIN_WINDOW_BYTES = 16 << 20
SWITCH_TARGET_SECONDS = 1.0


def passages(n: int, words: int, seed: int) -> list[str]:
    """Texts of exactly ``words`` word-level tokens of the bench models' tokenizer (``w<i>``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(f"w{int(i)}" for i in rng.integers(0, 40000, words)) for _ in range(n)]


def calibrate(model_dir: Path) -> dict:
    """Peak reserved bytes of a fresh CUDA process (module doc, step 1)."""
    import torch

    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.loader import load_model
    from inferctl.engine.sampling_params import SamplingParams

    bundle = load_model(str(model_dir), device="cuda", dtype=torch.float32)
    blocks = int(ENGINE_ARGS[ENGINE_ARGS.index("--num-kv-blocks") + 1])
    eng = LLMEngine(bundle, EngineConfig(device="cuda", max_num_batched_tokens=2048, num_kv_blocks=blocks,
                                         max_num_seqs=CLIENTS, max_model_len=1024))
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

    def load(texts: list[str], tag: str) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for i, t in enumerate(texts):
            eng.add_request(f"{tag}{i}", bundle.tokenizer.encode(t), sp)
        while eng.has_unfinished_requests():
            eng.step()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_reserved())

    load(passages(2, SHORT_WORDS, 1), "warm")
    out = {"baseline_full": load(passages(2, SHORT_WORDS, 2), "b"),
           "pressure_full": load(passages(CLIENTS, LONG_WORDS, 3), "p")}
    eng.request_precision("int8")
    eng.step()
    torch.cuda.empty_cache()
    out["pressure_int8"] = load(passages(CLIENTS, LONG_WORDS, 4), "q")
    out["weights_by_mode"] = bundle.model.weight_bytes_by_mode()
    return out


def _calibrate_subprocess(model_dir: Path, timeout: float = 240.0) -> dict:
    res = subprocess.run([sys.executable, "-m", "bench.gpu_check.oom_check", "calibrate", str(model_dir)],
                         capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"calibration failed (exit {res.returncode}): {res.stderr[-1500:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def real_oom(model_dir: Path, workdir: Path | None = None) -> tuple[dict, list[str]]:
    """Steps 1-3 of the module doc; returns the numbers and the problems found."""
    import httpx
    import torch

    from inferctl.tools.drill.config import DrillConfig
    from inferctl.tools.drill.scenario import run_drill
    from inferctl.tools.drill.stack import stack_config, start_stack

    problems: list[str] = []
    cal = _calibrate_subprocess(model_dir)
    window = cal["pressure_full"] - cal["baseline_full"]
    budget = cal["baseline_full"] + window // 2
    nums: dict = {"cuda_device": torch.cuda.get_device_name(0), "calibration": cal, "budget_bytes": budget,
                  "engine_args": ENGINE_ARGS}
    if window < MIN_WINDOW_BYTES:
        return nums, [f"calibration: full-precision window {window} B < {MIN_WINDOW_BYTES} B"]
    if cal["pressure_int8"] >= budget:
        return nums, [f"calibration: int8 under pressure needs {cal['pressure_int8']} B >= budget {budget} B"]
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gpu-check-oom-"))
    conf = stack_config(str(model_dir), workdir, str(budget), ENGINE_ARGS, hold_seconds=3.0, poll_seconds=0.1)
    conf["gpu"] = {"kind": "nvml"}
    conf["intervals"]["gpu_poll_seconds"] = 0.5
    stack = start_stack(conf, workdir, timeout=180.0)
    try:
        status = httpx.get(f"{stack.controller_url}/status", timeout=5.0).json()
        nums["controller_gpu_source"] = {k: v for k, v in status.items() if "gpu" in k.lower()}
        cfg = DrillConfig(clients=CLIENTS, baseline_clients=2, max_tokens=MAX_TOKENS, baseline_seconds=3.0,
                          pressure_seconds=30.0, recovery_seconds=30.0, after_seconds=2.0, poll_seconds=0.05,
                          inject_fallback=False)
        rep = run_drill(stack.engine_url, stack.controller_url, longs=passages(64, LONG_WORDS, 5),
                        shorts=passages(16, SHORT_WORDS, 6), config=cfg, token=stack.token, engine_name="main")
    finally:
        code = stack.stop()
    s = rep.summary()
    nums.update(summary=s, oom=rep.oom, stack_exit=code, log=str(stack.log), notes=rep.notes,
                events=[e for e in rep.events if e.get("kind") in ("transition", "action", "fault")][:12])
    if rep.oom is None:
        problems.append("no OOM happened under the pressure load")
    else:
        if s["oom_source"] != "cuda" or s["oom_injected_by_drill"]:
            problems.append(f"the OOM was not a real CUDA one (source {s['oom_source']}, "
                            f"injected {s['oom_injected_by_drill']})")
        lat = s["switch_latency_seconds"]
        if lat is None or lat > SWITCH_TARGET_SECONDS:
            problems.append(f"switch to int8 took {lat} s (target <= {SWITCH_TARGET_SECONDS} s)")
    req = s["requests"]
    if req.get("failed") or req.get("lost"):
        problems.append(f"requests failed {req.get('failed')}, lost {req.get('lost')}")
    if not s["rolled_back"] or s["final_precision"] != "full":
        problems.append(f"no rollback to full (final precision {s['final_precision']})")
    return nums, problems


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "calibrate":
        print(json.dumps(calibrate(Path(sys.argv[2]))))
    else:
        sys.exit("usage: python -m bench.gpu_check.oom_check calibrate MODEL_DIR")
