"""The gateway's own endpoints: ``/healthz`` (the process is live), ``/metrics`` (Prometheus text) and
``/gateway/backends`` (the balancer's per-backend state as JSON, for operators and ``fleetserve up``).
"""

from __future__ import annotations

from aiohttp import web

from fleetserve.gateway.balancer import Balancer
from fleetserve.gateway.metrics import GatewayMetrics

HEALTHZ_PATH = "/healthz"
METRICS_PATH = "/metrics"
BACKENDS_PATH = "/gateway/backends"


def add_admin_routes(app: web.Application, balancer: Balancer, metrics: GatewayMetrics) -> None:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics_text(request: web.Request) -> web.Response:
        body, content_type = metrics.render()
        # The exposition content type carries parameters (version, charset); set it verbatim.
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def backends(request: web.Request) -> web.Response:
        return web.json_response({
            "backends": balancer.snapshot(),
            "panic": balancer.panic,
            "active_requests": balancer.active_requests,
            "policy": balancer.config.policy,
        })

    app.router.add_get(HEALTHZ_PATH, healthz, allow_head=False)
    app.router.add_get(METRICS_PATH, metrics_text, allow_head=False)
    app.router.add_get(BACKENDS_PATH, backends, allow_head=False)
