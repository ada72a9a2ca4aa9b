"""The autoscaler's metrics on the gateway's ``/metrics``, registered only when autoscaling is on.

``fleetserve_autoscale_desired_replicas{rule}`` is what an actuator (or Kubernetes' HPA, through
prometheus-adapter's External metric) carries out; ``fleetserve_autoscale_replicas{state}`` is the fleet the
rule saw at its last tick (ready, starting, draining), so a panel of both shows how far the fleet lags the
decision. Held requests (scale from zero) are read live, their outcomes counted.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetserve.gateway.autoscale.hold import Held

REPLICA_STATES = ("ready", "starting", "draining")


class AutoscaleMetrics:
    def __init__(self, registry: CollectorRegistry, rule: str, held: Callable[[], int]) -> None:
        self.desired = Gauge("fleetserve_autoscale_desired_replicas", "Replicas the autoscaler's rule wants now",
                             ["rule"], registry=registry).labels(rule)
        self.decisions = Counter("fleetserve_autoscale_decisions", "Autoscaler decisions that changed the desired "
                                 "count, by direction (up, down) and the rule's reason", ["direction", "reason"],
                                 registry=registry)
        self.replicas = Gauge("fleetserve_autoscale_replicas", "Replicas by state in the autoscaler's last "
                              "snapshot (ready: routed to; starting: asked for; draining: leaving)", ["state"],
                              registry=registry)
        for state in REPLICA_STATES:
            self.replicas.labels(state).set(0)
        Gauge("fleetserve_autoscale_held_requests", "Requests waiting for a first ready replica (scale from zero)",
              registry=registry).set_function(lambda: float(held()))
        self._holds = Counter("fleetserve_autoscale_holds", "Requests that waited for a first ready replica, by how "
                              "the wait ended (released; full: refused, the queue at its bound; timeout)",
                              ["outcome"], registry=registry)
        self._hold_children = {how: self._holds.labels(how.value) for how in Held}

    def held(self, how: Held) -> None:
        self._hold_children[how].inc()

    def snapshot(self, desired: int, ready: int, starting: int, draining: int) -> None:
        self.desired.set(desired)
        for state, count in zip(REPLICA_STATES, (ready, starting, draining), strict=True):
            self.replicas.labels(state).set(count)
