"""Balancing policies, chosen by name and imported only when chosen: one power-of-two-choices over a
pluggable cost (:mod:`.p2c`: ``least-pending``, ``p2c-peak-ewma``, ``queue-aware``), round-robin and
smooth weighted round-robin.

``POLICIES`` maps the name used on the command line (``--policy``) to ``"module:Class"``. The
balancer builds its policy with :func:`create_policy` and never imports a concrete one.
"""

from __future__ import annotations

import random

from fleetserve.gateway.balance.policies.base import (
    Clock,
    LoadSignals,
    Policy,
    PolicyFactory,
    RequestContext,
    StatelessPolicy,
)
from fleetserve.importer import Registry

DEFAULT_POLICY = "p2c-peak-ewma"

POLICIES: Registry[PolicyFactory] = Registry("balancing policy", {
    "round-robin": "fleetserve.gateway.balance.policies.round_robin:RoundRobin",
    "weighted-round-robin": "fleetserve.gateway.balance.policies.weighted_round_robin:WeightedRoundRobin",
    "least-pending": "fleetserve.gateway.balance.policies.p2c:LeastPending",
    "p2c-peak-ewma": "fleetserve.gateway.balance.policies.p2c:PeakEwmaP2C",
    "queue-aware": "fleetserve.gateway.balance.policies.p2c:QueueAware",
})


def policy_names() -> list[str]:
    return POLICIES.names()


def load_policy(name: str) -> PolicyFactory:
    """Import and return the policy class registered as ``name``."""
    return POLICIES.load(name)


def create_policy(name: str, signals: LoadSignals, *, clock: Clock, rng: random.Random) -> Policy:
    return load_policy(name)(signals, clock=clock, rng=rng)


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Clock",
    "LoadSignals",
    "Policy",
    "PolicyFactory",
    "RequestContext",
    "StatelessPolicy",
    "create_policy",
    "load_policy",
    "policy_names",
]
