"""Configuration of in-process test gateways (``serve_gateway``) in front of given backends."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fleetserve.gateway.balance import BalancerConfig
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.server import GatewayHandle

StartGateway = Callable[..., Awaitable[GatewayHandle]]


# The public server of every in-process test gateway when set (``make test`` runs the gateway tests a second time
# with it set to aiohttp); unset, the gateway's default.
SERVER_ENV = "FLEETSERVE_TEST_GATEWAY_SERVER"


def gateway_config(backends: Sequence[str], **overrides: Any) -> GatewayConfig:
    """A test gateway on a free port; health checks off unless asked for (tests drive the state)."""
    balancer = overrides.pop("balancer", None) or BalancerConfig()
    settings: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "backends": tuple(backends),
                                "health_checks": False, "balancer": balancer,
                                "server": os.environ.get(SERVER_ENV, GatewayConfig.server)}
    settings.update(overrides)
    return GatewayConfig(**settings)
