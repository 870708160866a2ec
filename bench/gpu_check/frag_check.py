"""Check 4, fragmentation from the real allocator.

A workload that leaves reserved-but-unallocated memory: the engine mid-run (requests still
running, so its activation cache stays reserved) plus holes punched in the caching allocator
(``holes`` tensors of 3 MiB + a few bytes, every other one freed). At that moment three ratios must be equal:

* the engine's ``/stats`` ``memory.fragmentation_ratio`` (its MemoryAccountant),
* the controller's: the bundled client's parse of that document (``snapshot_from_stats``)
  through ``signals.fragmentation_ratio`` — what the fragmentation policy and the exporter read,
* the allocator's own: ``torch.cuda.memory_stats()`` ``reserved_bytes.all.current`` and
  ``allocated_bytes.all.current`` (CUDA), or the simulated allocator's ``reserved`` and
  ``allocated`` (CPU half), as (reserved - allocated) / reserved.

The allocator is read before and after the engine's document; the sample counts only if both
reads agree (nothing was allocated in between).
"""

from __future__ import annotations

from pathlib import Path

TOLERANCE = 1e-9


def _allocator_numbers(engine, device: str) -> tuple[int, int]:
    import torch

    if device.startswith("cuda"):
        st = torch.cuda.memory_stats()
        return int(st["reserved_bytes.all.current"]), int(st["allocated_bytes.all.current"])
    sim = engine.accountant._sim   # the CPU accountant's SimulatedCachingAllocator
    return int(sim.reserved), int(sim.allocated)


def fragmentation_sample(stories_bin: Path, device: str, holes: int = 16) -> tuple[dict, list[str]]:
    """Run the workload on ``device`` and compare the three ratios (module doc)."""
    import torch

    from bench.gpu_check.engine_check import cuda_fraction_restored
    from inferctl.controller.engines.bundled import snapshot_from_stats
    from inferctl.controller.signals import fragmentation_ratio
    from inferctl.engine.config import EngineConfig
    from inferctl.engine.engine import LLMEngine
    from inferctl.engine.loader import load_llama2c
    from inferctl.engine.sampling_params import SamplingParams

    problems: list[str] = []
    kept: list = []
    with cuda_fraction_restored():
        cuda = device.startswith("cuda")
        bundle = load_llama2c(stories_bin, device=device, dtype=torch.float32)
        cfg = EngineConfig(device=device, max_num_seqs=16, num_kv_blocks=256, max_num_batched_tokens=256,
                           memory_budget_bytes=None if cuda else 64 << 20)
        eng = LLMEngine(bundle, cfg)
        ids = bundle.tokenizer.encode("Once upon a time there was a little dog who liked to run in the park")
        for i in range(12):
            eng.add_request(f"f{i}", ids * (1 + i % 4), SamplingParams(max_tokens=64, temperature=0.0,
                                                                       ignore_eos=True))
        for _ in range(6):   # mid-run: prefill done, decoding; the activation cache stays reserved
            eng.step()
        if cuda:
            blocks = [torch.empty((3 << 20) + 4096 * i, dtype=torch.uint8, device=device) for i in range(holes)]
            kept = blocks[::2]
            del blocks
        before = _allocator_numbers(eng, device)
        doc = eng.stats()
        after = _allocator_numbers(eng, device)
        snap = snapshot_from_stats(doc, name="main")
        ctl = fragmentation_ratio(snap.memory_reserved_bytes, snap.memory_allocated_bytes).value
        reserved, allocated = before
        alloc_ratio = (reserved - allocated) / reserved if reserved else None
        eng_ratio = doc["memory"]["fragmentation_ratio"]
        nums = {"device": device, "allocator_reserved_bytes": reserved, "allocator_allocated_bytes": allocated,
                "allocator_unallocated_bytes": reserved - allocated, "allocator_ratio": alloc_ratio,
                "engine_ratio": eng_ratio, "controller_ratio": ctl,
                "engine_memory_source": doc["memory"].get("source"), "running_requests":
                doc["engine"]["unfinished_requests"], "allocator_stable_across_read": before == after}
        if before != after:
            problems.append(f"the allocator changed while the engine's document was built ({before} -> {after})")
        if alloc_ratio is None or alloc_ratio <= 0:
            problems.append(f"the workload left no reserved-but-unallocated memory (ratio {alloc_ratio})")
        for name, v in (("engine", eng_ratio), ("controller", ctl)):
            if v is None or alloc_ratio is None or abs(v - alloc_ratio) > TOLERANCE:
                problems.append(f"{name} ratio {v} != allocator ratio {alloc_ratio}")
        eng.abort_all()
        while eng.has_unfinished_requests():
            eng.step()
        del eng, bundle, kept
    return nums, problems
