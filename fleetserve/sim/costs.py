"""Per-request CPU of a real replica and a real gateway, and a replica's cold start, measured on this machine.

Method, defended: a replica is started as ``fleetserve serve MODEL --threads 1`` (one instance) on 127.0.0.1 and
the time from spawning it to its first ``200`` on ``/v2/health/ready`` is the **cold start** (interpreter start,
engine load from the cache, warm-up of every shape). Then the load generator sends the ``texts`` workload
closed loop with one request in flight (so every batch holds one request) for ``duration_s``, directly to the
replica. CPU time is read per thread from ``/proc/PID/task/*/stat`` before and after: with one instance and
one intra-op thread the engine runs on the batcher's one executor thread, the replica's busiest thread other
than its main one; **replica CPU per request** = (the process's CPU − that thread's) ÷ requests sent: the event
loop (HTTP, JSON, tokenizer, batching) and every helper thread. CPU time, not wall time, so a busy machine
slows the measurement without biasing it much; the engine thread's share includes padding and splitting the
batch, which the profile's engine timings leave out (small next to the engine call). Then a gateway
(``fleetserve gateway --backend URL``) goes in front and the same load runs through it: **gateway CPU per
request** = the gateway process tree's CPU ÷ requests sent (its health checks included: a small, honest
overcount). One request in flight is the least favourable case for an event loop (no wake-up is shared between
requests), so both are upper bounds for busier processes. The same two measurements with each of ``concurrencies``
requests in flight give the **CPU per request against requests in flight** of each (a request that finds others in
hand shares wake-ups and system calls with them): on this 2-core box it falls gradually, replica 930, 850, 665,
595, 523 and 431 µs at 1, 2, 3, 4, 8 and 16 in flight, gateway 631 to 297 µs (BENCHMARKS.md §8.2). The last is the
**busy CPU per request** (a process that always has other requests in hand, as at saturation). The simulator
charges a request the figure for the requests its process has in hand when it arrives, itself included,
interpolated between the measured points.

Then the **wall times** at low load: open-loop Poisson arrivals at ``low_load_rps`` of short texts (requests far
apart and quick, so each finds the processes idle and rarely queues behind another), first to the replica, then
through the gateway; latency is the load generator's from the actual send (its own lateness left out). The
replica's metrics (``fleetserve_request_duration_seconds``, scraped before and after) give the mean batcher queue
wait and engine call of the same requests: **replica wall time** = latency − queue wait − engine call (HTTP both
ways, JSON, tokenising on its thread, every thread hand-off and wake-up; the client's send and receive included),
**gateway wall time** = the same through the gateway minus the replica's, and **timer lag** = queue wait − the
batcher's ``max_delay_s`` (each lone request waits exactly that in the collator's logic; the rest is how late the
event loop's timer fired). Subtracting each phase's own queue and engine means keeps the engine's variance (long
texts) out of the differences. The direct run also gives the **engine call in service**: the replica's mean
engine-call time per request and its mean rows per call (``fleetserve_batch_size``), which the profile sets
against its own after-idle timing of the same workload's short texts (``Profile.served_factor``). On the 2-core
box, 2026-12-05, the two profiles of a validation run measured 0.98 and 1.04; one replica timed against a profile
measured 40 minutes earlier, 1.11x at 10 req/s and 1.18x at one request in flight (BENCHMARKS.md §8.2).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fleetserve.batching.config import BatcherConfig
from fleetserve.bench.cpu import replica_overhead, thread_cpu_seconds, tree_cpu_seconds
from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.replica_metrics import engine_counters, fetch, stage_mean, stage_sums
from fleetserve.deploy.local import free_port
from fleetserve.errors import FleetserveError
from fleetserve.fleet.supervisor import http_ok

# The simulator models the gateway's adaptive concurrency limit (on by default in the gateway) only when asked
# (SimConfig.adaptive), and hedging (on by default too) not at all, so the real gateways it is profiled from or
# compared with run without both. Hedging at the p99 toward idle replicas is what takes the real gateway's tail
# below the model's with a stalled replica (BENCHMARKS.md §8.2).
UNMODELLED_GATEWAY_ARGS = ("--no-adaptive-concurrency", "--hedge-percentile", "0")


@dataclass(frozen=True)
class CostConfig:
    duration_s: float = 5.0
    ready_timeout_s: float = 300.0
    low_load_rps: float = 10.0
    low_load_s: float = 10.0
    max_delay_s: float = BatcherConfig().max_delay_s  # the replica's batcher setting (its default)
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16)  # requests in flight of the CPU measurements

    def __post_init__(self) -> None:
        if min(self.duration_s, self.ready_timeout_s, self.low_load_rps, self.low_load_s) <= 0:
            raise ValueError("cost measurement durations and the low-load rate must be > 0")
        c = self.concurrencies
        if len(c) < 2 or c[0] != 1 or any(b <= a for a, b in itertools.pairwise(c)):
            raise ValueError(f"cost concurrencies must start at 1 and rise, at least two, got {c}")


@dataclass(frozen=True)
class Costs:
    replica_cpu_s: float
    gateway_cpu_s: float
    cold_start_s: float
    replica_requests: int
    gateway_requests: int
    replica_wall_s: float = 0.0
    gateway_wall_s: float = 0.0
    timer_lag_s: float = 0.0
    # The direct low-load run's engine calls (short texts): mean seconds per request, mean rows per call.
    served_compute_s: float | None = None
    served_rows: float = 1.0
    replica_busy_cpu_s: float | None = None
    gateway_busy_cpu_s: float | None = None
    replica_cpu_curve: tuple[tuple[int, float], ...] = ()  # (requests in flight, CPU seconds per request)
    gateway_cpu_curve: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class LowLoad:
    """Means over one low-load run: latency from send, the replica's queue wait and engine call (per request), and
    rows per engine call."""

    latency_s: float
    queue_s: float
    compute_s: float
    requests: int
    rows: float

    @property
    def outside_s(self) -> float:
        """Time outside the batcher's queue and the engine."""
        return self.latency_s - self.queue_s - self.compute_s


