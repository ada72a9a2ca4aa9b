"""The simulator's one door into the gateway: the real balancer, policies, health and outlier logic.

Everything the simulated gateway decides — which replica takes a request (every policy in
:mod:`fleetserve.gateway.balance.policies`), peak-EWMA and pending counts, slow start, health-check state,
passive outlier ejection and panic mode, the retry budget — is the product's own
:class:`~fleetserve.gateway.balance.Balancer` driven on the simulated clock with a seeded RNG. This module
only translates between simulated replicas and the gateway's endpoints and outcomes; it is the only module of
:mod:`fleetserve.sim` that imports gateway internals, so moving those modules is a change here alone.

What the simulator does not take from the gateway: the forwarding loop (:mod:`fleetserve.gateway.forward`)
is asyncio and sockets, so :mod:`fleetserve.sim.front` restates its retry rule in one place (retry on a
connect failure without the budget, on a reset or a 503 within it, on a replica not tried yet, at most
``max_retries`` times); hedging (opt-in) and request deadlines are not simulated.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
from collections.abc import Callable, Collection, Iterator
from typing import Generic, TypeVar

from fleetserve.gateway.balance import Balancer, BalancerConfig, Ticket
from fleetserve.gateway.balance.discovery import Insert, Remove
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.policies import DEFAULT_POLICY, RequestContext, policy_names
from fleetserve.gateway.balance.retry import RetryBudget
from fleetserve.wire import encode_load_report

__all__ = [
    "DEFAULT_POLICY",
    "BalancerConfig",
    "Endpoint",
    "SimBalancer",
    "Ticket",
    "endpoint",
    "load_report",
    "policy_names",
    "quiet_gateway_logs",
    "reads_load_reports",
]

R = TypeVar("R")

_CTX = RequestContext("POST", "/inference")


# Policies that read the load replicas report on their responses (ORCA; peak-EWMA's work factor too); for the
# others the simulator skips building and parsing the reports, which changes no decision and saves time.
_READS_LOAD_REPORTS = frozenset({"queue-aware", "p2c-peak-ewma"})


@contextlib.contextmanager
def quiet_gateway_logs() -> Iterator[None]:
    """Silence the balancer's logs while simulating: lines about simulated replicas' ejections and health
    flips (thousands in a large run) would bury the command's output and cost time."""
    logger = logging.getLogger("fleetserve.gateway")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def endpoint(name: str, weight: int = 1) -> Endpoint:
    """The gateway's endpoint for a simulated replica (one per replica, shared by every gateway worker)."""
    return Endpoint(url=f"http://{name}:8000", host=name, port=8000, weight=weight)


def reads_load_reports(policy: str) -> bool:
    return policy in _READS_LOAD_REPORTS


@functools.lru_cache(maxsize=4096)
def load_report(queue_depth: int, inflight: int) -> str:
    """The ORCA load report a replica puts on every response (what ``queue-aware`` and ``p2c-peak-ewma`` read).

    Cached: a fleet repeats a few small (queue depth, in-flight) pairs, and formatting the text for each of
    a million simulated answers was a visible share of a run.
    """
    return encode_load_report(queue_depth, inflight)


class SimBalancer(Generic[R]):
    """One gateway worker's balancer over simulated replicas ``R`` (any objects, keyed by name)."""

    def __init__(self, config: BalancerConfig, *, clock: Callable[[], float], rng: random.Random) -> None:
        self._balancer = Balancer(config, clock=clock, rng=rng)
        self._replicas: dict[str, R] = {}
        self._endpoints: dict[str, Endpoint] = {}

    @property
    def retry_budget(self) -> RetryBudget:
        return self._balancer.retry_budget

    def enable_active_health(self) -> None:
        self._balancer.enable_active_health()

    def add(self, ep: Endpoint, replica: R) -> None:
        self._replicas[ep.url] = replica
        self._endpoints[ep.host] = ep
        self._balancer.apply(Insert(ep))

    def remove(self, name: str) -> None:
        ep = self._endpoints.pop(name, None)
        if ep is not None:
            self._balancer.apply(Remove(ep))
            del self._replicas[ep.url]

    def probe(self, name: str, ok: bool) -> None:
        ep = self._endpoints.get(name)
        if ep is not None:
            self._balancer.set_probe_result(ep, ok)

    def names(self) -> list[str]:
        return list(self._endpoints)

    def route(self, exclude: Collection[Ticket] = ()) -> tuple[R, Ticket] | None:
        """Pick a replica for the next attempt (none of the earlier attempts' ``exclude``) and mark the request
        in flight there; None when no replica may take it."""
        balancer = self._balancer
        ep = balancer.pick(_CTX, [t.endpoint for t in exclude] if exclude else ())
        if ep is None:
            return None
        return self._replicas[ep.url], balancer.start(ep)
