"""The edge guards of one gateway (worker), built once from ``GatewayConfig.edge`` and shared by the HTTP
app, the gRPC and Granian listeners (:mod:`.calls`), the forwarding core and the listeners.

:meth:`EdgeGuards.create` builds the middleware list (:func:`~fleetserve.gateway.edge.build_middlewares`),
the rejection counter ``fleetserve_gateway_rejected_total{reason}``, and the gauge
``fleetserve_gateway_ratelimit_entries{prefix,key}`` (rate-limit buckets held per rule, read at scrape time,
so a flood of client addresses shows as a table at its cap), and the adaptive concurrency limit's
gauges when it is on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetserve.gateway.edge import (
    EdgeConfig,
    InputLimits,
    PrometheusRejections,
    RejectionObserver,
    build_middlewares,
)
from fleetserve.gateway.edge.adaptive_guard import AdaptiveConcurrencyGauges, AdaptiveConcurrencyMiddleware
from fleetserve.gateway.edge.calls import RequestGuards
from fleetserve.gateway.edge.ratelimit import RateLimiter, RateLimitMiddleware
from fleetserve.wire import retry_after

RATELIMIT_ENTRIES = "fleetserve_gateway_ratelimit_entries"


class RateLimitEntries(Collector):
    """Reports the size of each rule's bucket table when scraped (no work on the request path)."""

    def __init__(self, limiter: RateLimiter) -> None:
        self._limiter = limiter

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(RATELIMIT_ENTRIES, "Rate-limit buckets held, per rule (capped by max_entries)",
                                   labels=["prefix", "key"])
        sizes: dict[tuple[str, str], int] = {}
        for rule, table in zip(self._limiter.rules, self._limiter.tables, strict=True):
            labels: tuple[str, str] = (rule.prefix, rule.key)
            sizes[labels] = sizes.get(labels, 0) + len(table)
        for labels, size in sizes.items():
            family.add_metric(list(labels), size)
        yield family


@dataclass(frozen=True)
class EdgeGuards:
    """What the gateway's parts need from the edge configuration."""

    middlewares: tuple[Middleware, ...]
    calls: RequestGuards  # the same guards one request at a time, for the gRPC and Granian listeners
    observer: RejectionObserver
    limits: InputLimits
    # The Retry-After of overload answers (every replica at its in-flight cap).
    retry_after: str

    @classmethod
    def create(cls, edge: EdgeConfig, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic,
               unlimited: Callable[[], bool] | None = None) -> EdgeGuards:
        """Build the guards and register their metrics in ``registry`` (once per registry); ``unlimited`` as
        :func:`~fleetserve.gateway.edge.stack.build_middlewares` takes it.

        Loads the configured key files: an unusable one is a ValueError naming it.
        """
        observer = PrometheusRejections.create(registry)
        middlewares = build_middlewares(edge, observer, clock=clock, unlimited=unlimited)
        for middleware in middlewares:
            if isinstance(middleware, RateLimitMiddleware):
                registry.register(RateLimitEntries(middleware.limiter))
            elif isinstance(middleware, AdaptiveConcurrencyMiddleware):
                registry.register(AdaptiveConcurrencyGauges(middleware.controller))
        shedding = edge.shedding
        return cls(
            middlewares=tuple(middlewares),
            calls=RequestGuards(middlewares),
            observer=observer,
            limits=edge.limits,
            retry_after=retry_after(1.0 if shedding is None else shedding.retry_after_s),
        )


def check_edge(edge: EdgeConfig) -> None:
    """Build the guards once, throwaway, so a bad key file fails before worker processes start."""
    EdgeGuards.create(edge, CollectorRegistry())
