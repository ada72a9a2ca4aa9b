"""What the gateway records once a response has been written: the client's end-to-end latency.

aiohttp times every request from its head being parsed to its response's last byte being written, and
hands that to the server's access logger; :func:`access_logger` is such a logger that observes the time of
requests on proxied routes (``/v2...`` and ``/inference``) in ``fleetserve_gateway_request_duration_seconds``.
Answers the gateway gave itself there (429, 503, 504, 413 ...) count too: they are what the client saw.
Admin routes (``/metrics``, ``/dashboard``, probes) are not client traffic and are left out. Hooking the
server's own timing, rather than timing inside the proxy handler, measures the response write as well
and keeps the forwarding code untouched; a client that goes away before its answer is not counted.
"""

from __future__ import annotations

import logging

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from fleetserve.gateway.metrics import GatewayMetrics

_PROXIED_PREFIX = "/v2"
_PROXIED_EXACT = "/inference"
LOGGER = logging.getLogger(__name__)


def proxied(path: str) -> bool:
    """Whether ``path`` is one of the routes the gateway forwards to replicas."""
    return path.startswith(_PROXIED_PREFIX) or path == _PROXIED_EXACT


def access_logger(metrics: GatewayMetrics) -> type[AbstractAccessLogger]:
    """An access-logger class for ``web.AppRunner(access_log_class=..., access_log=LOGGER)`` that feeds
    ``metrics``. aiohttp builds one per connection from ``(logger, format)``, so the metrics travel on the
    class."""
    duration = metrics.request_duration.series()

    class LatencyRecorder(AbstractAccessLogger):
        def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
            if proxied(request.path):
                duration.observe(time)

    return LatencyRecorder
