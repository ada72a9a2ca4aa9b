"""The gateway's own endpoints: ``/healthz`` (the process is live), ``/readyz`` (ready for traffic),
``/metrics`` (Prometheus text, the whole gateway's with ``--workers N``: :mod:`fleetserve.telemetry.scrape`),
``/gateway/backends`` (the balancer's per-backend state as JSON, for operators and ``fleetserve up``), the live
fleet dashboard (``/dashboard``, fed by ``/gateway/fleet``) and the autoscaler's routes (``/gateway/autoscale``,
:mod:`.autoscale.routes`).

``/readyz`` turns 200 once some backend has passed its health checks (at once when the gateway holds requests
for a first replica: autoscaling with ``--min-replicas 0``) and then stays 200, like Envoy's
``/ready`` after initialisation: a new gateway (a rollout, ``fleetserve up``) takes no traffic before it
knows where to send it, yet a fleet-wide outage later does not also take every gateway out of its Service,
which would turn the gateway's quick 503s into refused connections.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fleetserve.gateway.autoscale.routes import add_autoscale_routes
from fleetserve.gateway.autoscale.scaler import GatewayAutoscaler
from fleetserve.gateway.balance import Balancer
from fleetserve.gateway.dashboard import add_dashboard_routes
from fleetserve.gateway.metrics import GatewayMetrics

HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"
BACKENDS_PATH = "/gateway/backends"


def add_admin_routes(app: web.Application, balancer: Balancer, metrics: GatewayMetrics,
                     exposition: Callable[[], Awaitable[bytes]], autoscaler: GatewayAutoscaler | None = None) -> None:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    # A gateway that holds requests while its first replica starts (scale from zero) is ready without one.
    holds = autoscaler is not None and autoscaler.holds is not None

    async def readyz(request: web.Request) -> web.Response:
        if balancer.warmed or holds:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "no backend has passed its health checks yet"}, status=503,
                                 headers={"Retry-After": "1"})

    async def metrics_text(request: web.Request) -> web.Response:
        # The exposition content type carries parameters (version, charset); set it verbatim.
        return web.Response(body=await exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def backends(request: web.Request) -> web.Response:
        return web.json_response({
            "backends": balancer.snapshot(),
            "panic": balancer.panic,
            "active_requests": balancer.active_requests,
            "policy": balancer.config.policy,
        })

    app.router.add_get(HEALTHZ_PATH, healthz, allow_head=False)
    app.router.add_get(READYZ_PATH, readyz, allow_head=False)
    app.router.add_get(METRICS_PATH, metrics_text, allow_head=False)
    app.router.add_get(BACKENDS_PATH, backends, allow_head=False)
    add_autoscale_routes(app, autoscaler)
    add_dashboard_routes(app, balancer, metrics, balancer.config.policy, autoscaler)
