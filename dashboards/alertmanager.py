"""The example Alertmanager configuration: critical pages, warning opens a ticket.

Routing (https://prometheus.io/docs/alerting/latest/configuration/):

- ``alertname="Watchdog"`` → ``heartbeat`` (a dead man's switch: repeat every minute, so the
  receiver can alarm when heartbeats stop);
- ``severity="critical"`` → ``pager``;
- ``severity="warning"`` → ``ticket`` (also the default receiver).

Inhibition: a firing critical alert mutes the warning of the *same* alert on the same target
(the two tiers of ``InferctlHighP99Latency`` / ``InferctlHighTimeToFirstToken``), and
``InferctlEngineDown`` mutes ``InferctlEngineMetricsAbsent`` of the same job, whose cause it
already names. Labels missing on both sides count as equal (Alertmanager semantics).
"""

from __future__ import annotations

#: The labels that identify "the same alert on the same target" for inhibition.
INHIBIT_EQUAL = ["alertname", "job", "instance", "engine", "model", "gpu"]

EXAMPLE_URLS = {
    "pager": "http://alert-webhook.example.internal:9095/pager",
    "ticket": "http://alert-webhook.example.internal:9095/ticket",
    "heartbeat": "http://alert-webhook.example.internal:9095/heartbeat",
}


def alertmanager_config(urls: dict[str, str] | None = None, group_wait: str = "30s",
                        group_interval: str = "5m", repeat_interval: str = "4h",
                        resolve_timeout: str = "5m") -> dict:
    """The configuration as a dict (dump it as YAML).

    Args:
        urls: webhook URL per receiver: keys ``pager``, ``ticket``, ``heartbeat``
            (defaults: :data:`EXAMPLE_URLS`; put your PagerDuty/Opsgenie bridge and ticket
            bridge here, or replace the receivers).
        group_wait, group_interval, repeat_interval, resolve_timeout: Alertmanager durations
            (the end-to-end test shortens them to seconds).

    Raises:
        ValueError: a receiver URL is missing.
    """
    urls = dict(EXAMPLE_URLS if urls is None else urls)
    for receiver in ("pager", "ticket", "heartbeat"):
        if not urls.get(receiver):
            raise ValueError(f"urls: missing the webhook URL of receiver {receiver!r}")
    return {
        "global": {"resolve_timeout": resolve_timeout},
        "route": {
            "receiver": "ticket",
            "group_by": ["alertname", "job", "engine", "gpu"],
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
            "routes": [
                {"receiver": "heartbeat", "matchers": ['alertname="Watchdog"'],
                 "group_wait": "0s", "group_interval": "1m", "repeat_interval": "1m"},
                {"receiver": "pager", "matchers": ['severity="critical"']},
                {"receiver": "ticket", "matchers": ['severity="warning"']},
            ],
        },
        "inhibit_rules": [
            {"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'],
             "equal": list(INHIBIT_EQUAL)},
            {"source_matchers": ['alertname="InferctlEngineDown"'],
             "target_matchers": ['alertname="InferctlEngineMetricsAbsent"'], "equal": ["job"]},
        ],
        "receivers": [
            {"name": name, "webhook_configs": [{"url": urls[name], "send_resolved": name != "heartbeat"}]}
            for name in ("pager", "ticket", "heartbeat")
        ],
    }
