"""The engine's live numbers (:class:`~inferctl.engine.stats.SchedulerStats`) and its ``/stats`` document.

Two readers, two moments:

* ``/metrics`` — the step publishes :func:`live_numbers`, one tuple of plain reads (queues, KV
  pool, memory, mode), as its last act; a scrape turns the latest tuple into a
  :class:`SchedulerStats` (:func:`scheduler_stats`) and sets the gauges from it
  (:class:`~inferctl.engine.stat_loggers.PrometheusStatLogger`). The tuple is replaced by one
  assignment, so a scrape from another thread always reads one step's numbers together and never
  waits for the step in flight.
* ``/stats`` — :func:`build_stats_document`, taken between steps under the engine's step lock,
  reads the numbers fresh.

Both compute the KV ratios with :meth:`~inferctl.engine.block_manager.BlockManager.kv_ratios`, so
they equal what the per-step gauge updates used to show.
"""

from __future__ import annotations

import time

from inferctl.contract.stats import MEMORY_CUDA, MEMORY_SIMULATED
from inferctl.engine import __version__
from inferctl.engine.stats import SchedulerStats

#: The field order of :func:`live_numbers`' tuple.
LIVE_FIELDS = ("running", "waiting", "preemptions_total", "kv_blocks_used", "kv_blocks_free", "kv_tokens_stored",
               "allocated_bytes", "reserved_bytes", "weights_bytes", "precision", "draining", "pending_injected")


def live_numbers(engine) -> tuple:
    """The engine's live numbers in :data:`LIVE_FIELDS` order (requests, blocks, tokens, bytes,
    the precision mode, the drain flag, injected OOMs pending): plain reads, no device query
    beyond the accountant's (CUDA: ``torch.cuda.memory_allocated``/``memory_reserved``)."""
    bm, sch, acct = engine.block_manager, engine.scheduler, engine.accountant
    return (len(sch.running), len(sch.waiting), sch.preemptions_total, bm.num_used_blocks, bm.num_free_blocks,
            bm.tokens_stored, acct.allocated_bytes, acct.reserved_bytes, acct.bytes_by_tag("weights"),
            engine.precision, engine.draining, acct.pending_injected_ooms)


def scheduler_stats(numbers: tuple, block_manager) -> SchedulerStats:
    """The :class:`SchedulerStats` of a :func:`live_numbers` tuple; the KV usage and waste ratios
    from ``block_manager.kv_ratios`` (the pool's size and block size)."""
    (running, waiting, preemptions, used, free, tokens, allocated, reserved, weights, precision, draining,
     pending) = numbers
    usage, waste = block_manager.kv_ratios(used, tokens)
    return SchedulerStats(running=running, waiting=waiting, preemptions_total=preemptions, kv_blocks_used=used,
                          kv_blocks_free=free, kv_usage_ratio=usage, kv_waste_ratio=waste, kv_tokens_stored=tokens,
                          allocated_bytes=allocated, reserved_bytes=reserved, weights_bytes=weights,
                          precision=precision, draining=draining, pending_injected=pending)


def build_stats_document(engine) -> dict:
    """The ``/stats`` document of ``engine`` (an :class:`~inferctl.engine.engine.LLMEngine`;
    :class:`inferctl.contract.stats.StatsDocument`, docs/architecture.md); JSON-ready. The caller
    holds the step lock."""
    cfg, acct = engine.config, engine.accountant
    live = scheduler_stats(live_numbers(engine), engine.block_manager)
    snap = acct.snapshot()
    reserved = snap["reserved_bytes"]
    sections = engine.stats_.sections(live)
    by_mode = engine._weight_bytes_by_mode
    return {
        "engine": {"model": engine.model_name, "models": [engine.model_name], "device": str(engine.device),
                   "precision": engine.precision, "requested_precision": engine.requested_precision,
                   "precision_error": engine._precision_error,
                   "kv_cache_dtype": engine.kv_cache.dtype_name, "draining": engine.draining,
                   "uptime_seconds": time.time() - engine.started_wall, "version": __version__,
                   "max_model_len": cfg.max_model_len, "max_num_seqs": cfg.max_num_seqs,
                   "max_num_batched_tokens": cfg.max_num_batched_tokens,
                   "unfinished_requests": len(engine._seqs)},
        "memory": {"budget_bytes": snap["budget_bytes"], "allocated_bytes": snap["allocated_bytes"],
                   "reserved_bytes": reserved, "free_bytes": snap["free_bytes"],
                   "reserved_unallocated_bytes": snap["reserved_unallocated_bytes"],
                   "fragmentation_ratio": (snap["reserved_unallocated_bytes"] / reserved
                                           if reserved > 0 else None),
                   "weights_bytes": snap["weights_bytes"], "kv_pool_bytes": snap["kv_pool_bytes"],
                   "activation_bytes": snap["activation_bytes"],
                   "draft_weights_bytes": snap["draft_weights_bytes"],
                   "draft_kv_pool_bytes": snap["draft_kv_pool_bytes"],
                   "full_weights_bytes": by_mode.get("full"),
                   "int8_weights_bytes": by_mode.get("int8"),
                   "source": MEMORY_CUDA if acct.is_cuda else MEMORY_SIMULATED},
        "kv_cache": {"block_size": cfg.block_size, "num_blocks": engine.block_manager.num_blocks,
                     "blocks_used": live.kv_blocks_used, "blocks_free": live.kv_blocks_free,
                     "tokens_stored": live.kv_tokens_stored, "waste_ratio": live.kv_waste_ratio,
                     "usage_ratio": live.kv_usage_ratio, "bytes_per_block": engine.kv_bytes_per_block},
        **sections,
        **({"spec_decode": engine.spec.stats(engine.precision)} if engine.spec else {}),
    }
