"""What the balancer tells the rest of the gateway (metrics, logs) about its endpoints, as it happens."""

from __future__ import annotations

from typing import Protocol

from fleetserve.gateway.balance.endpoint import Endpoint

REMOVED = "removed"  # the state of an endpoint that discovery took away


class BalancerObserver(Protocol):
    """Hooks for metrics and logs; called synchronously, so keep them cheap.

    ``state`` is ``"unknown"``, ``"healthy"`` or ``"unhealthy"`` (a :class:`HealthState`), or
    ``"removed"`` when discovery took the endpoint away.
    """

    def on_eject(self, ep: Endpoint) -> None: ...

    def on_readmit(self, ep: Endpoint) -> None: ...

    def on_state_change(self, ep: Endpoint, state: str) -> None: ...


class NullObserver:
    def on_eject(self, ep: Endpoint) -> None:
        return None

    def on_readmit(self, ep: Endpoint) -> None:
        return None

    def on_state_change(self, ep: Endpoint, state: str) -> None:
        return None
