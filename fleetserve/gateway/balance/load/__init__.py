"""Load: what the balancer measures about each endpoint, one estimator per module (tower's ``load``).

- :mod:`.pending` — requests this gateway has in flight there (tower's ``PendingRequests``);
- :mod:`.peak_ewma` — peak-sensitive latency (tower's ``PeakEwma``, Finagle's);
- :mod:`.reported` — what the replica reports about itself on every response (ORCA).

:class:`EndpointLoad` holds them all for one endpoint; the balancer updates it when a request starts or
finishes. Each estimator module also defines a :class:`Cost`, the number the power-of-two-choices policy
compares (:mod:`fleetserve.gateway.balance.policies.p2c`).
"""

from fleetserve.gateway.balance.load.endpoint import Cost, EndpointLoad, LoadConfig
from fleetserve.gateway.balance.load.peak_ewma import PeakEwma, peak_ewma_cost
from fleetserve.gateway.balance.load.pending import pending_cost
from fleetserve.gateway.balance.load.reported import ReportedLoad, outstanding, reported_cost

__all__ = [
    "Cost",
    "EndpointLoad",
    "LoadConfig",
    "PeakEwma",
    "ReportedLoad",
    "outstanding",
    "peak_ewma_cost",
    "pending_cost",
    "reported_cost",
]
