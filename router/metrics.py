"""The router's metric catalog (``ROUTER_METRICS``) and its registry.

Plain :class:`~inferctl.contract.metrics.MetricSpec` data, like the engine's and the
controller's catalogs, so dashboards and alert generators can read it without importing the
router's code. Names follow the Prometheus naming conventions
(https://prometheus.io/docs/practices/naming/): ``inferctl_router_*``, base units, ``_total``
for counters, ``_seconds`` for durations.

Labels: ``replica`` is the configured engine name (``--engine NAME=URL``); ``status`` the HTTP
status the client got, as a string; ``reason`` a routing reason (:data:`DECISION_REASONS`) or
a retry cause (:data:`RETRY_REASONS`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from inferctl.contract.metrics import MetricSpec, build_registry

#: Why a replica was chosen: a session pin, a prompt-prefix affinity, a session or prefix key
#: spilled past its replica at the bounded load (router/ring.py), the least-loaded replica, or
#: (on a retry) the least-loaded replica not tried yet.
DECISION_REASONS: tuple[str, ...] = ("session", "affinity", "spill", "least_load", "fallback")
#: Why an attempt was retried on another replica.
#: ``partial_body``: a non-streamed answer broke after some of its bytes arrived (none sent to the
#: client yet): retried, the first replica's generation having run (docs/router.md, "Retries").
#: ``dataplane``: a retry HAProxy made (``--data-plane haproxy``: its counters do not say why).
RETRY_REASONS: tuple[str, ...] = ("connect_error", "unavailable", "upstream_error", "partial_body", "dataplane")

#: Upstream time to first body byte (TTFB): seconds, from a few ms up to a minute-long answer.
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Router overhead: seconds, 50 µs .. 100 ms (the target is <= 2 ms at p50, docs/router.md).
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)

ROUTER_METRICS: list[MetricSpec] = [
    {"name": "inferctl_router_requests_total", "type": "counter", "unit": "requests",
     "help": "Requests answered by a replica, by replica and the HTTP status the client got.",
     "labels": ("replica", "status")},
    {"name": "inferctl_router_rejected_total", "type": "counter", "unit": "requests",
     "help": "Requests the router answered itself: invalid_request (4xx from validation), "
             "invalid_api_key (401: its --api-key) or no_ready_replica (503).",
     "labels": ("reason",)},
    {"name": "inferctl_router_retries_total", "type": "counter", "unit": "retries",
     "help": "Attempts retried on another replica, by the replica that failed and the cause "
             "(connect_error, unavailable = 503, upstream_error = failed before the first body byte, "
             "partial_body = a non-streamed answer broke after some bytes arrived, none sent to the client; "
             "dataplane = a retry HAProxy made under --data-plane haproxy, cause not known).",
     "labels": ("replica", "reason")},
    {"name": "inferctl_router_routing_decisions_total", "type": "counter", "unit": "decisions",
     "help": "Replica choices by reason (session, affinity, spill = a session or prefix key past its replica at "
             "the bounded load, least_load, fallback = a retry's choice).",
     "labels": ("reason",)},
    {"name": "inferctl_router_stream_errors_total", "type": "counter", "unit": "streams",
     "help": "Streams cut after their first byte reached the client (never retried), by replica.",
     "labels": ("replica",)},
    {"name": "inferctl_router_client_disconnects_total", "type": "counter", "unit": "requests",
     "help": "Requests the client left before their answer's end (a stream cut short, or a wait for the "
             "answer or its first chunk), by replica; the upstream connection is closed, the replica aborts.",
     "labels": ("replica",)},
    {"name": "inferctl_router_upstream_latency_seconds", "type": "histogram", "unit": "seconds",
     "help": "Upstream time to first byte: from sending the request to a replica to its first body "
             "byte (a streamed answer: about its TTFT), successful attempts only.",
     "labels": ("replica",), "buckets": UPSTREAM_BUCKETS},
    {"name": "inferctl_router_overhead_seconds", "type": "histogram", "unit": "seconds",
     "help": "Time the router adds: from the request's arrival to the first byte sent to the client, "
             "minus the successful attempt's upstream time to first byte (includes failed attempts).",
     "labels": (), "buckets": OVERHEAD_BUCKETS},
    {"name": "inferctl_router_outstanding_requests", "type": "gauge", "unit": "requests",
     "help": "Requests in flight through the router to each replica.",
     "labels": ("replica",)},
    {"name": "inferctl_router_replica_ready", "type": "gauge", "unit": "",
     "help": "1 when the replica is routable (ready and not excluded by the controller), else 0.",
     "labels": ("replica",)},
    {"name": "inferctl_router_replicas_ready", "type": "gauge", "unit": "replicas",
     "help": "Replicas the router may send to now.",
     "labels": ()},
    {"name": "inferctl_router_rate_limited_total", "type": "counter", "unit": "requests",
     "help": "Requests refused with 429 by a per-key rate limit, by the key's configured name (default: keys "
             "not listed) and the limit (requests or tokens per minute). Never the raw key.",
     "labels": ("key", "limit")},
    {"name": "inferctl_router_affinity_keys", "type": "gauge", "unit": "keys",
     "help": "Affinity keys (prompt prefixes and X-Session-Id values) placed on each replica by the router's "
             "sticky bounded-load table and not forgotten yet (LRU, 10 min idle): where the conversations live. "
             "Read at scrape time.",
     "labels": ("replica",)},
    {"name": "inferctl_router_controller_up", "type": "gauge", "unit": "",
     "help": "1 when the last read of the controller's /status succeeded, 0 when it failed "
             "(the router keeps the last known view); absent without --controller.",
     "labels": ()},
]


def build_router_registry() -> tuple[CollectorRegistry, dict]:
    """A fresh registry holding every :data:`ROUTER_METRICS` series: ``(registry, metrics)``,
    ``metrics`` keyed by catalog name (see :func:`inferctl.contract.metrics.build_registry`)."""
    return build_registry(ROUTER_METRICS)
