"""Run the gateway: wire config, balancer, discovery, health checks, pools and listeners together.

- :func:`serve_gateway` is an async context manager that runs one gateway in the current event loop
  (tests use it in-process; port 0 picks a free port).
- :func:`run_gateway` blocks until SIGINT/SIGTERM. With ``workers > 1`` it runs that many worker
  processes on one port through SO_REUSEPORT, the kernel spreading connections across them; each
  worker keeps its own balancer state, health checks and metrics, as Envoy's workers do.
- ``fleetserve gateway`` is :mod:`.command`.

Every listener runs behind the edge guards of ``config.edge`` (see :mod:`.edge.guards`): middlewares on
every route, and a connection guard (header-read deadline, connection cap) below HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import grpc.aio
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry

from fleetserve.eventloop import loop_factory
from fleetserve.gateway import access
from fleetserve.gateway.app import build_app
from fleetserve.gateway.balance import Balancer, run_discovery
from fleetserve.gateway.balance.discovery import Discovery, DnsDiscovery, FileDiscovery, Insert
from fleetserve.gateway.balance.health import run_health_checks
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge import server_kwargs
from fleetserve.gateway.edge.guards import EdgeGuards
from fleetserve.gateway.edge.listen import guarded_site, start_grpc_server
from fleetserve.gateway.forward.channels import GrpcChannels
from fleetserve.gateway.forward.core import Forwarder
from fleetserve.gateway.forward.grpc import GrpcForwarding
from fleetserve.gateway.forward.http import readiness_probe
from fleetserve.gateway.forward.upstream import UpstreamPools
from fleetserve.gateway.metrics import GatewayMetrics
from fleetserve.telemetry import logs
from fleetserve.telemetry.tracing import IdGenerator
from fleetserve.wire import retry_after

log = logging.getLogger(__name__)

# Builds extra middlewares of one worker, run inside the edge guards; must pickle (a module-level
# function or a partial of one).
MiddlewareFactory = Callable[[CollectorRegistry], Sequence[Middleware]]
_PRUNE_INTERVAL_S = 5.0
_SHUTDOWN_GRACE_S = 2.0


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

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "::") else self.config.host
        return f"http://{host}:{self.port}"


def make_discovery(config: GatewayConfig) -> Discovery | None:
    """The dynamic discovery source, or None for static backends (applied once at start)."""
    if config.discovery == "file":
        assert config.discovery_file is not None
        return FileDiscovery(config.discovery_file, config.discovery_poll_s)
    if config.discovery == "dns":
        assert config.dns_name is not None
        return DnsDiscovery(config.dns_name, config.dns_port, config.dns_interval_s)
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
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> AsyncIterator[GatewayHandle]:
    """Run a gateway in this event loop for the duration of the ``async with`` block.

    ``discovery`` replaces the one ``config`` describes (tests feed events through it).
    """
    metrics = GatewayMetrics()
    balancer = Balancer(config.balancer, clock=clock, rng=rng, observer=metrics)
    upstreams = UpstreamPools(config.upstream, clock=clock)
    channels = GrpcChannels(config.backend_grpc_port_offset, config.max_body_bytes)
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
    tasks = [asyncio.create_task(coro) for coro in background]
    runner: web.AppRunner | None = None
    grpc_server: grpc.aio.Server | None = None
    try:
        guards = EdgeGuards.create(config.edge, metrics.registry, clock)
        forwarder = Forwarder(balancer, metrics, config.hedge, guards.observer, max_retries=config.max_retries,
                              retry_after=retry_after(config.retry_after_s),
                              overload_retry_after=guards.retry_after, clock=clock)
        ids = IdGenerator()
        extra = middlewares(metrics.registry) if middlewares else ()
        app = build_app(config, forwarder, balancer, upstreams, metrics, guards, ids, extra)
        # handler_cancellation: a client that hangs up cancels its request's task, and with it the attempt
        # in flight, whose upstream connection closes, so the replica sees the disconnect too.
        runner = web.AppRunner(app, access_log_class=access.access_logger(metrics), access_log=access.LOGGER,
                               handle_signals=False, shutdown_timeout=_SHUTDOWN_GRACE_S,
                               handler_cancellation=True, **server_kwargs(config.edge.limits))
        await runner.setup()
        site = guarded_site(runner, config.host, config.port, guards.limits, guards.observer, reuse_port=reuse_port)
        await site.start()
        port = int(runner.addresses[0][1])
        grpc_port: int | None = None
        if config.grpc_port:
            handler = GrpcForwarding(forwarder, balancer, guards.grpc, metrics, channels,
                                     default_timeout_s=config.request_timeout_ms / 1000.0,
                                     max_timeout_s=config.max_request_timeout_ms / 1000.0, ids=ids)
            grpc_server, grpc_port = await start_grpc_server(handler, config.host, config.grpc_port,
                                                             config.edge.limits, reuse_port=reuse_port)
        yield GatewayHandle(config, balancer, metrics, upstreams, port, grpc_port, guards)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if grpc_server is not None:
            await grpc_server.stop(_SHUTDOWN_GRACE_S)
        if runner is not None:
            await runner.cleanup()
        await upstreams.close()
        await channels.close()


async def _serve_until_signalled(config: GatewayConfig, worker: bool,
                                 middlewares: MiddlewareFactory | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # A worker leaves Ctrl-C to its parent, which turns it into one SIGTERM for every worker.
    for signum in (signal.SIGTERM,) if worker else (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with serve_gateway(config, middlewares=middlewares, reuse_port=worker) as gateway:
        _tune_gc()
        grpc_note = f", gRPC on port {gateway.grpc_port}" if gateway.grpc_port else ""
        log.info("gateway (pid %d) listening on %s:%d%s, policy %s, %d backend(s)", os.getpid(),
                 config.host, gateway.port, grpc_note, config.balancer.policy, len(gateway.balancer.endpoints()))
        await stop.wait()
    log.info("gateway (pid %d) stopped", os.getpid())
    return 0


def _tune_gc() -> None:
    """Keep the cyclic garbage collector's older-generation passes off what start-up built.

    ``gc.freeze()`` moves everything alive after start-up (modules, the app, metrics, policies) into a
    permanent generation that no future pass traverses, so a full collection under load walks only the
    objects of requests in flight (Instagram's "Dismissing Python Garbage Collection", 2017;
    https://docs.python.org/3/library/gc.html#gc.freeze): at saturation the gateway's p99 fell from
    27–31 ms to 12 ms. The young-generation threshold stays at CPython's default: raising it (to 50,000)
    saved no measurable CPU and makes each young collection a longer pause.
    """
    gc.collect()
    gc.freeze()


def _run_one(config: GatewayConfig, worker: bool, middlewares: MiddlewareFactory | None) -> int:
    try:
        with asyncio.Runner(loop_factory=loop_factory(config.loop)) as runner:
            return runner.run(_serve_until_signalled(config, worker, middlewares))
    except OSError as exc:
        log.error("gateway cannot start on %s:%d: %s", config.host, config.port, exc.strerror or exc)
        return 1


def _worker_main(config: GatewayConfig, middlewares: MiddlewareFactory | None, log: tuple[str, str]) -> None:
    logs.install(*log)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(_run_one(config, True, middlewares))


def run_gateway(config: GatewayConfig, *, middlewares: MiddlewareFactory | None = None) -> int:
    """Serve until SIGINT/SIGTERM; 0 after a clean stop, 1 when a worker failed."""
    if config.workers == 1:
        return _run_one(config, False, middlewares)
    context = multiprocessing.get_context("spawn")  # no fork: gRPC's threads do not survive one
    workers = [context.Process(target=_worker_main, args=(config, middlewares, logs.settings()),
                               name=f"fleetserve-gateway-{i}") for i in range(config.workers)]
    stopping = False

    def stop_all(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.pid is not None and worker.exitcode is None:
                os.kill(worker.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, stop_all) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for worker in workers:
            worker.start()
        multiprocessing.connection.wait([w.sentinel for w in workers])
        if not stopping:
            failed = next(w for w in workers if w.exitcode is not None)
            log.error("gateway worker %s exited with %s; stopping the others", failed.name, failed.exitcode)
            stop_all(signal.SIGTERM, None)
            stopping = False
        for worker in workers:
            worker.join(_SHUTDOWN_GRACE_S + 5.0)
            if worker.exitcode is None:
                worker.kill()
                worker.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0 if stopping and all(w.exitcode == 0 for w in workers) else 1
