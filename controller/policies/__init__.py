"""Policies: explicit state machines that decide and never act.

Each policy takes snapshots (and ``now``, passed in) and returns
:class:`~controller.types.Decision` objects; the loop executes them and records every one as
an event. See docs/policies.md for states, transitions and defaults.
"""

from inferctl.controller.policies.breaker import BreakerConfig, BreakerState, LatencyBreaker
from inferctl.controller.policies.common import PolicyError
from inferctl.controller.policies.fragmentation import (FragmentationConfig, FragmentationPolicy,
                                               FragmentationState)
from inferctl.controller.policies.hardware import (DEFAULT_XID_ACTIONS, GpuHealth, HardwareConfig,
                                          HardwarePolicy)
from inferctl.controller.policies.precision import PrecisionConfig, PrecisionPolicy, PrecisionState

__all__ = [
    "BreakerConfig", "BreakerState", "LatencyBreaker",
    "FragmentationConfig", "FragmentationPolicy", "FragmentationState",
    "DEFAULT_XID_ACTIONS", "GpuHealth", "HardwareConfig", "HardwarePolicy",
    "PrecisionConfig", "PrecisionPolicy", "PrecisionState", "PolicyError",
]
