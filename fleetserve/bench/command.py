"""``fleetserve bench URL``: flags to :class:`LoadConfig`, run, print the table, write JSON and a plot.

Exit status: 0 when the run completed, 1 when not one request succeeded, 2 for invalid arguments
(or ``--plot`` without matplotlib, caught before any load is sent). Ctrl-C ends the sending early;
outstanding requests finish and the report covers the time run so far.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import signal
import sys
from pathlib import Path

from fleetserve.bench.arrivals import ARRIVALS
from fleetserve.bench.client import CLIENTS
from fleetserve.bench.eventloop import LOOPS, loop_factory
from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.report import LoadReport
from fleetserve.bench.workloads import WORKLOADS

_DEFAULTS = LoadConfig(url="http://localhost", rate=1.0, concurrency=None, duration_s=10.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="base URL of a replica, gateway or proxy, e.g. http://127.0.0.1:8080")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="open loop: requests per second (latency from schedule)")
    load.add_argument("--concurrency", type=int, help="closed loop: number of concurrent clients")
    parser.add_argument("--duration", type=float, default=_DEFAULTS.duration_s, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=_DEFAULTS.warmup_s, help="seconds sent, not measured")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default=_DEFAULTS.workload)
    parser.add_argument("--model", default=_DEFAULTS.model, help="model name for the v2 workloads")
    parser.add_argument(
        "--rows", type=int, default=_DEFAULTS.rows, help="v2 workloads: sequences per request (e.g. ranking candidates)"
    )
    parser.add_argument(
        "--tokens", type=int, default=_DEFAULTS.tokens, help="v2 workloads: tokens per row (default: the length mix)"
    )
    parser.add_argument(
        "--output",
        action="append",
        default=[],
        metavar="NAME",
        help="v2 workloads: ask for this output only (repeatable; binary in v2-binary); default: all outputs",
    )
    parser.add_argument("--arrivals", choices=sorted(ARRIVALS), default=_DEFAULTS.arrivals)
    parser.add_argument(
        "--long-fraction",
        type=float,
        default=_DEFAULTS.long_fraction,
        help="share of 100-300 token texts (the rest are 5-30 tokens)",
    )
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=_DEFAULTS.max_inflight,
        help="open loop: outstanding requests at most; more are counted as dropped",
    )
    parser.add_argument("--timeout", type=float, default=_DEFAULTS.timeout_s, help="per-request seconds")
    parser.add_argument("--seed", type=int, default=_DEFAULTS.seed)
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="extra request header (repeatable), e.g. 'Authorization: Bearer ...'",
    )
    parser.add_argument("--connections", type=int, help="connection pool size (default: see docs)")
    parser.add_argument("--client", choices=["auto", *sorted(CLIENTS)], default=_DEFAULTS.client)
    parser.add_argument(
        "--processes", type=int, default=_DEFAULTS.processes, help="worker processes sharing the load (results merged)"
    )
    parser.add_argument(
        "--max-samples", type=int, default=_DEFAULTS.max_samples, help="latency samples kept (a uniform subset beyond)"
    )
    parser.add_argument("--out", type=Path, help="write the report as JSON")
    parser.add_argument("--plot", type=Path, help="write latency/errors over time as PNG (needs matplotlib)")
    parser.add_argument("--per-second", action="store_true", help="also print the per-second table")
    parser.add_argument("--loop", choices=LOOPS, default="auto", help="event loop (auto: uvloop if installed)")


def parse_header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ValueError(f"--header takes 'NAME: VALUE', got {text!r}")
    return name.strip(), value.strip()


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    if args.rate is None and args.concurrency is None:
        raise ValueError("give --rate QPS (open loop) or --concurrency N (closed loop)")
    return LoadConfig(
        url=args.url,
        rate=args.rate,
        concurrency=args.concurrency,
        duration_s=args.duration,
        warmup_s=args.warmup,
        workload=args.workload,
        model=args.model,
        rows=args.rows,
        tokens=args.tokens,
        outputs=tuple(args.output),
        arrivals=args.arrivals,
        long_fraction=args.long_fraction,
        max_inflight=args.max_inflight,
        timeout_s=args.timeout,
        seed=args.seed,
        headers=dict(parse_header(h) for h in args.header),
        connections=args.connections,
        client=args.client,
        processes=args.processes,
        max_samples=args.max_samples,
    )


async def _run_until_interrupted(config: LoadConfig) -> LoadReport:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        return await run_load(config, stop=stop)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        new_loop = loop_factory(args.loop)
    except ValueError as exc:
        print(f"fleetserve bench: {exc}", file=sys.stderr)
        return 2
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        print("fleetserve bench: --plot needs matplotlib: pip install 'fleetserve[plot]'", file=sys.stderr)
        return 2
    with asyncio.Runner(loop_factory=new_loop) as runner:
        report = runner.run(_run_until_interrupted(config))
    print(report.summary_table(per_second=args.per_second))
    if args.out is not None:
        args.out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if args.plot is not None:
        from fleetserve.bench.plot import plot_report

        plot_report(report, args.plot)
    return 0 if report.ok else 1
