"""Common NVIDIA data-center GPUs: memory and memory bandwidth, each number with its source.

Used by ``inferctl plan`` (:mod:`inferctl.tools.plan_compute`) to say which GPUs a model fits on and
the batch-1 decode bound (weight bytes ÷ memory bandwidth). The numbers are NVIDIA's own
datasheet/product-page figures (the SXM / top memory variant where a product has several):

* memory is the datasheet's "GPU memory" in GB, read here as 10⁹ bytes. That is on the safe
  side: the HBM parts carry binary gigabytes and the driver reports a little more (an
  "80GB" H100 shows 81,559 MiB = 85.5·10⁹ bytes in ``nvidia-smi``);
* bandwidth is the datasheet's "GPU memory bandwidth" in GB/s or TB/s (10⁹ / 10¹² bytes per
  second), a peak: measured streaming bandwidth is typically 80–90 % of it.

No module-level mutable state: :data:`GPUS` is a tuple of frozen records.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUS", "GpuSpec", "gpu_by_name"]

GB = 10 ** 9


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: ``memory_bytes`` (datasheet GB × 10⁹), ``bandwidth_bytes_per_s`` (peak),
    and ``source`` (the NVIDIA page or datasheet the two numbers come from)."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: int
    memory_type: str
    source: str


#: The table ``inferctl plan`` prints, largest memory first.
GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("H200 SXM 141GB", 141 * GB, 4_800 * GB, "HBM3e",
            "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 141GB, 4.8TB/s)"),
    GpuSpec("H100 SXM 80GB", 80 * GB, 3_350 * GB, "HBM3",
            "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 80GB, 3.35TB/s)"),
    GpuSpec("A100 SXM 80GB", 80 * GB, 2_039 * GB, "HBM2e",
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (A100 80GB SXM: 2,039GB/s)"),
    GpuSpec("A100 40GB", 40 * GB, 1_555 * GB, "HBM2",
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (A100 40GB PCIe/SXM: 1,555GB/s)"),
    GpuSpec("L40S 48GB", 48 * GB, 864 * GB, "GDDR6",
            "https://www.nvidia.com/en-us/data-center/l40s/ (48GB GDDR6 with ECC, 864GB/s)"),
    GpuSpec("A10 24GB", 24 * GB, 600 * GB, "GDDR6",
            "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (24GB GDDR6, 600GB/s)"),
    GpuSpec("L4 24GB", 24 * GB, 300 * GB, "GDDR6",
            "https://www.nvidia.com/en-us/data-center/l4/ (24GB, 300GB/s)"),
    GpuSpec("T4 16GB", 16 * GB, 320 * GB, "GDDR6",
            "https://www.nvidia.com/en-us/data-center/tesla-t4/ (16GB GDDR6, 320+ GB/s)"),
)


def gpu_by_name(name: str) -> GpuSpec:
    """The :data:`GPUS` entry whose name starts with ``name`` (case-insensitive, e.g. ``"h100"``).

    Raises:
        KeyError: no entry, or more than one, matches (the message lists the names).
    """
    hits = [g for g in GPUS if g.name.lower().startswith(name.strip().lower())]
    if len(hits) != 1:
        raise KeyError(f"{name!r} matches {len(hits)} GPUs; known: {', '.join(g.name for g in GPUS)}")
    return hits[0]
