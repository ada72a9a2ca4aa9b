"""``fleetserve serve --frontends N``: one process owns the engine and batches for N front-end processes.

A single replica process spends most of its CPU outside the engine — HTTP, JSON, tokenising, encoding the
answer — on one interpreter thread, and on a GPU its engine then idles; several replica processes on one
GPU each form small batches and time-share the device. Here the front ends share the replica's ports
(SO_REUSEPORT: the kernel spreads connections over them), each doing that CPU work and batching its own
requests, and this process runs their batches on the one engine, merging those that wait while it is busy
(:mod:`.engine_link`, :mod:`.engine_host`). Triton's one scheduler behind many HTTP threads is the model.

Lifecycle: the engine is loaded and warmed here first, then the front ends start; the replica's ready line
is printed once every front end is warm. SIGTERM/SIGINT reaches this process, which passes SIGTERM to the
front ends; they drain as a replica does (not ready, grace period, finish what they accepted) while the
engine keeps serving them, and the engine drains last. A front end that dies stops the replica (exit 1),
as a gateway worker's death stops the gateway; a front end whose engine process died stops itself.
The ports are reserved here before the front ends start, so port 0 works and a port something already
listens on fails at once.
``/metrics``, whichever front end answers, reports every front end and this process
(:mod:`fleetserve.telemetry.scrape`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess

from fleetserve.engine.base import ShapeProfile, TensorSpec
from fleetserve.eventloop import loop_factory
from fleetserve.replica.config import ReplicaConfig
from fleetserve.replica.engine_host import EngineHost
from fleetserve.replica.engine_link import RemoteEngine
from fleetserve.replica.server import ServedEngine, load_engine, serve_until, start_replica
from fleetserve.telemetry import logs
from fleetserve.telemetry.metrics import EngineMetrics
from fleetserve.telemetry.scrape import PROCESSES, WorkerScrape, WorkerSet

log = logging.getLogger(__name__)

# Past the front ends' own drain timeout: how long this process waits for them to exit before killing them.
EXIT_MARGIN_S = 5.0


@dataclasses.dataclass(frozen=True)
class _Link:
    """What a front end needs to reach the engine process and present its model."""

    path: str
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    profile: ShapeProfile
    device: str
    served: ServedEngine


def _reserve(host: str, port: int) -> socket.socket:
    """A bound, not listening, SO_REUSEPORT socket holding ``port`` (0: a free one) for the front ends.

    SO_REUSEPORT would also let it share a port some other SO_REUSEPORT service (another such replica, a
    ``gateway --workers N``) listens on, the kernel then splitting connections between the two; binding a
    plain socket first fails with EADDRINUSE while anything listens there (SO_REUSEADDR: connections of an
    earlier run in TIME_WAIT do not count)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        if port:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


