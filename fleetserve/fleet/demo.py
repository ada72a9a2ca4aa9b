"""``make demo``: start a local fleet, drive a 20-second open-loop load through its gateway, print a report.

Writes ``out/demo/report.json`` and ``out/demo/latency.png`` (latency over time), then stops the fleet.

    python -m fleetserve.fleet.demo [--model minilm] [--precision int8] [--replicas 2] [--rate 100] [--duration 20]
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.plot import PlotUnavailable, plot_report
from fleetserve.engine.base import Precision
from fleetserve.engine.builder import build
from fleetserve.errors import UsageError
from fleetserve.fleet.config import FleetConfig, gateway_config, replica_config
from fleetserve.fleet.supervisor import Supervisor
from fleetserve.options import Parser, add_options, help_formatter, option, resolve


@dataclass(frozen=True)
class DemoOptions:
    model: str = option("minilm", "model every replica serves")
    precision: Precision = option(Precision.INT8, "engine precision")
    replicas: int = option(2, "replicas behind the gateway")
    rate: float = option(100.0, "requests per second (Poisson, realistic text-length mix)")
    duration: float = option(20.0, "measured seconds")
    port: int = option(8080, "gateway port")
    base_port: int = option(8100, "first replica port")
    out: Path = option(Path("out/demo"), "folder for report.json and latency.png")


async def demo(options: DemoOptions) -> int:
    fleet = FleetConfig(replicas=options.replicas, gateway_port=options.port, base_port=options.base_port,
                        status_interval_s=5.0)
    # No access log: a line per request from every process would bury the report (the demo sends thousands).
    replica = replica_config(options.model, ("--drain-grace-s", "1", "--access-log-rate", "0"),
                             {"engine.precision": options.precision})
    supervisor = Supervisor(fleet, replica, gateway_config(("--access-log-rate", "0")))
    stop = asyncio.Event()
    fleet_task = asyncio.create_task(supervisor.run(stop))
    try:
        while not all(m.ready for m in supervisor.members):
            if fleet_task.done():
                return fleet_task.result() or 1
            await asyncio.sleep(0.2)
        url = f"http://{fleet.host}:{fleet.gateway_port}"
        print(f"\nwatch it live: {url}/dashboard")
        print(f"driving {options.rate:.0f} requests/s (Poisson, realistic text-length mix) at {url}/inference "
              f"for {options.duration:.0f} s ...", flush=True)
        report = await run_load(LoadConfig(url=url, rate=options.rate, concurrency=None, duration_s=options.duration,
                                           warmup_s=2.0, workload="texts", model=options.model))
        print(report.summary_table())
        out = options.out
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report.to_json(), indent=2))
        try:
            plot_report(report, out / "latency.png")
            print(f"report: {out / 'report.json'}  plot: {out / 'latency.png'}")
        except PlotUnavailable as exc:
            print(f"report: {out / 'report.json'}  (no plot: {exc})")
        return 0
    finally:
        stop.set()
        await fleet_task


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m fleetserve.fleet.demo", description=__doc__, formatter_class=help_formatter)
    add_options(parser, DemoOptions)
    try:
        options = resolve(DemoOptions, parser.parse_args(argv))
    except UsageError as exc:
        print(f"demo: error: {exc.message}")
        return 2
    built = build(replica_config(options.model, (), {"engine.precision": options.precision}).engine)
    acc = built.report.get("accuracy") or {}
    print(f"engine {built.key} ({'cache hit' if built.cache_hit else 'built'}): {built.report.get('method')}"
          + (f", mean cosine vs fp32 {acc['mean_cosine']:.4f}" if isinstance(acc, dict) and acc else ""))
    return asyncio.run(demo(options))


if __name__ == "__main__":
    raise SystemExit(main())
