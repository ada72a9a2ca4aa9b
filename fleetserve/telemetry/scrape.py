"""A ``/metrics`` scrape of a service made of several processes on one port reports them all, whichever one
answers it: a ``--workers N`` gateway, and a ``--frontends N`` replica (its front ends and its engine process).

Each gateway worker keeps its own registry (its own balancer, pools and guards, as Envoy's workers do), and
each replica front end its own, so a scrape that reached one process would see that process alone. Here
every process ("worker") also serves its own exposition on a Unix socket in a directory the parent process
creates for the run (and removes when it exits); the worker a scrape reaches reads its siblings' expositions
there and merges them with its own:

- counters, histograms and summaries are summed sample by sample (same names, same labels), as are gauges
  of amounts (requests in flight, table sizes);
- gauges that are a worker's view of the same fleet (``fleetserve_gateway_backends{state}``) take the
  largest value, so two workers that each see three healthy backends report three, not six, as do the
  adaptive limit's no-load latency (``fleetserve_gateway_min_rtt_seconds``), a per-process limit
  (``process_max_fds``) and the GPU gauges (``fleetserve_gpu_*``: every front end of a replica samples the
  same devices);
- start times (``*_created``, ``process_start_time_seconds``) take the earliest.

``fleetserve_gateway_workers`` (a replica's: ``fleetserve_replica_processes``) says how many processes' metrics
the scrape holds; one that does not answer
within :data:`PEER_TIMEOUT_S` is left out (and logged) rather than failing the scrape. Nothing of this runs
per request: the cost is all at scrape time. The equivalent in prometheus-client, its multiprocess mode,
writes every sample to a memory-mapped file under a lock on the request path and cannot drop the series of
a removed backend, which is why it is not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PEER_TIMEOUT_S = 2.0
WORKERS = ("fleetserve_gateway_workers", "Gateway worker processes whose metrics this scrape holds")
PROCESSES = ("fleetserve_replica_processes", "Replica processes (front ends, engine) whose metrics this scrape holds")
# Gauges that are each worker's view of one shared thing, or a per-process limit: the scrape reports the largest.
LARGEST = frozenset({"fleetserve_gateway_backends", "fleetserve_gateway_min_rtt_seconds", "process_max_fds"})
EARLIEST = frozenset({"process_start_time_seconds"})
# Every front end of a replica samples the same GPUs: one reading each, not a sum.
SAME_DEVICE = "fleetserve_gpu_"
_LOCAL_PATH = "/metrics"


@dataclass(frozen=True)
class WorkerSet:
    """This worker (``index``) among ``count`` workers whose metrics sockets live in ``directory``."""

    directory: str
    index: int
    count: int

    def socket(self, index: int) -> str:
        return os.path.join(self.directory, f"worker-{index}.sock")


def _combine(family: str, current: float, value: float) -> float:
    if family.endswith("_created") or family in EARLIEST:
        return min(current, value)
    if family in LARGEST or family.startswith(SAME_DEVICE):
        return max(current, value)
    return current + value


def merge(expositions: Sequence[str], count: tuple[str, str] = WORKERS) -> bytes:
    """One exposition of several registries' text expositions (see the module docstring for the rules), with
    the gauge ``count`` (name, help) saying how many they were."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in expositions:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                current = samples.get(key)
                samples[key] = sample.value if current is None else _combine(family.name, current, sample.value)
    for name, merged in families.items():
        for (sample_name, labels), value in values[name].items():
            merged.add_sample(sample_name, dict(labels), value)
    workers = GaugeMetricFamily(*count, value=len(expositions))
    registry = CollectorRegistry()
    registry.register(_Fixed([*families.values(), workers]))
    return generate_latest(registry)


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


class WorkerScrape:
    """Serves this worker's exposition to its siblings and merges theirs into every scrape it answers."""

    def __init__(self, workers: WorkerSet, local: Callable[[], bytes], count: tuple[str, str] = WORKERS) -> None:
        self._workers = workers
        self._local = local
        self._count = count
        self._runner: web.AppRunner | None = None
        self._sessions: dict[int, aiohttp.ClientSession] = {}

    async def start(self) -> None:
        async def own(request: web.Request) -> web.Response:
            return web.Response(body=self._local(), content_type="text/plain")

        app = web.Application()
        app.router.add_get(_LOCAL_PATH, own)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.UnixSite(self._runner, self._workers.socket(self._workers.index)).start()

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        if self._runner is not None:
            await self._runner.cleanup()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._workers.socket(self._workers.index))

    async def _peer(self, index: int) -> str | None:
        session = self._sessions.get(index)
        if session is None:
            connector = aiohttp.UnixConnector(path=self._workers.socket(index))
            session = self._sessions[index] = aiohttp.ClientSession(connector=connector)
        try:
            async with asyncio.timeout(PEER_TIMEOUT_S), session.get(f"http://worker{_LOCAL_PATH}") as response:
                return await response.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("process %d of this port left out of this scrape: %s", index, exc or type(exc).__name__)
            return None

    async def render(self) -> bytes:
        """The exposition of every process of the set."""
        others = [i for i in range(self._workers.count) if i != self._workers.index]
        peers = await asyncio.gather(*(self._peer(i) for i in others))
        return merge([self._local().decode(), *(text for text in peers if text is not None)], self._count)
