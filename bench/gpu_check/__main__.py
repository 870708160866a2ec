"""``python -m bench.gpu_check --out DIR [--quick] [--device auto|cuda|cpu] [--stories DIR] [--cache DIR]``

Runs the five checks (bench/gpu_check/__init__.py) and writes DIR/gpu-check.json and
DIR/gpu-check.md. Exit 0 when no check failed, 1 when one did, 2 for bad options (e.g.
``--device cuda`` without CUDA). A GPU check without a CUDA device is ``skipped: no CUDA device``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.gpu_check.report import FAIL, NO_CUDA, Check, environment, run_check, write

ROOT = Path(__file__).resolve().parents[2]


def stories_dir(arg: str | None) -> Path:
    """--stories, else $INFERCTL_STORIES260K, else ../shared/models/stories260K (from the repo root)."""
    return Path(arg or os.environ.get("INFERCTL_STORIES260K") or ROOT.parent / "shared" / "models" / "stories260K")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu-check.json and gpu-check.md")
    ap.add_argument("--quick", action="store_true", help="small sizes (CI: the CPU mode in about a minute)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--stories", help="folder with stories260K.bin and tok512.bin")
    ap.add_argument("--cache", type=Path, default=None,
                    help="folder for the generated models and the OOM stack's files (default: OUT/cache)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    a = ap.parse_args(argv)

    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    cuda = a.device != "cpu" and torch.cuda.is_available()
    no_cuda = NO_CUDA if a.device != "cpu" or not torch.cuda.is_available() else NO_CUDA + " (--device cpu)"
    stories = stories_dir(a.stories)
    stories_bin = stories / "stories260K.bin"
    if not stories_bin.is_file():
        print(f"error: --stories: {stories_bin} not found", file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    cache = a.cache or a.out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    checks: list[Check] = []

    def add(name: str, title: str, gpu: bool, fn) -> Check:
        c = Check(name, title, gpu)
        checks.append(c)
        if gpu and not cuda:
            return c.skip(no_cuda)
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        run_check(c, fn)
        print(f"gpu_check: {name}: {c.status} {c.reason or ''}", file=sys.stderr, flush=True)
        return c

    # 1. NVML
    def nvml(c: Check) -> None:
        from bench.gpu_check.nvml_check import nvml_available, nvml_readings

        why = nvml_available()
        if why is not None:
            c.skip(f"skipped: NVML not usable here ({why})")
            return
        nums, problems = nvml_readings()
        c.numbers.update(nums)
        c.verdict(problems)

    add("nvml", "NVML readings vs torch and nvidia-smi", True, nvml)

    # 2. engine: CPU reference, CUDA against it, speed beside transformers
    ref: dict = {}

    def cpu_ref(c: Check) -> None:
        from bench.gpu_check.engine_check import NEAR_TIE, cpu_reference, first_near_tie

        r, problems = cpu_reference(stories_bin)
        ref.update(r)
        c.numbers.update(dtype="float32", tokens=len(r["ids"]), text=r["text"], ids=r["ids"],
                         min_top2_margin=min(r["margins"]), near_tie_threshold=NEAR_TIE,
                         first_near_tie=first_near_tie(r["margins"]))
        c.verdict(problems)

    add("engine_cpu_reference", "stories260K greedy on CPU = llama2.c reference", False, cpu_ref)

    def cuda_ref(c: Check) -> None:
        from bench.gpu_check.engine_check import cuda_against_reference

        if not ref:
            c.skip("skipped: the CPU reference did not run")
            return
        nums, problems = cuda_against_reference(stories_bin, ref)
        c.numbers.update(nums, cuda_device=torch.cuda.get_device_name(0), checked_dtype="float32")
        c.verdict(problems)

    add("engine_cuda_reference", "stories260K greedy on CUDA = CPU reference up to the first near-tie", True,
        cuda_ref)

    def speed(device: str):
        def fn(c: Check) -> None:
            from bench.gpu_check.engine_check import bench_models, speed_table

            big = device == "cuda"
            batches = (1, 32) if big else (1, 4)
            plen = olen = (64 if a.quick else 128) if big else 16
            dtype = torch.bfloat16 if big else torch.float32
            models = bench_models(cache, stories_bin, big)
            table = speed_table(models, device, dtype, batches, plen, olen, a.threads)
            c.numbers.update(dtype=str(dtype).replace("torch.", ""), prompt_tokens=plen, output_tokens=olen,
                             tok_s=table)
            if big:
                c.numbers["cuda_device"] = torch.cuda.get_device_name(0)
            bad = [f"{m} batch {b}: {r}" for m, rows in table.items() for b, r in rows.items()
                   if not (r["engine_tok_s"] > 0 and r["hf_tok_s"] > 0)]
            c.verdict(bad)
        return fn

    if cuda:
        checks.append(Check("engine_speed_cpu", "engine vs transformers on CPU (tiny sizes)", False)
                      .skip("skipped: the CUDA speed check runs instead"))
    else:
        add("engine_speed_cpu", "engine vs transformers on CPU (tiny sizes)", False, speed("cpu"))
    add("engine_speed_cuda", "engine vs transformers on CUDA: stories260K and SmolLM2-135M shape", True,
        speed("cuda"))

    # 3. real CUDA OOM
    def oom(c: Check) -> None:
        from bench.gpu_check.engine_check import bench_models
        from bench.gpu_check.oom_check import real_oom

        model = bench_models(cache, stories_bin, big=True)["smollm2-135m-shape-random"]
        nums, problems = real_oom(model, cache / "oom-stack")
        c.numbers.update(nums)
        c.verdict(problems)

    add("cuda_oom", "real CUDA OOM -> int8 within 1 s, 0 failed, rollback (nvml source)", True, oom)

    # 4. fragmentation
    def frag(device: str):
        def fn(c: Check) -> None:
            from bench.gpu_check.frag_check import fragmentation_sample

            nums, problems = fragmentation_sample(stories_bin, device)
            c.numbers.update(nums)
            if device == "cuda":
                c.numbers["cuda_device"] = torch.cuda.get_device_name(0)
            c.verdict(problems)
        return fn

    add("fragmentation_cpu", "fragmentation ratio: engine = controller = simulated allocator", False,
        frag("cpu"))
    add("fragmentation_cuda", "fragmentation ratio: engine = controller = torch.cuda.memory_stats", True,
        frag("cuda"))

    # 5. reset rails, dry run only
    def reset(c: Check) -> None:
        import shutil

        from bench.gpu_check.reset_check import reset_dry_run

        if shutil.which("nvidia-smi") is None:
            c.skip("skipped: nvidia-smi not found on PATH")
            return
        nums, problems = reset_dry_run()
        c.numbers.update(nums)
        c.verdict(problems)

    add("reset_dry_run", "GPU reset rails, dry run only (never a reset)", True, reset)

    cmd = "python -m bench.gpu_check " + " ".join(argv if argv is not None else sys.argv[1:])
    jpath, mpath = write(a.out, checks, environment(a.device), cmd)
    for c in checks:
        print(f"{c.status:8} {c.name}: {c.reason or ''}")
    print(f"wrote {jpath} and {mpath}")
    return 1 if any(c.status == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
