"""Prometheus metrics of the gateway, in a registry of their own; created once and passed in.

:class:`GatewayMetrics` is also the balancer's ``BalancerObserver``: ejections and health state
changes arrive as calls, and ``fleetserve_gateway_backends{state}`` counts endpoints per state
(``ejected`` overrides the health state while an ejection lasts). Series labelled with a backend
that discovery removed are dropped, so a churning fleet does not grow the scrape forever.
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fleetserve.gateway.balancer import REMOVED
from fleetserve.gateway.endpoint import Endpoint

NO_BACKEND = "none"  # the label of answers the gateway gave itself (no replica, 413, 504 ...)
EJECTED = "ejected"
BACKEND_STATES = ("unknown", "healthy", "unhealthy", EJECTED)
# Inference latencies: sub-millisecond cache hits up to multi-second overloaded replicas.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter("fleetserve_gateway_requests", "Requests answered, by the backend that "
                                "answered (none: the gateway itself) and HTTP status", ["backend", "code"],
                                registry=r)
        self.upstream_duration = Histogram("fleetserve_gateway_upstream_duration_seconds",
                                           "Time of each attempt on a backend, until its whole response",
                                           ["backend"], buckets=LATENCY_BUCKETS, registry=r)
        self.retries = Counter("fleetserve_gateway_retries", "Requests retried on another backend",
                               registry=r)
        self.ejections = Counter("fleetserve_gateway_ejections", "Outlier ejections", ["backend"], registry=r)
        self.retry_budget_exhausted = Counter("fleetserve_gateway_retry_budget_exhausted",
                                              "Retries not made because the retry budget was spent",
                                              registry=r)
        self.hedges = Counter("fleetserve_gateway_hedges", "Hedged second attempts, by which attempt "
                              "answered first (won: the hedge, lost: the original)", ["outcome"], registry=r)
        self.hedges_skipped = Counter("fleetserve_gateway_hedges_skipped", "Hedges due but not sent, by "
                                      "reason (budget: hedge budget spent; no_backend: no other "
                                      "replica)", ["reason"], registry=r)
        self.inflight = Gauge("fleetserve_gateway_inflight_requests", "Client requests in progress",
                              registry=r)
        self.backends = Gauge("fleetserve_gateway_backends", "Backends per state", ["state"], registry=r)
        for state in BACKEND_STATES:
            self.backends.labels(state).set(0)
        self._health: dict[str, str] = {}
        self._ejected: set[str] = set()
        # Label children per backend, resolved once: ``.labels()`` takes a lock and builds a key tuple,
        # a cost every proxied request would pay twice.
        self._request_children: dict[str, dict[int, Counter]] = {}
        self._attempt_children: dict[str, Histogram] = {}

    def observe_request(self, backend: str, code: int) -> None:
        children = self._request_children.get(backend)
        if children is None:
            children = self._request_children[backend] = {}
        child = children.get(code)
        if child is None:
            child = children[code] = self.requests.labels(backend, str(code))
        child.inc()

    def observe_attempt(self, backend: str, seconds: float) -> None:
        child = self._attempt_children.get(backend)
        if child is None:
            child = self._attempt_children[backend] = self.upstream_duration.labels(backend)
        child.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    # BalancerObserver

    def on_eject(self, ep: Endpoint) -> None:
        self.ejections.labels(ep.url).inc()
        self._ejected.add(ep.url)
        self._recount()

    def on_readmit(self, ep: Endpoint) -> None:
        self._ejected.discard(ep.url)
        self._recount()

    def on_state_change(self, ep: Endpoint, state: str) -> None:
        if state == REMOVED:
            self._health.pop(ep.url, None)
            self._ejected.discard(ep.url)
            self._forget(ep.url)
        else:
            self._health[ep.url] = state
        self._recount()

    def _recount(self) -> None:
        tally = Tally(EJECTED if url in self._ejected else state for url, state in self._health.items())
        for state in BACKEND_STATES:
            self.backends.labels(state).set(tally.get(state, 0))

    def _forget(self, url: str) -> None:
        for code in self._request_children.pop(url, {}):
            self.requests.remove(url, str(code))
        self._attempt_children.pop(url, None)
        self.upstream_duration.remove(url)
        self.ejections.remove(url)
