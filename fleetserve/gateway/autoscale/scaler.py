"""The autoscaler of one gateway: a tick task that turns what the gateway saw into a desired replica count.

The forwarding core feeds a :class:`~fleetserve.autoscale.window.SignalWindow` on every request (one
``arrival``, one ``observe`` per answered attempt). Every ``interval_s`` (and at once when a first request
is held at zero replicas) :meth:`GatewayAutoscaler.tick` takes the window's snapshot of the fleet, asks the
:class:`~fleetserve.autoscale.controller.Autoscaler` (the configured rule within the replica range) and
exports the decision (:mod:`.metrics`). Actuators read it from ``GET /gateway/autoscale`` (:meth:`state`),
where a long poll (:meth:`wait_change`) lets them act the moment the desired count moves.

Membership — which replicas are ready, starting or draining — comes from the actuator when the gateway runs
``--discovery actuator`` (:mod:`.members`, with the start-up time it measured); with any other discovery the
balancer's own view stands in: healthy replicas are ready, those not yet probed are starting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.autoscale.controller import Autoscaler, Decision
from fleetserve.autoscale.window import Membership, SignalWindow
from fleetserve.gateway.autoscale.hold import HoldQueue
from fleetserve.gateway.autoscale.members import ActuatorMembership, Members
from fleetserve.gateway.autoscale.metrics import AutoscaleMetrics
from fleetserve.gateway.balance import Balancer


class GatewayAutoscaler:
    """The window, the controller, the hold queue (with ``min_replicas`` 0) and the actuator's membership
    (with ``actuator``) of one gateway."""

    def __init__(self, config: AutoscaleConfig, balancer: Balancer, registry: CollectorRegistry, *,
                 actuator: bool, hold_max: int, hold_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic, autoscaler: Autoscaler | None = None) -> None:
        self.config = config
        self._balancer = balancer
        self._clock = clock
        self.window = SignalWindow(clock, config.rate_window_s, config.latency_window_s)
        self.autoscaler = autoscaler if autoscaler is not None else Autoscaler.from_config(config)
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self.metrics = AutoscaleMetrics(registry, config.rule, lambda: self.held)
        self.holds = None
        if config.min_replicas == 0:
            self.holds = HoldQueue(hold_max, hold_timeout_s, clock=clock, on_hold=self._wake.set,
                                   on_end=self.metrics.held)
        self.membership = ActuatorMembership(balancer) if actuator else None
        self.last: Decision | None = None

    @property
    def held(self) -> int:
        return 0 if self.holds is None else self.holds.held

    @property
    def desired(self) -> int | None:
        return self.autoscaler.desired

    def elastic(self) -> bool:
        """Whether this gateway's own actuator may still grow the fleet: requests wait for a first replica, or
        (with ``--discovery actuator``) the last tick saw fewer ready replicas than ``max_replicas``; replicas
        still starting do not count, as their capacity is not there yet. A fleet that something else scales
        (Kubernetes) or that nothing scales (static backends) is never counted as growing."""
        if self.held:
            return True
        last = self.last
        return self.membership is not None and last is not None and last.signals.ready < self.config.max_replicas

    def members(self) -> Membership:
        """Ready, starting and draining replicas now: the actuator's word, else the balancer's health view."""
        if self.membership is not None:
            current = self.membership.current
            return Membership(current.ready_urls, current.starting, current.draining)
        ready: list[str] = []
        starting: list[str] = []
        for row in self._balancer.snapshot():
            if row["state"] == "healthy":
                ready.append(str(row["url"]))
            elif row["state"] == "unknown":
                starting.append(str(row["url"]))
        return Membership(tuple(ready), tuple(starting))

    def put_members(self, members: Members) -> tuple[int, int]:
        """Take the actuator's membership (only with ``--discovery actuator``); (inserted, removed)."""
        assert self.membership is not None
        return self.membership.apply(members)

    def tick(self) -> Decision:
        """Snapshot the fleet, ask the rule, export the decision."""
        members = self.members()
        startup = None if self.membership is None else self.membership.current.startup_s
        signals = self.window.snapshot(members, self.held, startup)
        previous = self.autoscaler.desired
        decision = self.autoscaler.tick(signals)
        self.last = decision
        self.metrics.snapshot(decision.desired, signals.ready, signals.starting, signals.draining)
        self.metrics.decisions.labels(decision.direction, decision.reason).inc()
        if decision.desired != previous:
            self._changed.set()
            self._changed = asyncio.Event()
        return decision

    async def run(self) -> None:
        """Tick every ``interval_s``, and at once when woken (a first request held), until cancelled."""
        while True:
            self._wake.clear()
            self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.interval_s)

    async def wait_change(self, desired: int | None, timeout_s: float) -> None:
        """Return once the desired count differs from ``desired`` (at once if it does), or after ``timeout_s``."""
        if self.desired != desired:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    def summary(self) -> dict[str, object]:
        """The dashboard's view: the rule, the desired count, the fleet the last tick saw, requests held now."""
        signals = None if self.last is None else self.last.signals
        return {"rule": self.config.rule, "desired": self.desired,
                "ready": None if signals is None else signals.ready,
                "starting": None if signals is None else signals.starting,
                "draining": None if signals is None else signals.draining, "held": self.held}

    def state(self) -> dict[str, Any]:
        """The body of ``GET /gateway/autoscale``: the controller's state, the hold queue, the members."""
        state = self.autoscaler.state()
        state["interval_s"] = self.config.interval_s
        state["held_now"] = self.held
        state["hold"] = None if self.holds is None else {
            "capacity": self.holds.capacity, "timeout_s": self.holds.timeout_s}
        state["discovery"] = "actuator" if self.membership is not None else "balancer"
        members = self.members()
        state["members"] = {"ready": list(members.ready), "starting": list(members.starting),
                            "draining": list(members.draining),
                            "startup_s": None if self.membership is None else self.membership.current.startup_s}
        return state
