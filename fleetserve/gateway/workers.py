"""The gateway as an operating-system process (``fleetserve gateway``): :func:`run_gateway` serves until
SIGINT/SIGTERM.

With ``workers > 1`` it runs that many worker processes on one port through SO_REUSEPORT, the kernel
spreading connections across them; each worker keeps its own balancer state, health checks and metrics, as
Envoy's workers do, and a ``/metrics`` scrape, whichever worker answers it, reports them all
(:mod:`fleetserve.telemetry.scrape`, through Unix sockets in a directory made for the run and removed when it
ends). Ctrl-C reaches the parent, which stops every worker; a worker that dies stops the others.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
from types import FrameType

from fleetserve.eventloop import loop_factory
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.server import SHUTDOWN_GRACE_S, MiddlewareFactory, serve_gateway
from fleetserve.telemetry import logs
from fleetserve.telemetry.scrape import WorkerSet

log = logging.getLogger(__name__)

YOUNG_THRESHOLD = 10_000  # allocations net of frees that start a young-generation collection (CPython: 700)


async def _serve_until_signalled(config: GatewayConfig, workers: WorkerSet | None,
                                 middlewares: MiddlewareFactory | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # A worker leaves Ctrl-C to its parent, which turns it into one SIGTERM for every worker.
    for signum in (signal.SIGTERM,) if workers else (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with serve_gateway(config, middlewares=middlewares, reuse_port=workers is not None,
                             workers=workers) as gateway:
        _tune_gc()
        grpc_note = f", gRPC on port {gateway.grpc_port}" if gateway.grpc_port else ""
        log.info("gateway (pid %d) listening on %s:%d%s, policy %s, %d backend(s)", os.getpid(),
                 config.host, gateway.port, grpc_note, config.balancer.policy, len(gateway.balancer.endpoints()))
        await stop.wait()
    log.info("gateway (pid %d) stopped", os.getpid())
    return 0


def _tune_gc() -> None:
    """Keep the cyclic garbage collector off the request path.

    ``gc.freeze()`` moves everything alive after start-up (modules, the app, metrics, policies) into a
    permanent generation that no future pass traverses, so a full collection under load walks only the
    objects of requests in flight (Instagram's "Dismissing Python Garbage Collection", 2017;
    https://docs.python.org/3/library/gc.html#gc.freeze): at saturation the gateway's p99 fell from
    27–31 ms to 12 ms.

    The young generation is collected once the objects allocated since the last pass outnumber those freed by
    :data:`YOUNG_THRESHOLD`. Requests free almost everything they allocate, but at CPython's default of 700 the
    ebb and flow of a few dozen requests in flight crosses it all the time: at saturation with 64 in flight, a
    young pass every 23 requests that found nothing to free, 6.9 µs of CPU per request (``gc.callbacks``,
    BENCHMARKS.md §4.3). At 10,000 only a real build-up of garbage starts one (none in 35,000 requests).
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def _run_one(config: GatewayConfig, workers: WorkerSet | None, middlewares: MiddlewareFactory | None) -> int:
    try:
        with asyncio.Runner(loop_factory=loop_factory(config.loop)) as runner:
            return runner.run(_serve_until_signalled(config, workers, middlewares))
    except OSError as exc:
        log.error("gateway cannot start on %s:%d: %s", config.host, config.port, exc.strerror or exc)
        return 1


def _worker_main(config: GatewayConfig, workers: WorkerSet, middlewares: MiddlewareFactory | None,
                 log: tuple[str, str]) -> None:
    logs.install(*log)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(_run_one(config, workers, middlewares))


def run_gateway(config: GatewayConfig, *, middlewares: MiddlewareFactory | None = None) -> int:
    """Serve until SIGINT/SIGTERM; 0 after a clean stop, 1 when a worker failed."""
    if config.workers == 1:
        return _run_one(config, None, middlewares)
    with tempfile.TemporaryDirectory(prefix="fleetserve-gateway-") as directory:
        return _run_workers(config, directory, middlewares)


def _run_workers(config: GatewayConfig, directory: str, middlewares: MiddlewareFactory | None) -> int:
    context = multiprocessing.get_context("spawn")  # no fork: gRPC's threads do not survive one
    workers = [context.Process(target=_worker_main, name=f"fleetserve-gateway-{i}",
                               args=(config, WorkerSet(directory, i, config.workers), middlewares, logs.settings()))
               for i in range(config.workers)]
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
            worker.join(SHUTDOWN_GRACE_S + 5.0)
            if worker.exitcode is None:
                worker.kill()
                worker.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    # A worker that SIGTERM reached before it installed its handler (still importing) had nothing to drain.
    return 0 if stopping and all(w.exitcode in (0, -signal.SIGTERM) for w in workers) else 1
