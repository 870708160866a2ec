"""The GPU-source factory: build a source by kind (``auto``, ``nvml``, ``dcgm``, ``replay``, ``sim``).

It lives apart from :mod:`controller.gpu.base` because it imports every source, while every
source imports ``base`` for the interface.
"""

from __future__ import annotations

import logging
from typing import Any

from inferctl.controller.gpu.base import GpuSource
from inferctl.controller.gpu.dcgm import DcgmGpuSource
from inferctl.controller.gpu.nvml import NvmlGpuSource, probe_nvml
from inferctl.controller.gpu.replay import ReplayGpuSource
from inferctl.controller.gpu.sim import SimGpuSource

log = logging.getLogger(__name__)

SOURCE_KINDS = ("auto", "nvml", "dcgm", "replay", "sim")


def make_gpu_source(kind: str = "auto", **options: Any) -> GpuSource:
    """Build a GPU source by kind.

    ``kind``: ``"nvml"`` (options: ``nvml`` module, ``timeout_s``, ``poll_interval_s``, ...),
    ``"dcgm"`` (``url`` required, ``timeout_s``), ``"replay"`` (``path`` or ``captures``, ``mode``),
    ``"sim"`` (``engine_stats_url`` or ``stats_fn``), or ``"auto"``: NVML if ``nvmlInit()`` works,
    else the simulated GPU with a loud WARNING (no NVIDIA driver found). Options a kind does not
    take are ignored by ``auto`` for the kind it did not pick.

    Raises ``ValueError`` naming ``kind`` for an unknown kind, and whatever the chosen class
    raises for bad options (e.g. a missing ``url``).
    """
    kind = (kind or "auto").strip().lower()
    if kind not in SOURCE_KINDS:
        raise ValueError(f"gpu source kind {kind!r} is not one of {', '.join(SOURCE_KINDS)}")
    if kind == "nvml":
        return NvmlGpuSource(**_only(options, NvmlGpuSource.OPTIONS))
    if kind == "dcgm":
        return DcgmGpuSource(**_only(options, DcgmGpuSource.OPTIONS))
    if kind == "replay":
        return ReplayGpuSource(**_only(options, ReplayGpuSource.OPTIONS))
    if kind == "sim":
        return SimGpuSource(**_only(options, SimGpuSource.OPTIONS))
    # auto
    nvml_module = options.get("nvml")
    reason = probe_nvml(nvml_module)
    if reason is None:
        log.info("gpu source: NVML is available, using it")
        return NvmlGpuSource(**_only(options, NvmlGpuSource.OPTIONS))
    log.warning(
        "gpu source: no NVIDIA driver found (%s); using the SIMULATED GPU, whose memory is the "
        "engine's own accounting. GPU numbers shown are not from real hardware.", reason)
    return SimGpuSource(**_only(options, SimGpuSource.OPTIONS))


def _only(options: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """The options a source class takes (its ``OPTIONS``); the rest are dropped."""
    return {k: v for k, v in options.items() if k in allowed}
