"""``fleetserve gateway``: balance requests over replicas, behind the edge guards.

The options are :class:`GatewayConfig`'s (listeners, discovery, balancing, hedging) and the edge guards'
(:class:`~fleetserve.gateway.edge.options.EdgeOptions`, laid over the ``edge:`` section of ``--config``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge.options import EdgeOptions
from fleetserve.options import section


@dataclass(frozen=True)
class GatewayOptions:
    gateway: GatewayConfig = section(GatewayConfig)
    edge: EdgeOptions = section(EdgeOptions, "edge guards (also the edge: section of --config)")

    def config(self) -> GatewayConfig:
        """The gateway's config with its edge guards (ValueError naming a bad option)."""
        return replace(self.gateway, edge=self.edge.build())


OPTIONS = GatewayOptions


def run(options: GatewayOptions) -> int:
    from fleetserve.gateway.edge.guards import check_edge
    from fleetserve.gateway.workers import run_gateway

    config = options.config()
    check_edge(config.edge)
    return run_gateway(config)
