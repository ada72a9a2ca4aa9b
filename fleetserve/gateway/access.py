"""What the gateway records once a response has been written: the client's end-to-end latency, the access-log
line and the end of the request's span.

aiohttp times every request from its head being parsed to its response's last byte being written, and
hands that to the server's access logger; :func:`access_logger` is such a logger that observes the time of
requests on proxied routes (``/v2``, ``/v2/...`` and ``/inference``: :mod:`.routes`) in
``fleetserve_gateway_request_duration_seconds``.
Answers the gateway gave itself there (429, 503, 504, 413 ...) count too: they are what the client saw.
Admin routes (``/metrics``, ``/dashboard``, probes) are not client traffic and are left out. Hooking the
server's own timing, rather than timing inside the proxy handler, measures the response write as well
and keeps the forwarding code untouched; a client that goes away before its answer is not counted.

The same hook writes the request's access-log line (:mod:`fleetserve.telemetry.access_log`; the replica that
answered and the attempts it took are left on the request by the handler) and, when tracing is on, ends the
request's span (:mod:`.tracing`), so both see the time the client saw.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from fleetserve.gateway.metrics import GatewayMetrics
from fleetserve.gateway.routes import proxied
from fleetserve.telemetry import otel
from fleetserve.telemetry.access_log import AccessLog

LOGGER = logging.getLogger(__name__)
# What the proxy handler and the tracing middleware leave on a request for this hook.
BACKEND_KEY: web.RequestKey[str] = web.RequestKey("fleetserve.backend", str)
ATTEMPTS_KEY: web.RequestKey[int] = web.RequestKey("fleetserve.attempts", int)
SPAN_KEY: web.RequestKey[Any] = web.RequestKey("fleetserve.span", object)  # an OpenTelemetry Span


def access_logger(metrics: GatewayMetrics, lines: AccessLog | None) -> type[AbstractAccessLogger]:
    """An access-logger class for ``web.AppRunner(access_log_class=..., access_log=LOGGER)`` that feeds
    ``metrics`` and writes ``lines`` (None: no access log). aiohttp builds one per connection from
    ``(logger, format)``, so these travel on the class."""
    duration = metrics.request_duration.series()

    class LatencyRecorder(AbstractAccessLogger):
        def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
            if not proxied(request.path):
                return
            duration.observe(time)
            span = request.get(SPAN_KEY)
            if span is not None:
                otel.end_server_span(span, response.status)
            if lines is not None:
                lines.request(request.method, request.path, response.status, time,
                              replica=request.get(BACKEND_KEY), attempts=request.get(ATTEMPTS_KEY, 0),
                              bytes_in=request.content_length or 0, bytes_out=response.content_length or 0)

    return LatencyRecorder