async def serve_frontends(config: ReplicaConfig) -> int:
    """Serve until SIGTERM/SIGINT; 0 after a clean stop, 1 when a front end failed."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine, served = await load_engine(config)
    metrics = EngineMetrics(served.name)
    metrics.instances.labels(served.name).set(config.instances)
    buckets = engine.profile.seq_buckets
    if config.padding == "fixed":
        buckets = (config.fixed_seq,)
    elif config.padding == "longest":
        buckets = (buckets[-1],)
    directory = tempfile.mkdtemp(prefix="fleetserve-replica-")  # mode 0700: only this user reaches the engine
    host = EngineHost(engine, os.path.join(directory, "engine.sock"), max_batch=config.engine.max_batch,
                      seq_buckets=buckets, instances=config.instances, observer=metrics)
    reserved: list[socket.socket] = []
    idle = True
    try:
        await asyncio.to_thread(host.start)
        reserved.append(_reserve(config.host, config.port))
        ports = {"port": reserved[0].getsockname()[1]}
        if config.grpc_port:
            reserved.append(_reserve(config.host, config.grpc_port))
            ports["grpc_port"] = reserved[1].getsockname()[1]
        siblings = [WorkerSet(directory, i, config.frontends + 1) for i in range(config.frontends + 1)]
        scrape = WorkerScrape(siblings[-1], metrics.render, PROCESSES)
        await scrape.start()
        link = _Link(host.path, engine.inputs, engine.outputs, engine.profile, engine.device, served)
        code = 0 if stop.is_set() else await _run(dataclasses.replace(config, **ports), link, siblings, stop)
        idle = await asyncio.to_thread(host.close, config.drain_timeout_s)
        await scrape.close()
        return code
    finally:
        for sock in reserved:
            sock.close()
        if idle:  # an engine call still running past the drain timeout keeps its engine; the process exits
            engine.close()
        shutil.rmtree(directory, ignore_errors=True)


async def _run(config: ReplicaConfig, link: _Link, siblings: list[WorkerSet], stop: asyncio.Event) -> int:
    context = multiprocessing.get_context("spawn")  # no fork: gRPC's and the engine's threads do not survive one
    alive_reader, alive_writer = context.Pipe(duplex=False)  # EOF in a front end: this process is gone
    processes: list[SpawnProcess] = []
    readiness: list[Connection] = []
    for i in range(config.frontends):
        ready_reader, ready_writer = context.Pipe(duplex=False)
        process = context.Process(
            target=_frontend_main, name=f"fleetserve-frontend-{i}",
            args=(config, link, siblings[i], logs.settings(), ready_writer, alive_reader))
        process.start()
        ready_writer.close()
        processes.append(process)
        readiness.append(ready_reader)
    alive_reader.close()
    loop = asyncio.get_running_loop()
    failed = asyncio.Event()
    exited: list[int] = []
    waiting = set(range(config.frontends))

    def on_exit(index: int) -> None:
        exited.append(index)
        failed.set()

    def on_ready(index: int) -> None:
        loop.remove_reader(readiness[index].fileno())
        try:
            readiness[index].recv()
        except EOFError:
            return  # it died first: its sentinel says so
        waiting.discard(index)
        if not waiting:
            # Parsed by `fleetserve up` and the tests.
            print(f"fleetserve replica ready http://{config.host}:{config.port}", flush=True)

    try:
        for i, process in enumerate(processes):
            loop.add_reader(process.sentinel, on_exit, i)
            loop.add_reader(readiness[i].fileno(), on_ready, i)
        stopped = asyncio.create_task(stop.wait())
        died = asyncio.create_task(failed.wait())
        await asyncio.wait({stopped, died}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopped, died):
            task.cancel()
        for i, process in enumerate(processes):
            loop.remove_reader(process.sentinel)
            if i in waiting:
                loop.remove_reader(readiness[i].fileno())
        if exited:
            dead = processes[exited[0]]
            dead.join()  # its sentinel can be readable before it can be reaped
            log.error("front end %s exited with %s; stopping the replica", dead.name, dead.exitcode)
    finally:
        for process in processes:
            if process.exitcode is None and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        limit = config.drain_grace_s + config.drain_timeout_s + EXIT_MARGIN_S
        await asyncio.to_thread(_join, processes, limit)
        alive_writer.close()
        for reader in readiness:
            reader.close()
    return 0 if not exited and all(p.exitcode in (0, -signal.SIGTERM) for p in processes) else 1


def _join(processes: list[SpawnProcess], limit_s: float) -> None:
    """Wait up to ``limit_s`` for every process to exit; kill those still running then."""
    deadline = time.monotonic() + limit_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.exitcode is None:
            log.error("front end %s did not exit within %.0f s; killing it", process.name, limit_s)
            process.kill()
            process.join()


def _frontend_main(config: ReplicaConfig, link: _Link, siblings: WorkerSet, log_settings: tuple[str, str],
                   ready: Connection, alive: Connection) -> None:
    logs.install(*log_settings)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the engine process, which stops everyone
    with asyncio.Runner(loop_factory=loop_factory(config.loop)) as runner:
        runner.run(_frontend(config, link, siblings, ready, alive))
    sys.exit(0)


async def _frontend(config: ReplicaConfig, link: _Link, siblings: WorkerSet, ready: Connection,
                    alive: Connection) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def engine_gone() -> None:
        loop.remove_reader(alive.fileno())
        log.error("the engine process is gone; stopping")
        stop.set()

    loop.add_reader(alive.fileno(), engine_gone)
    engine = RemoteEngine(link.path, link.inputs, link.outputs, link.profile, link.device)
    replica = await start_replica(config, (engine, link.served), instances=config.frontend_batches,
                                  siblings=siblings)
    try:
        # The engine process warmed every shape; one small batch per connection proves the link.
        await serve_until(replica, stop, lambda: ready.send(os.getpid()), replica.batcher.warmup_shapes[:1])
    finally:
        engine.close()
