"""The balancer: which replicas may take a request, and which one takes this one.

It ties together the pieces the way tower's ``balance::p2c`` ties ``discover`` and ``load``:
discovery events change the fleet (:meth:`Balancer.apply`), probe results and request outcomes
change each endpoint's state (:meth:`Balancer.set_probe_result`, :meth:`Ticket.finish`), and
:meth:`Balancer.pick` hands the routable endpoints to the configured policy.

Routable = health state ``healthy`` and not ejected by outlier detection. When fewer than
``panic_threshold_percent`` of the endpoints are routable the balancer is in *panic* (Envoy's panic
threshold) and routes over all endpoints: a mass failure of health checks is more often a probe or
network problem than every replica being dead, and some traffic beats none.

``pick`` is on every request's path, so the routable list is rebuilt only when something changes
(insert, remove, health flip, ejection, re-admission) and re-admission is checked against the
earliest ejection deadline, making the common case O(1) before the policy runs.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from fleetserve.gateway.balance.discovery import Event, Insert, Remove
from fleetserve.gateway.balance.discovery import run_discovery as run_discovery
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.health import EndpointHealth, HealthConfig, HealthState
from fleetserve.gateway.balance.load import EndpointLoad, LoadConfig
from fleetserve.gateway.balance.outlier import OutlierConfig, OutlierDetector, OutlierState
from fleetserve.gateway.balance.policies import DEFAULT_POLICY, POLICIES, RequestContext, create_policy
from fleetserve.gateway.balance.retry import RetryBudget, RetryBudgetConfig
from fleetserve.gateway.balance.slowstart import SlowStartConfig
from fleetserve.options import option

log = logging.getLogger(__name__)

REMOVED = "removed"


@dataclass(frozen=True)
class BalancerConfig:
    """Every knob of balancing, flat for the CLI; each component gets its own validated part."""

    policy: str = option(DEFAULT_POLICY, "balancing policy", choices=POLICIES.names)
    health_interval_s: float = option(2.0, "seconds between readiness probes of each backend",
                                      flag="--health-interval")
    health_timeout_s: float = option(3.0, "a readiness probe slower than this fails")
    unhealthy_threshold: int = option(3, "failed probes in a row that take a backend out")
    healthy_threshold: int = option(2, "passed probes in a row that bring it back")
    consecutive_errors: int = option(5, "5xx answers in a row that eject a backend (outlier detection)")
    consecutive_connect_errors: int = 2
    base_ejection_s: float = option(5.0, "first ejection's length; each later one is longer")
    max_ejection_s: float = 300.0
    max_ejection_percent: float = option(50.0, "never eject more than this share of the backends")
    ejection_decay_s: float = 30.0
    panic_threshold_percent: float = option(50.0, "below this share of routable backends, route over all of them")
    slow_start_s: float = option(0.0, "ramp a new or recovered backend's share of traffic up over this long")
    slow_start_aggression: float = 1.0
    slow_start_min_weight_percent: float = 10.0
    retry_budget_percent: float = option(20.0, "retries at most this share of the requests in flight")
    retry_min_concurrency: int = 3
    ewma_tau_s: float = 10.0
    ewma_default_rtt_s: float = 0.05
    report_max_age_s: float = 5.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown balancing policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if not 0 <= self.panic_threshold_percent <= 100:
            raise ValueError(f"panic_threshold_percent must be in 0..100, got {self.panic_threshold_percent}")
        self.health_config()
        self.outlier_config()
        self.slow_start_config()
        self.retry_budget_config()
        self.load_config()

    def health_config(self) -> HealthConfig:
        return HealthConfig(
            self.health_interval_s, self.health_timeout_s, self.unhealthy_threshold, self.healthy_threshold
        )

    def outlier_config(self) -> OutlierConfig:
        return OutlierConfig(
            self.consecutive_errors,
            self.consecutive_connect_errors,
            self.base_ejection_s,
            self.max_ejection_s,
            self.max_ejection_percent,
            self.ejection_decay_s,
        )

    def slow_start_config(self) -> SlowStartConfig:
        return SlowStartConfig(self.slow_start_s, self.slow_start_aggression, self.slow_start_min_weight_percent)

    def retry_budget_config(self) -> RetryBudgetConfig:
        return RetryBudgetConfig(self.retry_budget_percent, self.retry_min_concurrency)

    def load_config(self) -> LoadConfig:
        return LoadConfig(self.ewma_tau_s, self.ewma_default_rtt_s, self.report_max_age_s)


class BalancerObserver(Protocol):
    """Hooks for metrics and logs; called synchronously, so keep them cheap.

    ``state`` is ``"unknown"``, ``"healthy"`` or ``"unhealthy"`` (a :class:`HealthState`), or
    ``"removed"`` when discovery took the endpoint away.
    """

    def on_eject(self, ep: Endpoint) -> None: ...

    def on_readmit(self, ep: Endpoint) -> None: ...

    def on_state_change(self, ep: Endpoint, state: str) -> None: ...


class _NullObserver:
    def on_eject(self, ep: Endpoint) -> None:
        return None

    def on_readmit(self, ep: Endpoint) -> None:
        return None

    def on_state_change(self, ep: Endpoint, state: str) -> None:
        return None


class _Entry:
    __slots__ = ("endpoint", "health", "load", "outlier")

    def __init__(self, endpoint: Endpoint, load: EndpointLoad, health: EndpointHealth) -> None:
        self.endpoint = endpoint
        self.load = load
        self.health = health
        self.outlier = OutlierState()


class Ticket:
    """One request in flight on one endpoint; call :meth:`finish` exactly once when it ends."""

    __slots__ = ("_balancer", "_done", "_entry", "started_at")

    def __init__(self, balancer: Balancer, entry: _Entry, started_at: float) -> None:
        self._balancer = balancer
        self._entry = entry
        self._done = False
        self.started_at = started_at

    @property
    def endpoint(self) -> Endpoint:
        return self._entry.endpoint

    def finish(
        self,
        *,
        status: int | None = None,
        connect_error: bool = False,
        latency_s: float | None = None,
        report: str | None = None,
    ) -> None:
        """Record the outcome; later calls are ignored so ``finally`` blocks may call it freely.

        ``status`` is the upstream HTTP status (map an upstream timeout to 504); ``connect_error``
        that no connection could be made; ``status=None`` without a connect error means the client
        went away first, which says nothing about the replica. ``latency_s`` defaults to the time
        since :meth:`Balancer.start`. ``report`` is the load report the response carried (the
        ``endpoint-load-metrics`` value, :mod:`fleetserve.wire`).
        """
        if self._done:
            return
        self._done = True
        self._balancer._finish(self, status, connect_error, latency_s, report)


class Balancer:
    def __init__(
        self,
        config: BalancerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        observer: BalancerObserver | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._observer: BalancerObserver = observer or _NullObserver()
        self._health_config = config.health_config()
        self._load_config = config.load_config()
        self._slow_start = config.slow_start_config()
        self._outlier = OutlierDetector(config.outlier_config())
        self._policy = create_policy(config.policy, self, clock=clock, rng=rng or random.Random())
        self._retry_budget = RetryBudget(config.retry_budget_config(), lambda: self._active)
        self._entries: dict[str, _Entry] = {}
        self._active = 0
        self._active_health = False
        self._ejected = 0
        self._next_readmit_at = math.inf
        self._dirty = False
        self._routable: list[Endpoint] = []
        self._all: list[Endpoint] = []
        self._panic = False
        self._warmed = False

    def apply(self, event: Event) -> None:
        if isinstance(event, Insert):
            self._insert(event.endpoint)
        elif isinstance(event, Remove):
            self._remove(event.endpoint)
        else:
            raise TypeError(f"unknown discovery event {event!r}")

    def _insert(self, ep: Endpoint) -> None:
        entry = self._entries.get(ep.url)
        if entry is not None:
            entry.endpoint = ep
            entry.load.weight = ep.weight
            self._dirty = True
            return
        now = self._clock()
        state = HealthState.UNKNOWN if self._active_health else HealthState.HEALTHY
        entry = self._new_entry(ep, state, now)
        if state is HealthState.HEALTHY:
            entry.load.admitted(now)
        self._entries[ep.url] = entry
        self._dirty = True
        log.info("backend %s added (%s)", ep, state)
        self._observer.on_state_change(ep, state)

    def _remove(self, ep: Endpoint) -> None:
        entry = self._entries.pop(ep.url, None)
        if entry is None:
            return
        if entry.outlier.ejected:
            self._ejected -= 1
        self._policy.forget(entry.endpoint)
        self._dirty = True
        log.info("backend %s removed", entry.endpoint)
        self._observer.on_state_change(entry.endpoint, REMOVED)

    def _new_entry(self, ep: Endpoint, state: HealthState, now: float) -> _Entry:
        load = EndpointLoad(ep.weight, self._load_config, self._slow_start, now)
        return _Entry(ep, load, EndpointHealth(state))

    def endpoints(self) -> list[Endpoint]:
        return [e.endpoint for e in self._entries.values()]

    def load(self, ep: Endpoint) -> EndpointLoad:
        """Load signals of a known endpoint (the policies' view; raises KeyError for others)."""
        return self._entries[ep.url].load

    def enable_active_health(self) -> None:
        """Called by the health checker: from now on endpoints wait for a passing probe."""
        if self._active_health:
            return
        self._active_health = True
        for entry in self._entries.values():
            if not entry.health.probed and entry.health.state is HealthState.HEALTHY:
                entry.health.state = HealthState.UNKNOWN
                self._dirty = True
                self._observer.on_state_change(entry.endpoint, HealthState.UNKNOWN)

    def set_probe_result(self, ep: Endpoint, ok: bool) -> None:
        entry = self._entries.get(ep.url)
        if entry is None:
            return
        state = entry.health.record(ok, self._health_config)
        if state is None:
            return
        self._dirty = True
        if state is HealthState.HEALTHY:
            entry.load.admitted(self._clock())
            log.info("backend %s is healthy", entry.endpoint)
        else:
            log.warning("backend %s failed %d probes in a row", entry.endpoint, self._health_config.unhealthy_threshold)
        self._observer.on_state_change(entry.endpoint, state)

    @property
    def panic(self) -> bool:
        """Whether pick() currently routes over all endpoints because too few are routable."""
        self._refresh(self._clock())
        return self._panic

    def pick(self, ctx: RequestContext, exclude: Collection[Endpoint] = ()) -> Endpoint | None:
        """The endpoint for this request, or None when no endpoint (outside ``exclude``) may take it."""
        self._refresh(self._clock())
        candidates = self._all if self._panic else self._routable
        if exclude:
            candidates = [ep for ep in candidates if ep not in exclude]
        if not candidates:
            return None
        return self._policy.choose(candidates, ctx)

    def _refresh(self, now: float) -> None:
        if now >= self._next_readmit_at:
            self._readmit_due(now)
        if self._dirty:
            self._rebuild()

    def _readmit_due(self, now: float) -> None:
        next_at = math.inf
        for entry in self._entries.values():
            state = entry.outlier
            if state.ejected_until is None:
                continue
            if self._outlier.expired(state, now):
                self._outlier.readmit(state, now)
                self._ejected -= 1
                self._dirty = True
                entry.load.admitted(now)
                log.info("backend %s re-admitted after ejection", entry.endpoint)
                self._observer.on_readmit(entry.endpoint)
            else:
                next_at = min(next_at, state.ejected_until)
        self._next_readmit_at = next_at

    def _rebuild(self) -> None:
        self._all = [e.endpoint for e in self._entries.values()]
        self._routable = [
            e.endpoint
            for e in self._entries.values()
            if e.health.state is HealthState.HEALTHY and not e.outlier.ejected
        ]
        total = len(self._all)
        panic = total > 0 and len(self._routable) * 100 < self.config.panic_threshold_percent * total
        if panic != self._panic and self._warmed:
            # Before any backend has passed its health checks, panic is how every gateway starts: no news.
            level = logging.WARNING if panic else logging.INFO
            log.log(level, "panic %s: %d of %d backends routable", "on" if panic else "off", len(self._routable), total)
        self._panic = panic
        self._warmed = self._warmed or bool(self._routable)
        self._dirty = False

    @property
    def warmed(self) -> bool:
        """Whether some backend has passed its health checks since start (stays true: Envoy's ``/ready``)."""
        self._refresh(self._clock())
        return self._warmed

    @property
    def active_requests(self) -> int:
        return self._active

    @property
    def retry_budget(self) -> RetryBudget:
        return self._retry_budget

    def start(self, ep: Endpoint) -> Ticket:
        """Mark a request in flight on ``ep`` (normally the one :meth:`pick` just returned)."""
        now = self._clock()
        entry = self._entries.get(ep.url)
        if entry is None:
            # Removed between pick and start: track the request on a detached entry so finish()
            # stays harmless, and keep the fleet untouched.
            entry = self._new_entry(ep, HealthState.UNKNOWN, now)
        entry.load.pending += 1
        entry.load.sent_since_report += 1
        self._active += 1
        return Ticket(self, entry, now)

    def _finish(
        self,
        ticket: Ticket,
        status: int | None,
        connect_error: bool,
        latency_s: float | None,
        report: str | None,
    ) -> None:
        now = self._clock()
        entry = ticket._entry
        load = entry.load
        load.pending = max(0, load.pending - 1)
        self._active = max(0, self._active - 1)
        latency = max(0.0, now - ticket.started_at if latency_s is None else latency_s)
        failed = connect_error or (status is not None and status >= 500)
        if failed:
            load.ewma.observe_failure(latency, now)
        elif status is not None:
            load.ewma.observe(latency, now)
        elif latency > load.ewma.estimate(now):
            # An aborted request's time is a lower bound on its latency: it may raise, never lower.
            load.ewma.observe(latency, now)
        if report is not None:
            load.report(report, now)
        if (status is None and not connect_error) or self._entries.get(entry.endpoint.url) is not entry:
            return
        until = self._outlier.record(
            entry.outlier, failed, now, self._ejected, len(self._entries), connect_error=connect_error
        )
        if until is not None:
            self._ejected += 1
            self._dirty = True
            self._next_readmit_at = min(self._next_readmit_at, until)
            log.warning("backend %s ejected for %.1fs after repeated failures", entry.endpoint, until - now)
            self._observer.on_eject(entry.endpoint)

    def snapshot(self) -> list[dict[str, object]]:
        """Per-endpoint state for ``GET /gateway/backends`` (JSON-serialisable)."""
        now = self._clock()
        self._refresh(now)
        rows: list[dict[str, object]] = []
        for entry in self._entries.values():
            ep, health = entry.endpoint, str(entry.health.state)
            row: dict[str, object] = {"url": ep.url, "state": "ejected" if entry.outlier.ejected else health}
            row.update(health=health, weight=ep.weight, labels=dict(ep.labels))
            row.update(entry.load.describe(now))
            row.update(entry.outlier.describe(now))
            rows.append(row)
        return rows
