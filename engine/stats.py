"""EngineStats: the engine's counters, latency windows, recent requests and faults.

Holds what ``/stats`` reports (docs/architecture.md) apart from live gauges (queues, KV,
memory), which the engine reads at :meth:`LLMEngine.stats` time. Latency quantiles are
computed over the last ``latency_window`` samples with linear interpolation (numpy's default
``percentile`` method); with no sample they are ``None`` (no data, never 0).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from inferctl.contract.stats import FINISH_REASONS
from inferctl.engine.quality import OutputQuality



def quantiles(samples: deque | list) -> dict:
    """``{"p50", "p90", "p99", "count"}`` of ``samples`` (seconds); quantiles None if empty."""
    if not samples:
        return {"p50": None, "p90": None, "p99": None, "count": 0}
    p50, p90, p99 = np.percentile(np.fromiter(samples, dtype=np.float64), [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "count": len(samples)}


class EngineStats:
    """Cumulative counters and bounded windows.

    Args:
        latency_window: samples kept per latency series.
        recent_requests: finished requests kept for ``requests.recent``.
        recent_faults: faults kept for ``faults.recent``.
    """

    def __init__(self, latency_window: int = 4096, recent_requests: int = 64, recent_faults: int = 32):
        self.started = time.monotonic()
        self.steps_total = 0
        self.step_sequences_total = 0
        self.real_tokens_total = 0
        self.padded_tokens_total = 0
        self.last_step = {"batch_size": 0, "real_tokens": 0, "padded_tokens": 0,
                          "prefill_tokens": 0, "decode_tokens": 0, "duration_seconds": 0.0}
        self.finished_total = 0
        self.by_finish_reason = {r: 0 for r in FINISH_REASONS}
        self.errors_total = 0
        self.admission_errors_total = 0
        self.prompt_tokens_total = 0
        self.completion_tokens_total = 0
        self.nonfinite_logprobs_total = 0
        self.degenerate_total = 0
        self.step_errors_total = 0
        self.last_step_error: str | None = None
        self.ttft: deque[float] = deque(maxlen=latency_window)
        self.itl: deque[float] = deque(maxlen=latency_window)
        self.e2e: deque[float] = deque(maxlen=latency_window)
        self.recent: deque[dict] = deque(maxlen=recent_requests)
        self.oom_total = 0
        self.oom_by_kind = {"fragmentation": 0, "exhaustion": 0, "impossible": 0}
        self.faults: deque[dict] = deque(maxlen=recent_faults)
        self.last_oom: dict | None = None
        self._fault_id = 0

    def record_step(self, batch_size: int, real_tokens: int, prefill_tokens: int,
                    decode_tokens: int, duration: float, padded_tokens: int = 0) -> None:
        self.steps_total += 1
        self.step_sequences_total += batch_size
        self.real_tokens_total += real_tokens
        self.padded_tokens_total += padded_tokens
        ls = self.last_step
        ls["batch_size"] = batch_size
        ls["real_tokens"] = real_tokens
        ls["padded_tokens"] = padded_tokens
        ls["prefill_tokens"] = prefill_tokens
        ls["decode_tokens"] = decode_tokens
        ls["duration_seconds"] = duration

    def record_finished(self, request_id: str, prompt_tokens: int, completion_tokens: int,
                        finish_reason: str, ttft: float | None, e2e: float | None,
                        quality: OutputQuality | None, precision: str | None,
                        preemptions: int = 0, error: str | None = None) -> dict:
        """Count a finished request; returns its ``recent`` entry."""
        self.finished_total += 1
        self.by_finish_reason[finish_reason] = self.by_finish_reason.get(finish_reason, 0) + 1
        if finish_reason == "error":
            self.errors_total += 1
        self.completion_tokens_total += completion_tokens
        if e2e is not None:
            self.e2e.append(e2e)
        entry = {"request_id": request_id, "prompt_tokens": prompt_tokens,
                 "completion_tokens": completion_tokens, "finish_reason": finish_reason,
                 "ttft_seconds": ttft, "e2e_seconds": e2e, "precision": precision,
                 "preemptions": preemptions, "error": error}
        if quality is not None:
            q = quality.to_dict()
            entry.update(seq_rep=q["seq_rep"], distinct=q["distinct"], perplexity=q["perplexity"],
                         degenerate=q["degenerate"], nonfinite_logprobs=q["nonfinite_logprobs"],
                         prompt_len_bucket=q["prompt_len_bucket"])
            self.nonfinite_logprobs_total += quality.nonfinite_logprobs
            if quality.degenerate:
                self.degenerate_total += 1
        else:
            entry.update(seq_rep=None, distinct=None, perplexity=None, degenerate=None,
                         nonfinite_logprobs=None, prompt_len_bucket=None)
        self.recent.append(entry)
        return entry

    def record_fault(self, kind: str, info, message: str, requeued: int, failed: int,
                     precision: str, source: str, action: str) -> dict:
        """Record an OOM fault; returns its entry (``faults.recent``)."""
        self._fault_id += 1
        self.oom_total += 1
        self.oom_by_kind[kind] = self.oom_by_kind.get(kind, 0) + 1
        entry = {"id": self._fault_id, "time": time.time(), "kind": kind,
                 "requested_bytes": info.requested_bytes, "free_bytes": info.free_bytes,
                 "allocated_bytes": info.allocated_bytes,
                 "reserved_unallocated_bytes": info.reserved_unallocated_bytes,
                 "total_bytes": info.total_bytes, "fragmentation_ratio": info.fragmentation_ratio,
                 "message": message, "requeued_requests": requeued, "failed_requests": failed,
                 "precision": precision, "source": source, "action": action}
        self.faults.append(entry)
        self.last_oom = entry
        return entry

    def to_dict(self) -> dict:
        """The counter parts of ``/stats`` (scheduler counters, requests, quality, faults)."""
        return {
            "scheduler": {"steps_total": self.steps_total,
                          "step_sequences_total": self.step_sequences_total,
                          "real_tokens_total": self.real_tokens_total,
                          "padded_tokens_total": self.padded_tokens_total,
                          "last_step": dict(self.last_step),
                          "step_errors_total": self.step_errors_total,
                          "last_step_error": self.last_step_error},
            "requests": {"finished_total": self.finished_total,
                         "by_finish_reason": dict(self.by_finish_reason),
                         "errors_total": self.errors_total,
                         "admission_errors_total": self.admission_errors_total,
                         "prompt_tokens_total": self.prompt_tokens_total,
                         "completion_tokens_total": self.completion_tokens_total,
                         "ttft_seconds": quantiles(self.ttft),
                         "itl_seconds": quantiles(self.itl),
                         "e2e_seconds": quantiles(self.e2e),
                         "recent": list(self.recent)},
            "quality": {"nonfinite_logprobs_total": self.nonfinite_logprobs_total,
                        "degenerate_total": self.degenerate_total},
            "faults": {"oom_total": self.oom_total, "oom_by_kind": dict(self.oom_by_kind),
                       "last_oom": self.last_oom, "recent": list(self.faults)},
        }
