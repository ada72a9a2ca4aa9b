"""The replica's aiohttp application: KServe v2 routes, ``/inference``, ``/health``, ``/metrics``, and the
per-response load report the gateway balances on.

Every response carries the replica's ORCA load report (``endpoint-load-metrics``, :mod:`.load`), so the
gateway's view of this replica is fresh without polling. A W3C
``traceparent`` is continued (or started) per request and its trace id is put on the request's log lines;
with tracing on, an inference request's span starts here (:mod:`.tracing`). Each inference request writes
one access-log line (:mod:`fleetserve.telemetry.access_log`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from fleetserve.batching.worker import Batcher
from fleetserve.replica.codec import CodecLimits
from fleetserve.replica.kserve_http import add_kserve_routes
from fleetserve.replica.load import LoadReporter
from fleetserve.replica.model import ModelRepository
from fleetserve.replica.text import TextService, add_text_route
from fleetserve.replica.tracing import SPAN_KEY, server_span
from fleetserve.telemetry import otel
from fleetserve.telemetry.access_log import AccessLog
from fleetserve.telemetry.logs import trace_id_var
from fleetserve.telemetry.metrics import ReplicaMetrics
from fleetserve.telemetry.tracing import IdGenerator, parse_traceparent
from fleetserve.wire import LOAD_REPORT_HEADER, RETRY_AFTER

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

COUNTED_SUFFIXES = ("/infer", "/inference")
# The code counted for a request whose client disconnected before its answer (NGINX's "client closed request").
CLIENT_CLOSED = 499


def _server_span(tracing: otel.Tracing, request: web.Request) -> Span:
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else otel.http_route(request.path)
    attributes: dict[str, Any] = {"http.request.method": request.method, "url.path": request.path,
                                  "http.route": route, "url.scheme": "http"}
    if request.remote:
        attributes["client.address"] = request.remote
    return server_span(tracing, f"{request.method} {route}", request.headers, attributes)


def build_app(
    repo: ModelRepository,
    batcher: Batcher,
    metrics: ReplicaMetrics,
    *,
    text: TextService | None,
    limits: CodecLimits,
    max_body_bytes: int,
    load: LoadReporter,
    tracing: otel.Tracing | None = None,
    access: AccessLog | None = None,
    scrape: Callable[[], Awaitable[bytes]] | None = None,
) -> web.Application:
    """``scrape``, for one front end of several, renders the whole replica's metrics (this process's included)."""
    ids = IdGenerator()
    inflight = metrics.inflight.labels(metrics.model)

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        counted = request.path.endswith(COUNTED_SUFFIXES)
        span = None
        if tracing is not None and counted and tracing.samples(request.headers.get("traceparent")):
            span = _server_span(tracing, request)
            request[SPAN_KEY] = span
            header = otel.traceparent(span)
            trace_id = header[3:35]
        else:
            parent = parse_traceparent(request.headers.get("traceparent"))
            trace_id = parent.trace_id if parent else ids.trace_id()
            header = f"00-{trace_id}-{ids.span_id()}-{parent.flags if parent else 0:02x}"
        token = trace_id_var.set(trace_id)
        start = time.perf_counter()
        status, sent = 500, 0
        if counted:
            inflight.inc()
        try:
            response = await handler(request)
            status, sent = response.status, response.content_length or 0
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            if counted:
                inflight.dec()
                latency = time.perf_counter() - start
                metrics.observe_request(status, latency)
                if access is not None:
                    access.request(request.method, request.path, status, latency, trace_id=trace_id,
                                   bytes_in=request.content_length or 0, bytes_out=sent)
                if span is not None:
                    otel.end_server_span(span, status)
            trace_id_var.reset(token)
        response.headers["traceparent"] = header
        return response

    async def load_report(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[LOAD_REPORT_HEADER] = load.report()

    async def health(request: web.Request) -> web.Response:
        if repo.is_ready():
            return web.json_response({"status": "ok"})
        state = "draining" if repo.draining else "warming up"
        return web.json_response({"status": state}, status=503, headers={RETRY_AFTER: "1"})

    async def prometheus(request: web.Request) -> web.Response:
        body = metrics.render() if scrape is None else await scrape()
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app = web.Application(client_max_size=max_body_bytes, middlewares=[observe])
    app.on_response_prepare.append(load_report)
    add_kserve_routes(app, repo, limits, tracing)
    if text is not None:
        add_text_route(app, text)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", prometheus)
    return app