@contextlib.asynccontextmanager
async def _process(argv: list[str], ready_url: str, timeout_s: float) -> AsyncIterator[tuple[int, float]]:
    """Start ``argv``; yield (pid, seconds until ``ready_url`` answered 200); stop it (SIGTERM, then kill).

    Its stderr goes to a temporary file, read only if it exits early: a pipe nobody drains would stall a
    process that logs more than the pipe holds, and leave a transport to be closed after the event loop.
    """
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as stderr:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL, stderr=stderr)
        try:
            while not await asyncio.to_thread(http_ok, ready_url):
                if proc.returncode is not None:
                    stderr.seek(0)
                    last = stderr.read().decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                    raise FleetserveError(f"{' '.join(argv[3:5])} exited with {proc.returncode}: {last[0]}")
                if time.monotonic() - t0 > timeout_s:
                    raise FleetserveError(f"{ready_url} was not ready within {timeout_s:g} s")
                await asyncio.sleep(0.05)
            yield proc.pid, time.monotonic() - t0
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _closed_loop(url: str, model: str, duration_s: float, concurrency: int = 1) -> int:
    report = await run_load(LoadConfig(url=url, rate=None, concurrency=concurrency, duration_s=duration_s,
                                       workload="texts", model=model))
    if report.ok == 0:
        raise FleetserveError(f"no request to {url} succeeded while measuring CPU costs: {dict(report.errors_by_type)}")
    return report.sent


def _metrics(replica_url: str) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    text = fetch(replica_url)
    return stage_sums(text), engine_counters(text)


