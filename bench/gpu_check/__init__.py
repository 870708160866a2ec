"""GPU truth: one command that checks every GPU-only claim of inferctl on a real NVIDIA GPU.

    python -m bench.gpu_check --out DIR [--quick] [--device cuda|cpu] [--stories DIR]

Writes ``DIR/gpu-check.json`` and ``DIR/gpu-check.md``. Each check is named and has a status,
``pass`` | ``fail`` | ``skipped`` (with the reason), and its numbers. A GPU check is never
``pass`` without a CUDA device: on a machine without one it is ``skipped: no CUDA device``,
and the CPU halves (the CPU greedy reference, the engine beside transformers on CPU, the
simulated allocator's fragmentation ratio) run instead. docs/gpu-verification.md says how to
run it on a GPU and holds the results of the runs made there.

Modules: :mod:`.report` (results, JSON and markdown), :mod:`.nvml_check` (1), :mod:`.engine_check`
(2), :mod:`.oom_check` (3), :mod:`.frag_check` (4), :mod:`.reset_check` (5).
"""
