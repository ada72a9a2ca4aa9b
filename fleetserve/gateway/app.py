"""The gateway's public aiohttp application: replica routes proxied, admin routes served locally.

Proxied (``GET`` and ``POST``): ``/v2`` and everything under ``/v2/``, and ``/inference`` — the
replica's KServe v2 and text inference surface. Anything else is a JSON 404 (405 for a known path
with another method). Every route, admin ones included, runs behind the edge guards of
``config.edge`` (outermost: input limits always; shedding, JWT auth and rate limits when configured,
each skipping the paths ``edge.exempt_paths`` lists), then any extra ``middlewares`` (outermost first).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from fleetserve.gateway.admin import add_admin_routes
from fleetserve.gateway.autoscale.scaler import GatewayAutoscaler
from fleetserve.gateway.balance import Balancer
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge import app_kwargs
from fleetserve.gateway.edge.guards import EdgeGuards
from fleetserve.gateway.forward.core import Forwarder
from fleetserve.gateway.forward.http import HttpForwarding
from fleetserve.gateway.forward.upstream import UpstreamPools
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from fleetserve.gateway.routes import PROXIED_METHODS, PROXIED_PATHS
from fleetserve.gateway.tracing import tracing_middleware
from fleetserve.telemetry import otel
from fleetserve.telemetry.tracing import IdGenerator, request_id
from fleetserve.wire import REQUEST_ID_HEADER, error_response


def _json_errors(metrics: GatewayMetrics, ids: IdGenerator) -> Middleware:
    """aiohttp's own 404/405/413 as ``{"error": ...}`` bodies, like every other error of ours."""

    @web.middleware
    async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            rid = request_id(request.headers.get(REQUEST_ID_HEADER), ids)
            headers = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
            headers[REQUEST_ID_HEADER] = rid
            metrics.observe_request(NO_BACKEND, exc.status)
            return error_response(exc.status, f"{exc.reason}: {request.method} {request.path}", headers)

    return json_errors


def build_app(config: GatewayConfig, forwarder: Forwarder, balancer: Balancer, pools: UpstreamPools,
              metrics: GatewayMetrics, guards: EdgeGuards, ids: IdGenerator,
              middlewares: Sequence[Middleware] = (),
              exposition: Callable[[], Awaitable[bytes]] | None = None,
              autoscaler: GatewayAutoscaler | None = None,
              tracing: otel.Tracing | None = None, guarded: bool = True) -> web.Application:
    """The application: the tracing middleware outermost when ``tracing`` is on (so a request's span holds the
    guards' time), then ``guards``' middlewares, then ``middlewares``, then the routes. ``exposition`` answers
    ``/metrics`` (default: this process's metrics); ``autoscaler`` serves the autoscale routes (404/409
    without one). ``guarded=False`` leaves the edge guards out: the Granian front ran them already and
    reaches this application over loopback (:mod:`.forward.rsgi`)."""
    traced = () if tracing is None else (tracing_middleware(tracing),)
    app = web.Application(
        middlewares=[*traced, *(guards.middlewares if guarded else ()), *middlewares, _json_errors(metrics, ids)],
        **app_kwargs(config.edge.limits),
    )
    forwarding = HttpForwarding(forwarder, pools, metrics, config, ids, tracing)
    add_admin_routes(app, balancer, metrics, exposition or metrics.exposition, autoscaler)
    for path in PROXIED_PATHS:
        for method in PROXIED_METHODS:
            app.router.add_route(method, path, forwarding.handle)
    return app
