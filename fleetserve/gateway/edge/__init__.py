"""Edge protection for the gateway: input limits, load shedding, JWT auth and rate limits.

Wiring, for whoever builds the gateway server::

    edge = EdgeConfig.from_mapping(raw_config.get("edge"))
    observer = PrometheusRejections.create(registry)
    app = web.Application(middlewares=build_middlewares(edge, observer), **app_kwargs(edge.limits))
    runner = web.AppRunner(app, **server_kwargs(edge.limits))
    await runner.setup()
    site = GuardedTCPSite(runner, host, port, edge.limits, observer)  # instead of web.TCPSite
    await site.start()

The proxy adds ``identity_headers(request)`` to upstream requests.
"""

from fleetserve.gateway.edge.config import EdgeConfig, InputLimits, RateLimitRule, ShedConfig
from fleetserve.gateway.edge.connections import ConnectionGuard, GuardedTCPSite
from fleetserve.gateway.edge.identity import IDENTITY_HEADERS, IDENTITY_KEY, Identity, identity_headers
from fleetserve.gateway.edge.jwtconfig import JwtConfig, KeySpec, RouteScope
from fleetserve.gateway.edge.limits import app_kwargs, server_kwargs
from fleetserve.gateway.edge.metrics import NullObserver, PrometheusRejections, RejectionObserver
from fleetserve.gateway.edge.stack import build_middlewares

__all__ = [
    "IDENTITY_HEADERS",
    "IDENTITY_KEY",
    "ConnectionGuard",
    "EdgeConfig",
    "GuardedTCPSite",
    "Identity",
    "InputLimits",
    "JwtConfig",
    "KeySpec",
    "NullObserver",
    "PrometheusRejections",
    "RateLimitRule",
    "RejectionObserver",
    "RouteScope",
    "ShedConfig",
    "app_kwargs",
    "build_middlewares",
    "identity_headers",
    "server_kwargs",
]
