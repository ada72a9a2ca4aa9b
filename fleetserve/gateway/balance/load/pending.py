"""Pending requests: how many requests this gateway has in flight on an endpoint (tower's ``PendingRequests``).

The balancer counts them in :class:`~fleetserve.gateway.balance.load.EndpointLoad` ``.pending`` when an
attempt starts and finishes. It is the cheapest signal and needs nothing from the replica, but it sees only
this gateway's (this worker's) requests.

Cost = (pending + 1) / effective weight: a weight-2 replica is allowed twice the queue, and a replica in
slow start looks proportionally busier (see :mod:`fleetserve.gateway.balance.slowstart`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetserve.gateway.balance.load.endpoint import EndpointLoad


def pending_cost(load: EndpointLoad, rival: EndpointLoad, now: float) -> float:
    return (load.pending + 1) / load.effective_weight(now)
