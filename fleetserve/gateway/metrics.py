"""Prometheus metrics of the gateway, in a registry of their own; created once and passed in.

:class:`GatewayMetrics` is also the balancer's ``BalancerObserver``: ejections and health state
changes arrive as calls, and ``fleetserve_gateway_backends{state}`` counts endpoints per state
(``ejected`` overrides the health state while an ejection lasts). Series labelled with a backend
that discovery removed are dropped, so a churning fleet does not grow the scrape forever. A new
backend's ejection counter starts at 0, not at its first ejection: Prometheus' ``increase()`` cannot see
the step of a series whose first sample is already 1, so an alert on ejections would miss the first one.

Latency histograms (the client's end-to-end time, ``fleetserve_gateway_request_duration_seconds``, and
each attempt's, ``..._upstream_duration_seconds``) share buckets at most 1.5x apart between 1 and 100 ms
(1.2-1.33x above 4 ms), where encoder requests live, so a quantile that ``histogram_quantile`` interpolates
inside a bucket is off by a fraction of its value. They are classic histograms: Prometheus' native (sparse)
histograms would resolve any range without choosing buckets, but ``prometheus_client`` has no native
histogram instrument (0.26 only parses them) and the Prometheus of Debian 12 (2.42) ingests them only over
the protobuf scrape format behind a feature flag. Both are :class:`~fleetserve.telemetry.histogram.LatencyHistogram`
(plain counts, bisection, no lock: the gateway observes and scrapes on its one event-loop thread), which
the live dashboard reads every second without building samples. The process collector adds ``process_*``
(CPU seconds, resident memory, open file descriptors), as on the replicas.
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.process_collector import ProcessCollector

from fleetserve.gateway.balance import REMOVED
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.telemetry.histogram import LatencyHistogram, Series

NO_BACKEND = "none"  # the label of answers the gateway gave itself (no replica, 413, 504 ...)
EJECTED = "ejected"
BACKEND_STATES = ("unknown", "healthy", "unhealthy", EJECTED)
# Inference latencies: sub-millisecond answers up to multi-second overloaded replicas, finest in 1-100 ms.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03,
    0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.requests = Counter("fleetserve_gateway_requests", "Requests answered, by the backend that "
                                "answered (none: the gateway itself) and HTTP status", ["backend", "code"],
                                registry=r)
        self.request_duration = LatencyHistogram("fleetserve_gateway_request_duration_seconds",
                                                 "Client requests on proxied routes, from their head read to "
                                                 "their response written (retries and hedges included)",
                                                 LATENCY_BUCKETS, registry=r)
        self.upstream_duration = LatencyHistogram("fleetserve_gateway_upstream_duration_seconds",
                                                  "Time of each attempt on a backend, until its whole response",
                                                  LATENCY_BUCKETS, ["backend"], registry=r)
        self.retries = Counter("fleetserve_gateway_retries", "Requests retried on another backend",
                               registry=r)
        self.ejections = Counter("fleetserve_gateway_ejections", "Outlier ejections", ["backend"], registry=r)
        self.retry_budget_exhausted = Counter("fleetserve_gateway_retry_budget_exhausted",
                                              "Retries not made because the retry budget was spent",
                                              registry=r)
        self.hedges = Counter("fleetserve_gateway_hedges", "Hedged second attempts, by which attempt "
                              "answered first (won: the hedge, lost: the original)", ["outcome"], registry=r)
        self.hedges_skipped = Counter("fleetserve_gateway_hedges_skipped", "Hedges due but not sent, by "
                                      "reason (budget: hedge budget spent; no_backend: no other replica; busy: the "
                                      "other replica had work outstanding)", ["reason"], registry=r)
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
        self._attempt_series: dict[str, Series] = {}

    def observe_request(self, backend: str, code: int) -> None:
        children = self._request_children.get(backend)
        if children is None:
            children = self._request_children[backend] = {}
        child = children.get(code)
        if child is None:
            child = children[code] = self.requests.labels(backend, str(code))
        child.inc()

    def observe_attempt(self, backend: str, seconds: float) -> None:
        series = self._attempt_series.get(backend)
        if series is None:
            series = self._attempt_series[backend] = self.upstream_duration.series(backend)
        series.observe(seconds)

    def render(self) -> bytes:
        """The exposition text of this process's metrics."""
        return generate_latest(self.registry)

    async def exposition(self) -> bytes:
        """What ``/metrics`` answers in a single-process gateway."""
        return self.render()

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
            if ep.url not in self._health:
                self.ejections.labels(ep.url)
            self._health[ep.url] = state
        self._recount()

    def _recount(self) -> None:
        tally = Tally(EJECTED if url in self._ejected else state for url, state in self._health.items())
        for state in BACKEND_STATES:
            self.backends.labels(state).set(tally.get(state, 0))

    def _forget(self, url: str) -> None:
        for code in self._request_children.pop(url, {}):
            self.requests.remove(url, str(code))
        self._attempt_series.pop(url, None)
        self.upstream_duration.remove(url)
        self.ejections.remove(url)
