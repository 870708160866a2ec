"""Engine clients behind one interface (HTTP only; the controller never imports ``engine``).

``make_engine_client(kind, name, base_url, **options)`` builds one: ``"bundled"``
(:class:`BundledEngineClient`, ``/stats`` + ``/admin/*``) or a Prometheus-text engine
``"vllm"``, ``"tgi"``, ``"llamacpp"`` (:class:`PromTextEngineClient`).
"""

from __future__ import annotations

from typing import Any

from inferctl.controller.engines.base import EngineAdminError, EngineClient, failed_snapshot
from inferctl.controller.engines.bundled import BundledEngineClient, snapshot_from_stats
from inferctl.controller.engines.promtext import (
    CORE_FIELDS, FLAVORS, PromTextEngineClient, parse_prometheus_text, snapshot_from_metrics_text)

ENGINE_KINDS = ("bundled",) + FLAVORS


def make_engine_client(kind: str, name: str, base_url: str, **options: Any) -> EngineClient:
    """Build an engine client. ``kind``: bundled, vllm, tgi, llamacpp. Options: ``timeout_s``,
    ``admin_token`` (bundled), ``metrics_path``/``headers`` (Prometheus-text), ``transport``.
    Raises ``ValueError`` naming ``kind`` for an unknown kind."""
    kind = (kind or "").strip().lower()
    if kind == "bundled":
        allowed = ("admin_token", "timeout_s", "transport")
        return BundledEngineClient(name, base_url, **{k: v for k, v in options.items() if k in allowed})
    if kind in FLAVORS:
        allowed = ("timeout_s", "metrics_path", "headers", "transport")
        return PromTextEngineClient(name, base_url, kind,
                                    **{k: v for k, v in options.items() if k in allowed})
    raise ValueError(f"engine kind {kind!r} is not one of {', '.join(ENGINE_KINDS)}")


__all__ = [
    "BundledEngineClient", "CORE_FIELDS", "ENGINE_KINDS", "EngineAdminError", "EngineClient",
    "FLAVORS", "PromTextEngineClient", "failed_snapshot", "make_engine_client",
    "parse_prometheus_text", "snapshot_from_metrics_text", "snapshot_from_stats",
]
