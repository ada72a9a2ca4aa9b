"""The policy protocol: choose one endpoint among candidates, reading load signals, nothing else.

A policy is pure decision logic. The balancer hands it a non-empty sequence of candidates that are
already filtered (healthy, not ejected, not excluded by the caller) and a :class:`RequestContext`;
the policy reads load through :class:`LoadSignals` and returns one candidate. It never touches the
network; time and randomness come from the injected ``clock`` and ``rng`` so tests replay exactly.
Policies are built by name through :func:`fleetserve.gateway.balance.policies.create_policy`.
"""

from __future__ import annotations

import random
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.load import EndpointLoad

Clock = Callable[[], float]

_NO_HEADERS: Mapping[str, str] = types.MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a policy may know about the request being routed."""

    method: str = "POST"
    path: str = "/"
    body_size: int = 0
    headers: Mapping[str, str] = field(default_factory=lambda: _NO_HEADERS)
    request_id: str = ""


class LoadSignals(Protocol):
    """Read access to the load signals of the endpoints a policy is given."""

    def load(self, ep: Endpoint) -> EndpointLoad: ...


class Policy(Protocol):
    def choose(self, candidates: Sequence[Endpoint], ctx: RequestContext) -> Endpoint:
        """Return one of ``candidates`` (never empty)."""
        ...

    def forget(self, ep: Endpoint) -> None:
        """Drop any per-endpoint state kept for ``ep``: it has left the fleet."""
        ...


class PolicyFactory(Protocol):
    def __call__(self, signals: LoadSignals, *, clock: Clock, rng: random.Random) -> Policy: ...


class StatelessPolicy:
    """Base for policies that keep nothing per endpoint."""

    def forget(self, ep: Endpoint) -> None:
        return None


def two_distinct(rng: random.Random, n: int) -> tuple[int, int]:
    """Two different indices in ``range(n)``, uniformly (n >= 2): the "two choices" of P2C."""
    first = rng.randrange(n)
    second = rng.randrange(n - 1)
    return first, second + 1 if second >= first else second