async def _low_load(url: str, replica_url: str, model: str, config: CostConfig) -> LowLoad:
    before, engine_before = await asyncio.to_thread(_metrics, replica_url)
    report = await run_load(LoadConfig(url=url, rate=config.low_load_rps, duration_s=config.low_load_s,
                                       workload="texts", model=model, long_fraction=0.0))
    after, engine_after = await asyncio.to_thread(_metrics, replica_url)
    if report.ok == 0:
        raise FleetserveError(f"no request to {url} succeeded while measuring wall times")
    calls = engine_after["batches"] - engine_before["batches"]
    rows = (engine_after["rows"] - engine_before["rows"]) / calls if calls > 0 else 1.0
    return LowLoad(report.service_latency_s["mean"], stage_mean(before, after, "queue"),
                   stage_mean(before, after, "compute"), report.ok, rows)


# Starts counting a process's CPU; what it returns gives the CPU seconds spent since.
Meter = Callable[[], Callable[[], float]]


async def _cpu_curve(url: str, model: str, config: CostConfig,
                     meter: Meter) -> tuple[tuple[tuple[int, float], ...], int]:
    """CPU per request at each of ``config.concurrencies`` requests in flight, and the requests sent at the first."""
    curve, sent = [], []
    for c in config.concurrencies:
        spent = meter()
        sent.append(await _closed_loop(url, model, config.duration_s, c))
        curve.append((c, spent() / sent[-1]))
    return tuple(curve), sent[0]


async def measure_costs(model: str, serve_args: list[str], config: CostConfig) -> Costs:
    cli = [sys.executable, "-m", "fleetserve.cli"]
    port = free_port()
    replica_url = f"http://127.0.0.1:{port}"
    replica = [*cli, "serve", model, "--host", "127.0.0.1", "--port", str(port), "--grpc-port", "0",
               "--threads", "1", *serve_args]
    async with _process(replica, f"{replica_url}/v2/health/ready", config.ready_timeout_s) as (rpid, cold):
        await _closed_loop(replica_url, model, min(1.0, config.duration_s))  # first-request costs, not counted

        def replica_meter() -> Callable[[], float]:  # the engine's thread left out: the profile times it
            before = thread_cpu_seconds(rpid)
            return lambda: replica_overhead(rpid, before, thread_cpu_seconds(rpid))

        replica_curve, replica_sent = await _cpu_curve(replica_url, model, config, replica_meter)
        direct = await _low_load(replica_url, replica_url, model, config)
        gport = free_port()
        gateway_url = f"http://127.0.0.1:{gport}"
        gateway = [*cli, "gateway", "--backend", replica_url, "--host", "127.0.0.1", "--port", str(gport),
                   "--health-interval", "1", *UNMODELLED_GATEWAY_ARGS]
        async with _process(gateway, f"{gateway_url}/readyz", config.ready_timeout_s) as (gpid, _):
            await _closed_loop(gateway_url, model, min(1.0, config.duration_s))

            def gateway_meter() -> Callable[[], float]:
                before = tree_cpu_seconds(gpid)
                return lambda: tree_cpu_seconds(gpid) - before

            gateway_curve, gateway_sent = await _cpu_curve(gateway_url, model, config, gateway_meter)
            through = await _low_load(gateway_url, replica_url, model, config)
    replica_cpu, gateway_cpu = replica_curve[0][1], gateway_curve[0][1]
    return Costs(replica_cpu, gateway_cpu, cold, replica_sent, gateway_sent,
                 replica_wall_s=max(replica_cpu, direct.outside_s),
                 gateway_wall_s=max(gateway_cpu, through.outside_s - direct.outside_s),
                 timer_lag_s=max(0.0, direct.queue_s - config.max_delay_s),
                 served_compute_s=direct.compute_s, served_rows=direct.rows,
                 replica_busy_cpu_s=replica_curve[-1][1], gateway_busy_cpu_s=gateway_curve[-1][1],
                 replica_cpu_curve=replica_curve, gateway_cpu_curve=gateway_curve)
