"""Membership pushed by an actuator (``--discovery actuator``): ``PUT /gateway/autoscale/members``.

The actuator (``fleetserve up``'s local one) knows which replicas it started and in what state; it sends the
whole picture on every change::

    {"ready": [...], "starting": [...], "draining": [...], "startup_s": 1.4}

Each list holds backends as ``URL[=WEIGHT]`` strings or ``{url, weight, labels}`` mappings (the forms of
``--backend`` and discovery files); ``starting``, ``draining`` and ``startup_s`` (the start-up time the
actuator measured, decision to ready, or null) may be left out. The gateway routes to exactly ``ready``: a
URL that joins it is inserted into the balancer, one that leaves it is removed, so no new request goes
there while the requests it holds finish (draining). ``starting`` and ``draining`` only count in the
autoscaler's signals. The actuator puts a replica in ``ready`` after its readiness check passed, so that
check counts as the replica's first passing health probe: it takes traffic at once instead of after the
gateway's next probe round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetserve.gateway.balance import Balancer, Endpoint, Insert
from fleetserve.gateway.balance.discovery import MAX_ENDPOINTS, diff, endpoint_from_item

LISTS = ("ready", "starting", "draining")
FIELDS = (*LISTS, "startup_s")


@dataclass(frozen=True, slots=True)
class Members:
    """The fleet as the actuator last described it (URLs normalised as the balancer keys them)."""

    ready: tuple[Endpoint, ...] = ()
    starting: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()
    startup_s: float | None = None

    @property
    def ready_urls(self) -> tuple[str, ...]:
        return tuple(ep.url for ep in self.ready)

    def describe(self) -> dict[str, object]:
        return {"ready": list(self.ready_urls), "starting": list(self.starting), "draining": list(self.draining),
                "startup_s": self.startup_s}


def parse_members(body: object) -> Members:
    """The members a PUT body describes; ValueError naming the first problem."""
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object with {', '.join(LISTS)}, got {type(body).__name__}")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown keys {unknown} (allowed: {', '.join(FIELDS)})")
    if "ready" not in body:
        raise ValueError("'ready' is required (a list, empty when no replica is ready)")
    seen: dict[str, str] = {}
    lists: dict[str, list[Endpoint]] = {}
    for name in LISTS:
        items = body.get(name, [])
        if not isinstance(items, list):
            raise ValueError(f"'{name}' must be a list of backends, got {type(items).__name__}")
        endpoints = []
        for i, item in enumerate(items):
            ep = endpoint_from_item(item, f"{name}[{i}]")
            if not ep.url.startswith("http://"):
                raise ValueError(f"{name}[{i}]: only http:// backends are supported, got {ep.url}")
            if ep.url in seen:
                raise ValueError(f"{ep.url} is listed twice (in '{seen[ep.url]}' and '{name}')")
            seen[ep.url] = name
            endpoints.append(ep)
        lists[name] = endpoints
    if len(seen) > MAX_ENDPOINTS:
        raise ValueError(f"more than {MAX_ENDPOINTS} backends")
    startup = body.get("startup_s")
    if startup is not None and (isinstance(startup, bool) or not isinstance(startup, (int, float))
                                or not math.isfinite(startup) or startup < 0):
        raise ValueError(f"'startup_s' must be a number of seconds >= 0 or null, got {startup!r}")
    return Members(tuple(lists["ready"]), tuple(ep.url for ep in lists["starting"]),
                   tuple(ep.url for ep in lists["draining"]), None if startup is None else float(startup))


class ActuatorMembership:
    """Applies each :class:`Members` to the balancer: inserts what joined ``ready``, removes what left it."""

    def __init__(self, balancer: Balancer) -> None:
        self._balancer = balancer
        self.current = Members()

    def apply(self, members: Members) -> tuple[int, int]:
        """Route to exactly ``members.ready`` from now on; (inserted, removed)."""
        old = {ep.url: ep for ep in self.current.ready}
        new = {ep.url: ep for ep in members.ready}
        inserted = removed = 0
        for event in diff(old, new):
            self._balancer.apply(event)
            if isinstance(event, Insert):
                if event.endpoint.url not in old:
                    # The actuator's readiness check passed: count it as the first probe (unknown -> healthy).
                    self._balancer.set_probe_result(event.endpoint, True)
                    inserted += 1
            else:
                removed += 1
        self.current = members
        return inserted, removed
