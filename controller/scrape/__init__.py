"""Scrape plumbing shared by the engine clients and the GPU sources: a bounded HTTP request
(:mod:`.http`) and the Prometheus text exposition parser (:mod:`.promtext`).

Both ``controller.engines`` and ``controller.gpu`` import this package; it imports neither.
"""

from __future__ import annotations

from inferctl.controller.scrape.http import (MAX_RESPONSE_BYTES, ResponseDeadlineExceeded,
                                             ResponseTooLarge, bounded_request)
from inferctl.controller.scrape.promtext import PromSample, parse_prometheus_text

__all__ = ["MAX_RESPONSE_BYTES", "PromSample", "ResponseDeadlineExceeded", "ResponseTooLarge",
           "bounded_request", "parse_prometheus_text"]
