"""``fleetserve up [MODEL]``: a local fleet — N supervised replicas and a gateway.

``up``'s own options (engine, policy, fleet shape) and the ``--replica-args`` / ``--gateway-args`` flags are
validated here, before any process starts; each child then gets its finished config (see
:mod:`fleetserve.fleet.config`).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import dataclass

from fleetserve.engine.base import Precision
from fleetserve.engine.config import MODEL_HELP
from fleetserve.engine.registry import BACKENDS
from fleetserve.fleet.config import FleetConfig, gateway_config, replica_config, split_flags
from fleetserve.fleet.supervisor import Supervisor
from fleetserve.gateway.balance.policies import DEFAULT_POLICY, POLICIES
from fleetserve.gateway.config import GatewayConfig
from fleetserve.options import option, section
from fleetserve.replica.config import ReplicaConfig

# A local fleet's replicas leave a drained process's port quickly: the gateway retries refused connections.
LOCAL_DRAIN_GRACE = ("--drain-grace-s", "1")


@dataclass(frozen=True)
class UpOptions:
    model: str = option("minilm", MODEL_HELP, positional=True)
    fleet: FleetConfig = section(FleetConfig)
    precision: Precision = option(Precision.FP32, "engine precision of every replica")
    backend: str = option("auto", "engine backend of every replica", choices=("auto", *BACKENDS))
    policy: str = option(DEFAULT_POLICY, "the gateway's balancing policy", choices=POLICIES.names)
    workers: int = option(1, "gateway worker processes")
    replica_args: tuple[str, ...] = option((), "further `fleetserve serve` options for every replica, one string",
                                           parse=split_flags, repeat=False, metavar="'FLAGS'")
    gateway_args: tuple[str, ...] = option((), "further `fleetserve gateway` options, one string",
                                           parse=split_flags, repeat=False, metavar="'FLAGS'")

    def replica(self) -> ReplicaConfig:
        return replica_config(self.model, (*LOCAL_DRAIN_GRACE, *self.replica_args),
                              {"engine.precision": self.precision, "engine.backend": self.backend})

    def gateway(self) -> GatewayConfig:
        return gateway_config(self.gateway_args, {"gateway.balancer.policy": self.policy,
                                                  "gateway.workers": self.workers})


OPTIONS = UpOptions


def run(options: UpOptions) -> int:
    from fleetserve.engine.builder import build

    replica, gateway = options.replica(), options.gateway()
    # Build once, up front: replicas then load from the cache instead of racing to build.
    build(replica.engine)
    return asyncio.run(_main(Supervisor(options.fleet, replica, gateway)))


async def _main(supervisor: Supervisor) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tty = sys.stdout.isatty()

    def status(line: str) -> None:
        if tty:
            print(f"\r{line}  ", end="", flush=True)

    await supervisor.run(stop, status)
    if tty:
        print()
    return 0
