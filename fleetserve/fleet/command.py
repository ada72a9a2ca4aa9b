"""``fleetserve up [MODEL]``: a local fleet — N supervised replicas and a gateway.

``up``'s own options (engine, policy, fleet shape) and the ``--replica-args`` / ``--gateway-args`` flags are
validated here, before any process starts; each child then gets its finished config (see
:mod:`fleetserve.fleet.config`).

``--autoscale hpa|predictive`` starts the gateway alone, its rule on and its replicas coming from the local
actuator (:mod:`fleetserve.autoscale.actuators.local`), which starts ``--min-replicas`` at once and then as many
as the gateway's rule asks for, up to ``--max-replicas``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.engine.base import Precision
from fleetserve.engine.config import MODEL_HELP
from fleetserve.engine.registry import BACKENDS
from fleetserve.errors import UsageError
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
    autoscale: AutoscaleConfig = section(AutoscaleConfig, "autoscaling (--replicas is then not used)")

    def __post_init__(self) -> None:
        if self.autoscale.enabled and not self.fleet.gateway:
            raise ValueError("--autoscale runs its rule in the gateway: it cannot be used with --no-gateway")
        top = self.fleet.replica_port(self.autoscale.max_replicas)
        if self.autoscale.enabled and top > 65535:
            raise ValueError(f"base_port must leave room for {self.autoscale.max_replicas} replicas' two ports, "
                             f"got {self.fleet.base_port}")

    def replica(self) -> ReplicaConfig:
        return replica_config(self.model, (*LOCAL_DRAIN_GRACE, *self.replica_args),
                              {"engine.precision": self.precision, "engine.backend": self.backend})

    def gateway(self) -> GatewayConfig:
        config = gateway_config(self.gateway_args, {"gateway.balancer.policy": self.policy,
                                                    "gateway.workers": self.workers})
        if not self.autoscale.enabled:
            return config
        try:
            return replace(config, autoscale=self.autoscale, discovery="actuator", backends=())
        except ValueError as exc:
            raise UsageError(str(exc)) from None


OPTIONS = UpOptions


def run(options: UpOptions) -> int:
    from fleetserve.engine.builder import build

    replica, gateway = options.replica(), options.gateway()
    # Build once, up front: replicas then load from the cache instead of racing to build.
    build(replica.engine)
    return asyncio.run(_main(options, replica, gateway))


async def _main(options: UpOptions, replica: ReplicaConfig, gateway: GatewayConfig) -> int:
    scaling = options.autoscale
    if not scaling.enabled:
        return await _supervise(Supervisor(options.fleet, replica, gateway))
    from fleetserve.autoscale.actuators.local import LocalActuator
    from fleetserve.fleet.launch import ForkServerLauncher

    launcher = ForkServerLauncher()
    await launcher.prepare()
    supervisor = Supervisor(options.fleet, replica, gateway, launcher=launcher, initial=0,
                            threads=max(1, options.fleet.cores // scaling.max_replicas))
    actuator = LocalActuator(supervisor, supervisor.gateway.url, max_replicas=scaling.max_replicas)
    return await _supervise(supervisor, actuator.run)


async def _supervise(supervisor: Supervisor,
                     actuator: Callable[[asyncio.Event], Coroutine[Any, Any, None]] | None = None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tty = sys.stdout.isatty()

    def status(line: str) -> None:
        if tty:
            print(f"\r{line}  ", end="", flush=True)

    await supervisor.run(stop, status, actuator)
    if tty:
        print()
    return 0
