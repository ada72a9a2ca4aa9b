"""What the live dashboard costs the gateway (issue 14): gateway CPU with ``/dashboard`` open vs closed.

A real local fleet (``fleetserve up`` machinery: two ``tiny`` replicas and a gateway) runs four phases of
``--duration`` seconds each: idle and under light open-loop load (``--rate`` requests/s, constant arrivals,
the ``texts`` workload), each once with no browser and once with the page open in headless Chromium (Debian
package, driven over the DevTools protocol; it polls ``/gateway/fleet`` every second and redraws). Measured:
the gateway process's CPU time (user + system from /proc) over the phase, as a share of one core; the
browser's own CPU for reference; how long after navigation started the page drew its first frame. The
page's cost is the open-minus-closed difference (goal: < 1% of a core). The sampler that builds a frame
each second runs whether a page is open or not; its cost per tick and the cost of encoding one poll's JSON
are timed in-process, for 2 and for 32 replicas.

    .venv/bin/python benchmarks/dashboard_cpu.py [--duration 60] [--rate 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fleetserve.bench.browser import launch
from fleetserve.bench.cpu import tree_cpu_seconds
from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.deploy.local import free_port
from fleetserve.engine.builder import build
from fleetserve.fleet.config import FleetConfig, replica_config
from fleetserve.fleet.supervisor import Supervisor
from fleetserve.gateway.balance import Balancer, BalancerConfig
from fleetserve.gateway.balance.discovery import Insert
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.dashboard.sampler import FleetSampler
from fleetserve.gateway.metrics import GatewayMetrics


@contextlib.asynccontextmanager
async def fleet(replicas: int) -> AsyncIterator[Supervisor]:
    base = free_port()
    gateway = free_port()
    while base <= gateway < base + 2 * replicas:  # replica i takes base + 2i (HTTP) and base + 2i + 1 (gRPC)
        gateway = free_port()
    config = FleetConfig(replicas=replicas, gateway_port=gateway, base_port=base, status_interval_s=60.0)
    replica = replica_config("tiny", ("--drain-grace-s", "0"))
    build(replica.engine)
    supervisor = Supervisor(config, replica)
    stop = asyncio.Event()
    task = asyncio.create_task(supervisor.run(stop))
    try:
        while not all(m.ready for m in supervisor.members):
            if task.done():
                raise RuntimeError(f"fleet exited: {task.exception()}")
            await asyncio.sleep(0.2)
        yield supervisor
    finally:
        stop.set()
        await task


async def phase(url: str, pid: int, duration_s: float, rate: float, page: bool) -> dict[str, Any]:
    """Gateway (and browser) CPU over ``duration_s`` with the page open or not, under ``rate`` req/s (0: idle)."""
    async with contextlib.AsyncExitStack() as stack:
        browser_pid: int | None = None
        if page:
            browser = await stack.enter_async_context(launch())
            tab = await browser.open(url + "/dashboard")
            rendered_ms = int(await tab.wait_for("document.body?.dataset.renderedAt", timeout_s=10))
            browser_pid = browser.process.pid
        load = None
        if rate:
            config = LoadConfig(url=url, rate=rate, arrivals="constant", duration_s=duration_s, workload="texts",
                                model="tiny", timeout_s=5.0)
            load = asyncio.create_task(run_load(config))
        gateway0 = tree_cpu_seconds(pid)
        browser0 = tree_cpu_seconds(browser_pid) if browser_pid else 0.0
        started = time.monotonic()
        if load is not None:
            report = await load
        else:
            await asyncio.sleep(duration_s)
        elapsed = time.monotonic() - started
        row = {"load": f"{rate:g} req/s" if rate else "idle", "page": "open" if page else "closed",
               "seconds": round(elapsed, 1),
               "gateway_core_percent": round(100 * (tree_cpu_seconds(pid) - gateway0) / elapsed, 3),
               "browser_core_percent": (round(100 * (tree_cpu_seconds(browser_pid) - browser0) / elapsed, 2)
                                        if browser_pid else None)}
        if page:
            row["frames"] = int(await tab.evaluate("Number(document.body.dataset.frames)"))
            row["first_render_ms"] = rendered_ms
        if load is not None:
            row["ok_rps"] = round(report.achieved_rps, 1)
        return row


def sampler_costs(replicas: int, ticks: int = 300) -> dict[str, float]:
    """In-process: µs per sampler tick and per poll's JSON for ``replicas`` replicas with traffic on each."""
    metrics = GatewayMetrics()
    balancer = Balancer(BalancerConfig(), rng=random.Random(1), observer=metrics)
    rng = random.Random(2)
    urls = [f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(replicas)]
    for url in urls:
        balancer.apply(Insert(Endpoint.from_url(url)))
    wall = [time.time()]
    sampler = FleetSampler(metrics, balancer, "p2c-peak-ewma", wall=lambda: wall[0])
    for _ in range(50 * replicas):
        url = rng.choice(urls)
        latency = rng.lognormvariate(-4.5, 0.5)
        metrics.observe_attempt(url, latency)
        metrics.observe_request(url, 200)
        metrics.request_duration.series().observe(latency)
    started = time.perf_counter()
    for _ in range(ticks):
        sampler.tick()
        wall[0] += 1.0
    tick_us = (time.perf_counter() - started) / ticks * 1e6
    points = sampler.payload()["points"]
    assert isinstance(points, list)
    since = points[-2]["t"]  # a page that has every point but the newest
    started = time.perf_counter()
    for _ in range(ticks):
        body = json.dumps(sampler.payload(since=since))
    poll_us = (time.perf_counter() - started) / ticks * 1e6
    full = json.dumps(sampler.payload())
    return {"replicas": replicas, "tick_us": round(tick_us), "poll_json_us": round(poll_us),
            "poll_bytes": len(body), "first_poll_bytes": len(full)}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| load | page | gateway CPU, % of a core | browser CPU, % of a core | frames drawn | first render ms |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        browser = "–" if r["browser_core_percent"] is None else f"{r['browser_core_percent']:.1f}"
        lines.append(f"| {r['load']} | {r['page']} | {r['gateway_core_percent']:.2f} | {browser} | "
                     f"{r.get('frames', '–')} | {r.get('first_render_ms', '–')} |")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    async with fleet(2) as supervisor:
        url = supervisor.gateway.url
        assert supervisor.gateway.process is not None
        pid = supervisor.gateway.process.pid
        for rate in (0.0, args.rate):
            for page in (False, True):
                row = await phase(url, pid, args.duration, rate, page)
                print(json.dumps(row), flush=True)
                rows.append(row)
    costs = [sampler_costs(n) for n in (2, 32)]
    print(f"\ngateway CPU over {args.duration:.0f} s per phase, two tiny replicas:\n")
    print(table(rows))
    print("\nsampler (runs every second, page open or not) and one poll's JSON, in-process:\n")
    print("| replicas | tick µs | poll JSON µs | poll bytes (1 new point) | first poll bytes (2 min of points) |")
    print("|---|---|---|---|---|")
    for c in costs:
        print(f"| {c['replicas']} | {c['tick_us']} | {c['poll_json_us']} | {c['poll_bytes']} | "
              f"{c['first_poll_bytes']} |")
    return {"phases": rows, "sampler": costs}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per phase")
    parser.add_argument("--rate", type=float, default=20.0, help="light load, requests/s")
    parser.add_argument("--out", type=Path, default=Path("out/dashboard_cpu.json"))
    arguments = parser.parse_args()
    result = asyncio.run(main(arguments))
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(result, indent=2))
