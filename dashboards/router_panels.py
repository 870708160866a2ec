"""The Router dashboard (``inferctl-router``): the router's own metrics (router/metrics.py)."""

from __future__ import annotations

from inferctl.contract.thresholds import THRESHOLDS, Thresholds
from inferctl.dashboards import promql as q
from inferctl.dashboards.spec_types import W, DashboardSpec, PanelSpec, T, pct


def router(t: Thresholds = THRESHOLDS) -> DashboardSpec:
    """The router (issue 9): traffic and share per replica, retries, routing decisions,
    upstream time to first byte, the router's own overhead, replicas ready."""
    r = ("replica",)
    req = "inferctl_router_requests_total"
    per_replica = q.rate_sum(req, r, W)
    total = q.rate_sum(req, (), W)
    return DashboardSpec(
        "inferctl-router", "inferctl / Router",
        "The router in front of the replicas: where requests go, why, retries, upstream latency and "
        "the router's own overhead (router /metrics).",
        (
            ("Traffic", (
                PanelSpec("Requests per second by replica",
                          "Requests answered by each replica, by the HTTP status the client got.", (
                    T(q.rate_sum(req, ("replica", "status"), W), "{{replica}} {{status}}"),
                ), "reqps", width=8),
                PanelSpec("Share of requests per replica",
                          "Each replica's fraction of the router's requests. "
                          f"Red: {t.router_imbalance_ratio:.0%}, the imbalance alert's threshold "
                          f"(with at least {t.router_imbalance_min_replicas} replicas ready).", (
                    T(f"{per_replica} / ignoring (replica) group_left () ({total} > 0)", "{{replica}}"),
                ), "percentunit", threshold=t.router_imbalance_ratio, min=0, max=1, width=8),
                PanelSpec("Requests answered by the router",
                          "Requests the router answered itself (invalid_request, no_ready_replica), per second.", (
                    T(q.rate_sum("inferctl_router_rejected_total", ("reason",), W), "{{reason}}"),
                ), "reqps", width=8),
                PanelSpec("Retries per second",
                          "Attempts retried on another replica, by the replica that failed and why "
                          "(only before the first byte).", (
                    T(q.rate_sum("inferctl_router_retries_total", ("replica", "reason"), W),
                      "{{reason}} {{replica}}"),
                ), "short", width=8),
                PanelSpec("Routing decisions by reason",
                          "Replica choices per second: session pin, prefix affinity, least load, fallback "
                          "(a retry's choice).", (
                    T(q.rate_sum("inferctl_router_routing_decisions_total", ("reason",), W), "{{reason}}"),
                ), "short", width=8),
                PanelSpec("Streams cut and client disconnects",
                          "Streams cut after their first byte (never retried) and streams the client left, "
                          "per second, by replica.", (
                    T(q.rate_sum("inferctl_router_stream_errors_total", r, W), "cut {{replica}}"),
                    T(q.rate_sum("inferctl_router_client_disconnects_total", r, W), "client left {{replica}}"),
                ), "short", width=8),
                PanelSpec("Rate limited (429) per second",
                          "Requests refused by a per-key rate limit, by the key's configured name (default: keys "
                          "not listed in --config) and the limit hit (requests or tokens per minute).", (
                    T(q.rate_sum("inferctl_router_rate_limited_total", ("key", "limit"), W), "{{key}} {{limit}}"),
                ), "reqps", width=8),
            )),
            ("Latency", (
                PanelSpec("Upstream time to first byte P50 / P99",
                          "From sending to a replica to its first body byte (a stream: about its TTFT), "
                          "successful attempts, by replica.", tuple(
                    T(q.quantile(v, "inferctl_router_upstream_latency_seconds", r, W),
                      f"{pct(v)} {{{{replica}}}}") for v in (0.5, t.latency_quantile)), "s"),
                PanelSpec("Router overhead P50 / P99",
                          "Time the router adds to a request (arrival to first byte sent, minus the upstream "
                          "time to first byte; failed attempts included).", tuple(
                    T(q.quantile(v, "inferctl_router_overhead_seconds", ("instance",), W),
                      f"{pct(v)} {{{{instance}}}}") for v in (0.5, t.latency_quantile)), "s"),
            )),
            ("Replicas", (
                PanelSpec("Replicas ready", "Replicas the router may send to now (0: every request gets 503).", (
                    T(q.gauge("inferctl_router_replicas_ready", ("instance",), how="min"), "{{instance}}"),
                ), "short", kind="stat", threshold=1, width=6),
                PanelSpec("Replica routable", "1 when the replica is ready and not excluded by the controller.", (
                    T(q.gauge("inferctl_router_replica_ready", r, how="min"), "{{replica}}"),
                ), "short", kind="state", width=6),
                PanelSpec("Outstanding requests", "Requests in flight through the router, per replica.", (
                    T(q.gauge("inferctl_router_outstanding_requests", r), "{{replica}}"),
                ), "short", width=6),
                PanelSpec("Affinity keys per replica",
                          "Prompt prefixes and session ids the router's sticky placement keeps on each replica "
                          "(forgotten after 10 min idle): a replica holding most keys holds most conversations.", (
                    T(q.gauge("inferctl_router_affinity_keys", r), "{{replica}}"),
                ), "short", width=6),
                PanelSpec("Router and controller up",
                          "Prometheus' scrape of the router; the router's last read of the controller's /status "
                          "(absent without --controller).", (
                    T(f'min by (instance) (up{{job="{t.router_job}"}})', "router {{instance}}"),
                    T(q.gauge("inferctl_router_controller_up", ("instance",), how="min"), "controller {{instance}}"),
                ), "short", kind="state", width=6),
            )),
        ))
