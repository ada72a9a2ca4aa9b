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


class Observers:
    """Several observers as one, called in the order added (the balancer takes one observer)."""

    def __init__(self, *observers: BalancerObserver) -> None:
        self._observers = list(observers)

    def add(self, observer: BalancerObserver) -> None:
        self._observers.append(observer)

    def on_eject(self, ep: Endpoint) -> None:
        for observer in self._observers:
            observer.on_eject(ep)

    def on_readmit(self, ep: Endpoint) -> None:
        for observer in self._observers:
            observer.on_readmit(ep)

    def on_state_change(self, ep: Endpoint, state: str) -> None:
        for observer in self._observers:
            observer.on_state_change(ep, state)
