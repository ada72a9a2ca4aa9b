"""One gateway in this event loop: config, balancer, discovery, health checks, the forwarding core, pools and
listeners wired together.

:func:`serve_gateway` is an async context manager (tests use it in-process; port 0 picks a free port);
:mod:`.workers` runs it as one process or as N workers on one port, and ``fleetserve gateway`` is
:mod:`.command`. Both listeners run behind the edge guards of ``config.edge`` (see :mod:`.edge.guards`):
middlewares on every HTTP route and a connection guard (header-read deadline, connection cap) below HTTP;
the same guards per call on gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import grpc.aio
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry

from fleetserve.gateway import access
from fleetserve.gateway.app import build_app
from fleetserve.gateway.autoscale.hold import ReleaseOnReady
from fleetserve.gateway.autoscale.scaler import GatewayAutoscaler
from fleetserve.gateway.balance import Balancer, run_discovery
from fleetserve.gateway.balance.discovery import Discovery, DnsDiscovery, FileDiscovery, Insert
from fleetserve.gateway.balance.health import run_health_checks
from fleetserve.gateway.balance.observer import Observers
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge import server_kwargs
from fleetserve.gateway.edge.granian import GranianListener
from fleetserve.gateway.edge.guards import EdgeGuards
from fleetserve.gateway.edge.listen import guarded_site, start_grpc_server
from fleetserve.gateway.forward.channels import GrpcChannels
from fleetserve.gateway.forward.core import Forwarder
from fleetserve.gateway.forward.grpc import GrpcForwarding
from fleetserve.gateway.forward.http import readiness_probe
from fleetserve.gateway.forward.rsgi import RsgiFront
from fleetserve.gateway.forward.upstream import UpstreamPool, UpstreamPools
from fleetserve.gateway.metrics import GatewayMetrics
from fleetserve.telemetry import otel
from fleetserve.telemetry.access_log import AccessLog
from fleetserve.telemetry.scrape import WorkerScrape, WorkerSet
from fleetserve.telemetry.tracing import IdGenerator
from fleetserve.wire import retry_after

log = logging.getLogger(__name__)

# Builds extra middlewares of one worker, run inside the edge guards; must pickle (a module-level
# function or a partial of one).
MiddlewareFactory = Callable[[CollectorRegistry], Sequence[Middleware]]
_PRUNE_INTERVAL_S = 5.0
SHUTDOWN_GRACE_S = 2.0


@dataclass
class GatewayHandle:
    """A running gateway: where it listens and its live state."""

    config: GatewayConfig
    balancer: Balancer
    metrics: GatewayMetrics
    upstreams: UpstreamPools
    port: int
    grpc_port: int | None
    guards: EdgeGuards
    autoscaler: GatewayAutoscaler | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "::") else self.config.host
        return f"http://{host}:{self.port}"


def make_discovery(config: GatewayConfig) -> Discovery | None:
    """The dynamic discovery source, or None for static backends (applied once at start) and for the
    actuator's (pushed through the admin routes)."""
    if config.discovery == "file":
        assert config.discovery_file is not None
        return FileDiscovery(config.discovery_file, config.discovery_poll_s)
    if config.discovery == "dns":
        assert config.dns_name is not None
        return DnsDiscovery(config.dns_name, config.dns_port, config.dns_interval_s,
                            allow_empty=config.autoscale.enabled and config.autoscale.min_replicas == 0)
    return None


async def _prune_loop(balancer: Balancer, upstreams: UpstreamPools, channels: GrpcChannels) -> None:
    """Close connections to replicas that discovery removed."""
    while True:
        await asyncio.sleep(_PRUNE_INTERVAL_S)
        urls = [ep.url for ep in balancer.endpoints()]
        await upstreams.retain(urls)
        await channels.retain(urls)


