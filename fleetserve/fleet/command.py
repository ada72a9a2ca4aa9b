"""``fleetserve up [--replicas 3] [MODEL]``: a local fleet — N supervised replicas and a gateway."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys

from fleetserve.fleet.supervisor import FleetConfig, Supervisor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default="minilm")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="gateway port")
    parser.add_argument("--base-port", type=int, default=8100, help="first replica port (HTTP; gRPC is +1)")
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes")
    parser.add_argument("--policy", default="p2c-peak-ewma")
    parser.add_argument("--precision", default="fp32", help="engine precision for every replica")
    parser.add_argument("--replica-args", default="", help="extra `fleetserve serve` flags (one string)")
    parser.add_argument("--gateway-args", default="", help="extra `fleetserve gateway` flags (one string)")


def run(args: argparse.Namespace) -> int:
    from fleetserve.config import EngineConfig
    from fleetserve.engine.base import Precision
    from fleetserve.engine.builder import build

    # Build once, up front: replicas then load from the cache instead of racing to build.
    build(EngineConfig(model=args.model, precision=Precision(args.precision)))
    config = FleetConfig(
        model=args.model, replicas=args.replicas, host=args.host, gateway_port=args.port, base_port=args.base_port,
        gateway_workers=args.workers, policy=args.policy,
        replica_args=("--precision", args.precision, *shlex.split(args.replica_args)),
        gateway_args=tuple(shlex.split(args.gateway_args)),
    )
    return asyncio.run(_main(config))


async def _main(config: FleetConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tty = sys.stdout.isatty()

    def status(line: str) -> None:
        if tty:
            print(f"\r{line}  ", end="", flush=True)

    await Supervisor(config).run(stop, status)
    if tty:
        print()
    return 0
