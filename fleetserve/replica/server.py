"""Replica lifecycle: load (or build) the engine, listen, warm up, serve, drain on SIGTERM.

Order matters for a load balancer: the process listens (``/v2/health/live`` 200) before warm-up, and turns
ready (``/v2/health/ready``, ``/health`` 200) only once every engine instance has run every bucket shape.
On SIGTERM/SIGINT readiness turns 503 at once; the replica keeps serving for ``drain_grace_s`` so balancers
and Kubernetes endpoints notice, then closes its listeners, finishes everything queued and in flight, and
exits 0 within ``drain_timeout_s`` — no accepted request is lost.

A client that disconnects cancels its request: aiohttp cancels the handler (``handler_cancellation``), and the
batcher takes the request out of its queue unrun.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from fleetserve.batching.config import BatcherConfig
from fleetserve.batching.worker import Batcher
from fleetserve.engine.base import Engine
from fleetserve.engine.builder import build
from fleetserve.engine.onnxruntime import threads_per_instance
from fleetserve.eventloop import loop_factory
from fleetserve.models.tokenizer import TextTokenizer
from fleetserve.replica.codec import CodecLimits
from fleetserve.replica.config import ReplicaConfig
from fleetserve.replica.fault import SlowEngine
from fleetserve.replica.grpc_server import GrpcServerConfig, GrpcServerHandle, start_grpc_server
from fleetserve.replica.load import LoadMeter, LoadReporter
from fleetserve.replica.model import ModelRepository
from fleetserve.replica.served import BatchedModel
from fleetserve.replica.text import TextLimits, TextService
from fleetserve.telemetry import otel
from fleetserve.telemetry.access_log import AccessLog
from fleetserve.telemetry.gpu import GpuMonitor
from fleetserve.telemetry.metrics import ReplicaMetrics
from fleetserve.telemetry.scrape import PROCESSES, WorkerScrape, WorkerSet

log = logging.getLogger(__name__)

PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan", "torch-cuda": "pytorch_libtorch"}


@dataclass
class Replica:
    config: ReplicaConfig
    repo: ModelRepository
    model: BatchedModel
    batcher: Batcher
    metrics: ReplicaMetrics
    runner: web.AppRunner
    grpc: GrpcServerHandle | None
    http_port: int
    gpu: GpuMonitor | None = None
    tracing: otel.Tracing | None = None
    access: AccessLog | None = None
    scrape: WorkerScrape | None = None

    async def drain(self) -> None:
        cfg = self.config
        self.repo.draining = True
        log.info("draining: not ready; serving for %.1f s more so balancers notice", cfg.drain_grace_s)
        await asyncio.sleep(cfg.drain_grace_s)
        deadline = time.monotonic() + cfg.drain_timeout_s
        for site in list(self.runner.sites):
            await site.stop()
        await self.batcher.drain(max(0.1, deadline - time.monotonic()))
        if self.grpc is not None:
            await self.grpc.stop(max(0.1, deadline - time.monotonic()))
        await self.runner.cleanup()
        if self.gpu is not None:
            self.gpu.stop()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # exports what is queued
        if self.access is not None:
            self.access.flush()
        if self.scrape is not None:
            await self.scrape.close()
        log.info("drained; exiting")


def _gpu_monitor(device: str, metrics: ReplicaMetrics) -> GpuMonitor | None:
    """NVML sampling (about 1 Hz, in the background) for a replica on a GPU: gauges and load headers."""
    if not device.startswith("cuda"):
        return None
    monitor = GpuMonitor.create()
    if monitor is not None:
        monitor.register_metrics(metrics.registry)
        monitor.start()
    return monitor


@dataclass(frozen=True)
class ServedEngine:
    """What the servers need of the model besides its engine; picklable, so front-end processes get it too."""

    name: str
    platform: str
    tokenizer_path: Path | None
    embedding_output: str | None
    max_seq: int


async def load_engine(config: ReplicaConfig) -> tuple[Engine, ServedEngine]:
    """Build (or find in the cache) and load the engine ``config`` names, with its fault injection."""
    built = await asyncio.to_thread(build, config.engine, quiet=True)
    engine: Engine = await asyncio.to_thread(built.load, config.threads or threads_per_instance(config.instances))
    if config.batch_latency_ms:
        engine = SlowEngine(engine, config.batch_latency_ms / 1000)
    meta = built.model.meta
    served = ServedEngine(config.model_name or built.model.name, PLATFORMS.get(built.backend.name, built.backend.name),
                          built.model.tokenizer_path, meta.embedding_output if meta is not None else None,
                          built.profile.max_seq)
    return engine, served


async def start_replica(config: ReplicaConfig, loaded: tuple[Engine, ServedEngine] | None = None, *,
                        instances: int | None = None, siblings: WorkerSet | None = None) -> Replica:
    """Listen and serve ``loaded`` (default: the engine ``config`` names) through ``instances`` concurrent
    batches (default ``config.instances``). ``siblings``: this process is one front end of several, sharing
    the ports and answering ``/metrics`` for them all."""
    engine, served = loaded if loaded is not None else await load_engine(config)
    instances = instances or config.instances
    name = served.name
    metrics = ReplicaMetrics(name)
    # With sibling front ends the engine process reports the engine's instances; these are batch slots.
    metrics.instances.labels(name).set(instances if siblings is None else 0)
    meter = LoadMeter(metrics, instances)
    batcher = Batcher(
        engine,
        BatcherConfig(
            max_batch=config.engine.max_batch, max_delay_s=config.max_delay_ms / 1000,
            preferred_batch_sizes=config.preferred_batch_sizes, max_queue=config.max_queue,
            default_timeout_s=config.default_timeout_ms / 1000 if config.default_timeout_ms else None,
            group_by_length=config.padding != "longest",
            pad_to="bucket" if config.padding == "fixed" else "longest",
            seq_buckets=(config.fixed_seq,) if config.padding == "fixed" else None,
            promote_overdue=config.promote_overdue,
        ),
        instances=instances, observer=meter,
    )
    # Read at scrape time, whichever process renders it (a sibling front end's scrape too).
    metrics.queue_depth.labels(name).set_function(lambda: batcher.queue_depth)
    await batcher.start()
    model = BatchedModel(name, batcher, engine.inputs, engine.outputs, config.engine.max_batch, served.platform,
                         extra_latency_s=config.extra_latency_ms / 1000)
    repo = ModelRepository([model])
    text = None
    if served.tokenizer_path is not None and served.embedding_output:
        max_tokens = config.fixed_seq if config.padding == "fixed" else served.max_seq
        tokenizer = TextTokenizer(served.tokenizer_path, max_tokens)
        text = TextService(model, tokenizer, served.embedding_output, TextLimits(),
                           on_truncated=metrics.truncated.labels(name).inc, tokenize_threads=config.tokenize_threads)
    limits = CodecLimits(max_json_bytes=config.max_body_bytes, max_total_bytes=4 * config.max_body_bytes)
    from fleetserve.replica.app import build_app

    gpu = _gpu_monitor(config.engine.device, metrics)
    load = LoadReporter(batcher, meter, gpu.load_metrics if gpu is not None else None)
    tracing = otel.start_tracing(config.tracing, "fleetserve-replica")
    access = AccessLog.create(config.access_log)
    scrape = None if siblings is None else WorkerScrape(siblings, metrics.render, PROCESSES)
    if scrape is not None:
        await scrape.start()
    app = build_app(repo, batcher, metrics, text=text, limits=limits, max_body_bytes=config.max_body_bytes,
                    load=load, tracing=tracing, access=access, scrape=None if scrape is None else scrape.render)
    # handler_cancellation: a client that hangs up cancels its handler, which takes its work out of the queue.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=config.drain_timeout_s,
                           handler_cancellation=True)
    await runner.setup()
    # gRPC listens before HTTP does, so a readiness probe that answers means both ports take calls.
    grpc = None
    if config.grpc_port:
        grpc = await start_grpc_server(repo, GrpcServerConfig(config.host, config.grpc_port), limits, load,
                                       tracing, access)
    site = web.TCPSite(runner, config.host, config.port, backlog=1024, reuse_port=siblings is not None or None)
    try:
        await site.start()
    except BaseException:
        if grpc is not None:
            await grpc.stop(0)
        raise
    http_port = runner.addresses[0][1]
    return Replica(config, repo, model, batcher, metrics, runner, grpc, http_port, gpu, tracing, access, scrape)


async def serve(config: ReplicaConfig) -> int:
    if config.frontends:
        from fleetserve.replica.frontends import serve_frontends

        return await serve_frontends(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    replica = await start_replica(config)
    # Parsed by `fleetserve up` and the tests.
    await serve_until(replica, stop, lambda: print(f"fleetserve replica ready http://{config.host}:{replica.http_port}",
                                                   flush=True))
    return 0


async def serve_until(replica: Replica, stop: asyncio.Event, announce: Callable[[], None],
                      warmup_shapes: Sequence[tuple[int, int]] | None = None) -> None:
    """Warm up (on ``warmup_shapes``, default every shape), turn ready and ``announce`` it, serve until ``stop``
    is set, then drain."""
    config = replica.config
    grpc_note = f" grpc {config.host}:{replica.grpc.port}" if replica.grpc else ""
    log.info("listening on http://%s:%d%s; warming up", config.host, replica.http_port, grpc_note)
    t0 = time.perf_counter()
    warm = asyncio.create_task(_warm_up(replica.batcher, warmup_shapes, config.warmup_delay_s))
    done, _ = await asyncio.wait({warm, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if warm in done:
        warm.result()
        replica.model.warm = True
        shapes = replica.batcher.warmup_shapes if warmup_shapes is None else warmup_shapes
        log.info("ready: model %s warm on %d shapes in %.1f s", replica.model.name, len(shapes),
                 time.perf_counter() - t0)
        announce()
        await stop.wait()
    await replica.drain()
    if not warm.done():
        warm.cancel()


async def _warm_up(batcher: Batcher, shapes: Sequence[tuple[int, int]] | None, delay_s: float) -> None:
    await batcher.warmup(shapes)
    if delay_s:
        await asyncio.sleep(delay_s)


def run(config: ReplicaConfig) -> int:
    with asyncio.Runner(loop_factory=loop_factory(config.loop)) as runner:
        return runner.run(serve(config))
