"""The drill's settings and constants: phases, the stories260K stack calibration, :class:`DrillConfig`."""

from __future__ import annotations

import math
from dataclasses import dataclass

PHASES = ("baseline", "pressure", "int8", "recovery", "after")

#: The stack ``drill oom`` starts for stories260K when no ``--url`` is given: a memory budget
#: and engine limits measured on the real engine (tests/e2e/test_up_e2e.py) so that 16 concurrent
#: ~400-token prompts run out of memory in full precision and fit in int8: int8 weights
#: 284,496 B + KV pool 200 blocks × 20,480 B + the int8 run's peak step activations (~4.07 MiB)
#: + ~106 KB; full precision needs 755,632 B more for its weights.
STORIES_BUDGET = 8_760_000
STORIES_ENGINE_ARGS = ["--max-num-batched-tokens", "128", "--num-kv-blocks", "200", "--max-num-seqs", "16",
                       "--max-model-len", "512"]


class DrillError(RuntimeError):
    """The drill could not run (stack not reachable, no data, bad option)."""


# ------------------------------------------------------------------------------ settings
@dataclass
class DrillConfig:
    """Settings of one drill (seconds, characters, counts).

    Raises:
        DrillError: a value out of range (the message names it).
    """

    clients: int = 16
    baseline_clients: int = 2
    long_chars: int = 660         # ~400 tokens of English for a 512-token vocabulary
    short_chars: int = 120
    max_tokens: int = 32
    baseline_seconds: float = 3.0
    pressure_seconds: float = 30.0
    int8_seconds: float = 2.0
    recovery_seconds: float = 90.0
    after_seconds: float = 3.0
    poll_seconds: float = 0.1
    request_timeout: float = 120.0
    inject_fallback: bool = True
    seed: int = 1234

    def __post_init__(self) -> None:
        for name in ("clients", "baseline_clients", "long_chars", "short_chars", "max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DrillError(f"{name}: must be an integer >= 1, got {v!r}")
        if self.baseline_clients > self.clients:
            raise DrillError(f"baseline_clients: must be <= clients ({self.clients}), got {self.baseline_clients}")
        for name in ("baseline_seconds", "pressure_seconds", "int8_seconds", "recovery_seconds", "after_seconds",
                     "poll_seconds", "request_timeout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise DrillError(f"{name}: must be a number >= 0, got {v!r}")
        if self.poll_seconds <= 0 or self.request_timeout <= 0:
            raise DrillError("poll_seconds and request_timeout must be > 0")

