"""Load points for ``benchmarks/replica.py``: drive one server and measure it, its CPU and everyone else's.

The loop is the same for every server, fleetserve or Triton, so only the payloads differ. Closed loop:
``concurrency`` workers, each sending its next request when the previous one answers. Open loop: a
Poisson schedule fixed in advance, latency measured from each request's *scheduled* time so a stalled
server shows in the tail (no coordinated omission), at most ``max_inflight`` outstanding; a request
due while the bound is reached is counted ``dropped``. Requests go through fleetserve's load-generator
client (``fleetserve.bench``: HTTP/1.1 keep-alive on asyncio protocols, cheap per request).

CPU is read from /proc around each point: the whole machine's busy time, the server's process tree
and this process (the generator). On a shared box the rest ("others") is other people's work; a point
where others used more than ``noisy_cores`` is run once more and the quieter attempt kept.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetserve.bench.arrivals import arrival_offsets
from fleetserve.bench.client import ClientConfig, HttpClient, RequestError, open_client
from fleetserve.bench.cpu import tree_cpu_seconds
from fleetserve.bench.workloads import Payload

from _common import machine_cpu_s


@dataclass(frozen=True)
class LoadSettings:
    duration_s: float = 12.0
    warmup_s: float = 2.0
    max_inflight: int = 256
    noisy_cores: float = 0.3
    timeout_s: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.warmup_s < 0 or self.timeout_s <= 0:
            raise ValueError("duration and timeout must be > 0 and warmup >= 0")
        if self.max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {self.max_inflight}")


@dataclass
class Outcome:
    """What the measured window saw: latencies of 2xx answers (seconds) and failures by kind."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    late_max_s: float = 0.0  # open loop: worst lag of a send behind its schedule (generator falling behind)

    def summary(self, duration_s: float) -> dict[str, Any]:
        lat = np.array(self.latencies) * 1e3
        q = dict(zip(("p50_ms", "p90_ms", "p99_ms"), np.percentile(lat, [50, 90, 99]), strict=True)) if len(lat) else {}
        return {"ok": len(lat), "throughput_rps": len(lat) / duration_s, "errors": dict(self.errors),
                **{k: float(q.get(k, float("nan"))) for k in ("p50_ms", "p90_ms", "p99_ms")},
                "mean_ms": float(lat.mean()) if len(lat) else float("nan"), "late_max_ms": self.late_max_s * 1e3}


async def drive(
    client: HttpClient, prepared: list[object], settings: LoadSettings, concurrency: int | None, rate: float | None
) -> Outcome:
    """One load point: closed loop (``concurrency`` workers) or open loop (``rate`` requests/s, Poisson).

    A request counts if it was due inside the measured window; the run waits for the last answers."""
    out = Outcome()
    clock = time.monotonic
    start = clock()
    window, end = start + settings.warmup_s, start + settings.warmup_s + settings.duration_s

    async def exchange(raw: object, begin: float) -> None:
        try:
            status = await client.send(raw)
        except RequestError as exc:
            if begin >= window:
                out.errors[exc.kind] += 1
            return
        if begin >= window:
            if 200 <= status < 300:
                out.latencies.append(clock() - begin)
            else:
                out.errors[f"http_{status}"] += 1

    async def worker(k: int, step: int) -> None:
        while (begin := clock()) < end:
            await exchange(prepared[k % len(prepared)], begin)
            k += step

    if concurrency is not None:
        await asyncio.gather(*(worker(i, concurrency) for i in range(concurrency)))
        return out
    assert rate is not None
    tasks: set[asyncio.Task[None]] = set()
    for k, offset in enumerate(arrival_offsets("poisson", rate, random.Random(settings.seed))):
        due = start + offset
        if due >= end:
            break
        if (wait := due - clock()) > 0:
            await asyncio.sleep(wait)
        if len(tasks) >= settings.max_inflight:
            if due >= window:
                out.errors["dropped"] += 1
            continue
        out.late_max_s = max(out.late_max_s, clock() - due)
        task = asyncio.create_task(exchange(prepared[k % len(prepared)], due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks)
    return out


async def measure(
    url: str,
    payloads: list[Payload],
    server_pid: int,
    counters: Callable[[], tuple[float, float, float, float]],
    settings: LoadSettings,
    *,
    concurrency: int | None = None,
    rate: float | None = None,
) -> dict[str, Any]:
    """Run one point (again if it was noisy) and return its throughput, latency, batching and CPU figures.

    ``counters`` returns the server's (engine calls, rows, padded-sequence sum, sequence count) so far.
    """
    attempts: list[dict[str, Any]] = []
    for _ in range(2):
        client = await open_client("fast", ClientConfig(url, concurrency or settings.max_inflight, settings.timeout_s))
        prepared = [client.prepare(p) for p in payloads]
        loadavg, before = os.getloadavg()[0], counters()
        t0, m0, s0, g0 = time.monotonic(), machine_cpu_s(), tree_cpu_seconds(server_pid), time.process_time()
        try:
            outcome = await drive(client, prepared, settings, concurrency, rate)
        finally:
            await client.close()
        t1, m1, s1, g1 = time.monotonic(), machine_cpu_s(), tree_cpu_seconds(server_pid), time.process_time()
        calls, rows, seq_sum, seq_n = (b - a for a, b in zip(before, counters(), strict=True))
        wall = t1 - t0
        server, generator = (s1 - s0) / wall, (g1 - g0) / wall
        attempts.append({
            "concurrency": concurrency, "rate": rate, **outcome.summary(settings.duration_s),
            "mean_batch": rows / calls if calls else None, "mean_padded_seq": seq_sum / seq_n if seq_n else None,
            "cpu_cores": {"server": server, "generator": generator,
                          "others": max(0.0, (m1 - m0) / wall - server - generator)},
            "loadavg_1m_before": loadavg,
        })
        if attempts[-1]["cpu_cores"]["others"] <= settings.noisy_cores:
            break
    best = min(attempts, key=lambda a: a["cpu_cores"]["others"])
    best["attempts_others_cores"] = [round(a["cpu_cores"]["others"], 2) for a in attempts]
    return best
