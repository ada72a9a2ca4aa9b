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
requests), so both are upper bounds for busier processes; BENCHMARKS.md §4.3 measures the gateway at
saturation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.scenarios import tree_cpu_seconds
from fleetserve.deploy.local import free_port
from fleetserve.errors import FleetserveError
from fleetserve.fleet.supervisor import http_ok


@dataclass(frozen=True)
class CostConfig:
    duration_s: float = 5.0
    ready_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.ready_timeout_s <= 0:
            raise ValueError("cost measurement durations must be > 0")


@dataclass(frozen=True)
class Costs:
    replica_cpu_s: float
    gateway_cpu_s: float
    cold_start_s: float
    replica_requests: int
    gateway_requests: int


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each thread of ``pid`` (Linux ``/proc``); threads gone meanwhile are skipped."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def replica_overhead(pid: int, before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds of every thread but the engine's (the busiest one other than the main thread) in between."""
    spent = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}
    engine = max((cpu for tid, cpu in spent.items() if tid != pid), default=0.0)
    return sum(spent.values()) - engine


@contextlib.asynccontextmanager
async def _process(argv: list[str], ready_url: str, timeout_s: float) -> AsyncIterator[tuple[int, float]]:
    """Start ``argv``; yield (pid, seconds until ``ready_url`` answered 200); stop it (SIGTERM, then kill)."""
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        while not await asyncio.to_thread(http_ok, ready_url):
            if proc.returncode is not None:
                err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
                last = err.strip().splitlines()[-1:] or ["(no output)"]
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


async def _closed_loop(url: str, model: str, duration_s: float) -> int:
    report = await run_load(LoadConfig(url=url, rate=None, concurrency=1, duration_s=duration_s,
                                       workload="texts", model=model))
    if report.ok == 0:
        raise FleetserveError(f"no request to {url} succeeded while measuring CPU costs: {dict(report.errors_by_type)}")
    return report.sent


async def measure_costs(model: str, serve_args: list[str], config: CostConfig) -> Costs:
    cli = [sys.executable, "-m", "fleetserve.cli"]
    port = free_port()
    replica_url = f"http://127.0.0.1:{port}"
    replica = [*cli, "serve", model, "--host", "127.0.0.1", "--port", str(port), "--grpc-port", "0",
               "--threads", "1", *serve_args]
    async with _process(replica, f"{replica_url}/v2/health/ready", config.ready_timeout_s) as (rpid, cold):
        await _closed_loop(replica_url, model, min(1.0, config.duration_s))  # first-request costs, not counted
        before = thread_cpu_seconds(rpid)
        sent = await _closed_loop(replica_url, model, config.duration_s)
        replica_cpu = replica_overhead(rpid, before, thread_cpu_seconds(rpid)) / sent
        gport = free_port()
        gateway_url = f"http://127.0.0.1:{gport}"
        gateway = [*cli, "gateway", "--backend", replica_url, "--host", "127.0.0.1", "--port", str(gport),
                   "--health-interval", "1"]
        async with _process(gateway, f"{gateway_url}/readyz", config.ready_timeout_s) as (gpid, _):
            await _closed_loop(gateway_url, model, min(1.0, config.duration_s))
            g0 = tree_cpu_seconds(gpid)
            gsent = await _closed_loop(gateway_url, model, config.duration_s)
            gateway_cpu = (tree_cpu_seconds(gpid) - g0) / gsent
    return Costs(replica_cpu, gateway_cpu, cold, sent, gsent)
