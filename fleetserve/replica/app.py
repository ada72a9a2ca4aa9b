"""The replica's aiohttp application: KServe v2 routes, ``/inference``, ``/health``, ``/metrics``, and the
per-response load report the gateway balances on.

Every response carries the replica's ORCA load report (``endpoint-load-metrics``, :mod:`.load`), so the
gateway's view of this replica is fresh without polling. A W3C
``traceparent`` is continued (or started) per request and its trace id is put on the request's log lines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from fleetserve.batching.worker import Batcher
from fleetserve.replica.codec import CodecLimits
from fleetserve.replica.kserve_http import add_kserve_routes
from fleetserve.replica.load import LoadReporter
from fleetserve.replica.model import ModelRepository
from fleetserve.replica.text import TextService, add_text_route
from fleetserve.telemetry.logs import trace_id_var
from fleetserve.telemetry.metrics import ReplicaMetrics
from fleetserve.telemetry.tracing import IdGenerator, parse_traceparent
from fleetserve.wire import LOAD_REPORT_HEADER, RETRY_AFTER

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

COUNTED_SUFFIXES = ("/infer", "/inference")
# The code counted for a request whose client disconnected before its answer (NGINX's "client closed request").
CLIENT_CLOSED = 499


def build_app(
    repo: ModelRepository,
    batcher: Batcher,
    metrics: ReplicaMetrics,
    *,
    text: TextService | None,
    limits: CodecLimits,
    max_body_bytes: int,
    load: LoadReporter,
) -> web.Application:
    ids = IdGenerator()
    inflight = metrics.inflight.labels(metrics.model)

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        parent = parse_traceparent(request.headers.get("traceparent"))
        trace_id = parent.trace_id if parent else ids.trace_id()
        flags = parent.flags if parent else 0
        token = trace_id_var.set(trace_id)
        counted = request.path.endswith(COUNTED_SUFFIXES)
        start = time.perf_counter()
        status = 500
        if counted:
            inflight.inc()
        try:
            response = await handler(request)
            status = response.status
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            if counted:
                inflight.dec()
                metrics.observe_request(status, time.perf_counter() - start)
            trace_id_var.reset(token)
        response.headers["traceparent"] = f"00-{trace_id}-{ids.span_id()}-{flags:02x}"
        return response

    async def load_report(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[LOAD_REPORT_HEADER] = load.report()

    async def health(request: web.Request) -> web.Response:
        if repo.is_ready():
            return web.json_response({"status": "ok"})
        state = "draining" if repo.draining else "warming up"
        return web.json_response({"status": state}, status=503, headers={RETRY_AFTER: "1"})

    async def prometheus(request: web.Request) -> web.Response:
        metrics.queue_depth.labels(metrics.model).set(batcher.queue_depth)
        return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")

    app = web.Application(client_max_size=max_body_bytes, middlewares=[observe])
    app.on_response_prepare.append(load_report)
    add_kserve_routes(app, repo, limits)
    if text is not None:
        add_text_route(app, text)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", prometheus)
    return app