@contextlib.asynccontextmanager
async def serve_gateway(
    config: GatewayConfig,
    *,
    middlewares: MiddlewareFactory | None = None,
    discovery: Discovery | None = None,
    reuse_port: bool = False,
    workers: WorkerSet | None = None,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> AsyncIterator[GatewayHandle]:
    """Run a gateway in this event loop for the duration of the ``async with`` block.

    ``discovery`` replaces the one ``config`` describes (tests feed events through it); ``workers`` makes
    this one worker of several, whose ``/metrics`` reports them all (:mod:`fleetserve.telemetry.scrape`).
    """
    if middlewares is not None and config.server != "aiohttp":
        raise ValueError(f"extra aiohttp middlewares need the aiohttp server, not {config.server}")
    metrics = GatewayMetrics()
    observers = Observers(metrics)
    balancer = Balancer(config.balancer, clock=clock, rng=rng, observer=observers)
    autoscaler: GatewayAutoscaler | None = None
    if config.autoscale.enabled:
        autoscaler = GatewayAutoscaler(config.autoscale, balancer, metrics.registry,
                                       actuator=config.discovery == "actuator",
                                       hold_max=config.hold_max_requests,
                                       hold_timeout_s=config.hold_timeout_ms / 1000.0, clock=clock)
        if autoscaler.holds is not None:
            observers.add(ReleaseOnReady(autoscaler.holds))
    upstreams = UpstreamPools(config.upstream, clock=clock)
    channels = GrpcChannels(config.backend_grpc_port_offset, config.max_body_bytes,
                            drain_s=config.max_request_timeout_ms / 1000.0)
    if discovery is None:
        discovery = make_discovery(config)
        if discovery is None:
            for ep in config.endpoints():
                balancer.apply(Insert(ep))
    background: list[Coroutine[Any, Any, None]] = [_prune_loop(balancer, upstreams, channels)]
    if discovery is not None:
        background.append(run_discovery(balancer, discovery))
    if config.health_checks:
        background.append(run_health_checks(balancer, readiness_probe(upstreams), config.balancer, clock=clock))
    if autoscaler is not None:
        background.append(autoscaler.run())
    tasks = [asyncio.create_task(coro) for coro in background]
    tracing = otel.start_tracing(config.tracing, "fleetserve-gateway")
    lines = AccessLog.create(config.access_log)
    runner: web.AppRunner | None = None
    grpc_server: grpc.aio.Server | None = None
    listener: GranianListener | None = None
    local: UpstreamPool | None = None
    scrape = None if workers is None else WorkerScrape(workers, metrics.render)
    try:
        if scrape is not None:
            await scrape.start()
        guards = EdgeGuards.create(config.edge, metrics.registry, clock,
                                   unlimited=None if autoscaler is None else autoscaler.elastic)
        forwarder = Forwarder(balancer, metrics, config.hedge, guards.observer, max_retries=config.max_retries,
                              retry_after=retry_after(config.retry_after_s),
                              overload_retry_after=guards.retry_after,
                              try_timeout_s=config.per_try_timeout_ms / 1000, clock=clock,
                              signals=None if autoscaler is None else autoscaler.window,
                              holds=None if autoscaler is None else autoscaler.holds)
        ids = IdGenerator()
        # gRPC listens before HTTP does, so a /readyz that answers means both ports take calls.
        grpc_port: int | None = None
        if config.grpc_port:
            handler = GrpcForwarding(forwarder, balancer, guards.calls, metrics, channels,
                                     default_timeout_s=config.request_timeout_ms / 1000.0,
                                     max_timeout_s=config.max_request_timeout_ms / 1000.0, ids=ids,
                                     tracing=tracing, access=lines)
            grpc_server, grpc_port = await start_grpc_server(handler, config.host, config.grpc_port,
                                                             config.edge.limits, reuse_port=reuse_port)
        extra = middlewares(metrics.registry) if middlewares else ()
        granian = config.server == "granian"
        # On Granian the RSGI front guards, traces, times and logs every request; the aiohttp app behind it on
        # loopback (the gateway's own routes) does none of that again.
        app = build_app(config, forwarder, balancer, upstreams, metrics, guards, ids, extra,
                        None if scrape is None else scrape.render, autoscaler, None if granian else tracing,
                        guarded=not granian)
        # handler_cancellation: a client that hangs up cancels its request's task, and with it the attempt
        # in flight, whose upstream connection closes, so the replica sees the disconnect too.
        runner = web.AppRunner(app, access_log_class=access.access_logger(metrics, lines),
                               access_log=None if granian else access.LOGGER,
                               handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S,
                               handler_cancellation=True, **server_kwargs(config.edge.limits))
        await runner.setup()
        if granian:
            # aiohttp serves the gateway's own routes on loopback, behind the Granian front.
            site: web.BaseSite = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            local = UpstreamPool(f"http://127.0.0.1:{runner.addresses[0][1]}", config.upstream)
            front = RsgiFront(forwarder, upstreams, metrics, guards.calls, guards.observer, guards.limits, ids,
                              lines, local, default_timeout_s=config.request_timeout_ms / 1000.0,
                              max_timeout_ms=config.max_request_timeout_ms, tracing=tracing,
                              policy=config.balancer.policy)
            listener = await GranianListener.start(front, config.host, config.port, guards.limits,
                                                   batch_threads=config.batch_threads)
            port = listener.port
        else:
            site = guarded_site(runner, config.host, config.port, guards.limits, guards.observer,
                                reuse_port=reuse_port)
            await site.start()
            port = int(runner.addresses[0][1])
        yield GatewayHandle(config, balancer, metrics, upstreams, port, grpc_port, guards, autoscaler)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if grpc_server is not None:
            await grpc_server.stop(SHUTDOWN_GRACE_S)
        if listener is not None:
            await listener.stop(SHUTDOWN_GRACE_S)
        if local is not None:
            await local.close()
        if runner is not None:
            await runner.cleanup()
        await upstreams.close()
        await channels.close()
        if scrape is not None:
            await scrape.close()
        if tracing is not None:
            await asyncio.to_thread(tracing.shutdown)  # exports what is queued
        if lines is not None:
            lines.flush()
