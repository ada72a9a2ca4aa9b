"""Balance: which replicas exist, how loaded each is, and which one takes a request (tower's balance / load /
discover).

The public surface, which the forwarding core, the admin routes, the simulator (:mod:`fleetserve.sim`) and
the autoscaler's hook rely on:

- :class:`Balancer` — ``apply(Insert | Remove)`` (discovery), ``pick(ctx, exclude)`` (an endpoint that may
  take the request, honouring health, ejection, panic and the per-replica cap), ``start(ep) -> Ticket`` and
  ``Ticket.finish(status=, connect_error=, latency_s=, report=)`` around every attempt, ``endpoints()``,
  ``load(ep)`` (an :class:`EndpointLoad`: pending, peak-EWMA, the last ORCA report), ``snapshot()`` (one
  JSON row per endpoint, as ``GET /gateway/backends`` shows it), ``retry_budget``, ``active_requests``,
  ``panic`` and ``warmed``;
- :class:`BalancerConfig` and the policy registry (:mod:`.policies`: ``POLICIES``, ``DEFAULT_POLICY``,
  ``RequestContext``);
- :class:`Endpoint`, the discovery events :class:`Insert` / :class:`Remove` and sources (:mod:`.discovery`),
  and :class:`BalancerObserver`, through which the gateway's metrics object
  (:class:`fleetserve.gateway.metrics.GatewayMetrics`) hears of ejections and health changes.

Each concern is a module: :mod:`.endpoint`, :mod:`.discovery`, :mod:`.health` (active probes), :mod:`.outlier`
(passive ejection), :mod:`.slowstart`, :mod:`.retry` (the retry budget), :mod:`.load` (one estimator per
module), :mod:`.policies` (one power-of-two-choices over a pluggable cost; round-robin; weighted round-robin).
"""

from fleetserve.gateway.balance.balancer import Balancer, Ticket
from fleetserve.gateway.balance.config import BalancerConfig
from fleetserve.gateway.balance.discovery import Discovery, Event, Insert, Remove, run_discovery
from fleetserve.gateway.balance.endpoint import MAX_WEIGHT, Endpoint
from fleetserve.gateway.balance.load import EndpointLoad
from fleetserve.gateway.balance.observer import REMOVED, BalancerObserver
from fleetserve.gateway.balance.policies import DEFAULT_POLICY, POLICIES, RequestContext, policy_names
from fleetserve.gateway.balance.retry import RetryBudget

__all__ = [
    "DEFAULT_POLICY",
    "MAX_WEIGHT",
    "POLICIES",
    "REMOVED",
    "Balancer",
    "BalancerConfig",
    "BalancerObserver",
    "Discovery",
    "Endpoint",
    "EndpointLoad",
    "Event",
    "Insert",
    "Remove",
    "RequestContext",
    "RetryBudget",
    "Ticket",
    "policy_names",
    "run_discovery",
]
