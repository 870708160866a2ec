"""inferctl's control plane: observe GPUs and engines, decide, act, record."""

__version__ = "0.1.0"
