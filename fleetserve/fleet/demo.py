"""``make demo``: start a local fleet, drive a 20-second open-loop load through its gateway, print a report.

Writes ``out/demo/report.json`` and ``out/demo/latency.png`` (latency over time), then stops the fleet.

    python -m fleetserve.fleet.demo [--model minilm] [--replicas 2] [--rate 100] [--duration 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.plot import PlotUnavailable, plot_report
from fleetserve.config import EngineConfig
from fleetserve.engine.base import Precision
from fleetserve.engine.builder import build
from fleetserve.fleet.supervisor import FleetConfig, Supervisor


async def demo(args: argparse.Namespace) -> int:
    fleet = FleetConfig(
        model=args.model, replicas=args.replicas, gateway_port=args.port, base_port=args.base_port,
        replica_args=("--precision", args.precision), status_interval_s=5.0,
    )
    supervisor = Supervisor(fleet)
    stop = asyncio.Event()
    fleet_task = asyncio.create_task(supervisor.run(stop))
    try:
        while not all(m.ready for m in supervisor.members):
            if fleet_task.done():
                return fleet_task.result() or 1
            await asyncio.sleep(0.2)
        url = f"http://{fleet.host}:{fleet.gateway_port}"
        print(f"\ndriving {args.rate:.0f} requests/s (Poisson, realistic text-length mix) at {url}/inference "
              f"for {args.duration:.0f} s ...", flush=True)
        report = await run_load(LoadConfig(url=url, rate=args.rate, concurrency=None, duration_s=args.duration,
                                           warmup_s=2.0, workload="texts", model=args.model))
        print(report.summary_table())
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.json").write_text(json.dumps(report.to_json(), indent=2))
        try:
            plot_report(report, args.out / "latency.png")
            print(f"report: {args.out / 'report.json'}  plot: {args.out / 'latency.png'}")
        except PlotUnavailable as exc:
            print(f"report: {args.out / 'report.json'}  (no plot: {exc})")
        return 0
    finally:
        stop.set()
        await fleet_task


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--port", type=int, default=int(os.environ.get("FLEETSERVE_DEMO_PORT", "8080")))
    ap.add_argument("--base-port", type=int, default=8100)
    ap.add_argument("--out", type=Path, default=Path("out/demo"))
    args = ap.parse_args()
    built = build(EngineConfig(model=args.model, precision=Precision(args.precision)))
    acc = built.report.get("accuracy") or {}
    print(f"engine {built.key} ({'cache hit' if built.cache_hit else 'built'}): {built.report.get('method')}"
          + (f", mean cosine vs fp32 {acc['mean_cosine']:.4f}" if isinstance(acc, dict) and acc else ""))
    return asyncio.run(demo(args))


if __name__ == "__main__":
    raise SystemExit(main())
