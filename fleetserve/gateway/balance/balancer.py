"""The balancer: which replicas may take a request, and which one takes this one.

It ties the pieces together the way tower's ``balance::p2c`` ties ``discover`` and ``load``: discovery
events change the fleet (:meth:`Balancer.apply`), probe results and request outcomes change each
endpoint's state (:meth:`Balancer.set_probe_result`, :meth:`Ticket.finish`), and :meth:`Balancer.pick`
hands the endpoints that may take traffic (:mod:`.fleet`: healthy, not ejected, or all in panic) to the
configured policy.

With a per-replica cap (``replica_max_inflight``, Envoy's per-cluster ``max_requests`` circuit breaker), an
endpoint with that many attempts in flight (``pending``, counted from :meth:`Balancer.start` to
:meth:`Ticket.finish`) is no candidate: the forwarding core calls ``pick`` and ``start`` with no await
between them, so the count is the slot. When every candidate is at its cap ``pick`` returns None and
:meth:`Balancer.capped` says the fleet is saturated rather than down. Candidates are filtered by the cap
only while some endpoint is at it, so the common case costs nothing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection

from fleetserve.gateway.balance.config import BalancerConfig
from fleetserve.gateway.balance.discovery import Event
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.fleet import Entry, Fleet
from fleetserve.gateway.balance.health import HealthState
from fleetserve.gateway.balance.load import EndpointLoad
from fleetserve.gateway.balance.observer import BalancerObserver, NullObserver
from fleetserve.gateway.balance.policies import RequestContext, create_policy
from fleetserve.gateway.balance.retry import RetryBudget


class Ticket:
    """One attempt in flight on one endpoint; call :meth:`finish` exactly once when it ends."""

    __slots__ = ("_balancer", "_done", "_entry", "started_at")

    def __init__(self, balancer: Balancer, entry: Entry, started_at: float) -> None:
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
        self._fleet = Fleet(config, clock, observer or NullObserver())
        self._entries = self._fleet.entries
        self._policy = create_policy(config.policy, self, clock=clock, rng=rng or random.Random())
        self._retry_budget = RetryBudget(config.retry_budget_config(), lambda: self._active)
        self._active = 0
        self._cap = config.replica_max_inflight or 0
        self._full = 0  # endpoints in the fleet at their cap

    def apply(self, event: Event) -> None:
        removed = self._fleet.apply(event)
        if removed is not None:
            if self._cap and removed.load.pending >= self._cap:
                self._full -= 1
            self._policy.forget(removed.endpoint)

    def endpoints(self) -> list[Endpoint]:
        return [e.endpoint for e in self._entries.values()]

    def load(self, ep: Endpoint) -> EndpointLoad:
        """Load signals of a known endpoint (the policies' view; raises KeyError for others)."""
        return self._entries[ep.url].load

    def enable_active_health(self) -> None:
        """Called by the health checker: from now on endpoints wait for a passing probe."""
        self._fleet.enable_active_health()

    def set_probe_result(self, ep: Endpoint, ok: bool) -> None:
        self._fleet.set_probe_result(ep, ok)

    @property
    def panic(self) -> bool:
        """Whether pick() currently routes over all endpoints because too few are routable."""
        return self._fleet.panic(self._clock())

    @property
    def warmed(self) -> bool:
        """Whether some backend has passed its health checks since start (stays true: Envoy's ``/ready``)."""
        return self._fleet.warmed(self._clock())

    def pick(self, ctx: RequestContext, exclude: Collection[Endpoint] = ()) -> Endpoint | None:
        """The endpoint for this request, or None when no endpoint (outside ``exclude``) may take it."""
        candidates = self._fleet.candidates(self._clock())
        if self._full:
            cap, entries = self._cap, self._entries
            candidates = [ep for ep in candidates if ep not in exclude and entries[ep.url].load.pending < cap]
        elif exclude:
            candidates = [ep for ep in candidates if ep not in exclude]
        if not candidates:
            return None
        return self._policy.choose(candidates, ctx)

    def has_other(self, exclude: Collection[Endpoint]) -> bool:
        """Whether some endpoint outside ``exclude`` may take traffic now (caps aside): a retry has somewhere to go."""
        return any(ep not in exclude for ep in self._fleet.candidates(self._clock()))

    def capped(self, exclude: Collection[Endpoint] = ()) -> bool:
        """Whether some endpoint that :meth:`pick` would otherwise consider is at its in-flight cap: after
        ``pick`` returned None, the fleet is saturated rather than down."""
        if not self._full:
            return False
        cap, entries = self._cap, self._entries
        candidates = self._fleet.candidates(self._clock())
        return any(ep not in exclude and entries[ep.url].load.pending >= cap for ep in candidates)

    @property
    def active_requests(self) -> int:
        return self._active

    @property
    def retry_budget(self) -> RetryBudget:
        return self._retry_budget

    def start(self, ep: Endpoint) -> Ticket:
        """Mark an attempt in flight on ``ep`` (normally the one :meth:`pick` just returned)."""
        now = self._clock()
        entry = self._entries.get(ep.url)
        if entry is None:
            # Removed between pick and start: track the request on a detached entry so finish()
            # stays harmless, and keep the fleet untouched.
            entry = self._fleet.new_entry(ep, HealthState.UNKNOWN, now)
        elif entry.load.pending + 1 == self._cap:
            self._full += 1
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
        if self._cap and load.pending == self._cap and self._entries.get(entry.endpoint.url) is entry:
            self._full -= 1
        if load.pending > 0:
            load.pending -= 1
        if self._active > 0:
            self._active -= 1
        latency = now - ticket.started_at if latency_s is None else latency_s
        if latency < 0.0:
            latency = 0.0
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
        if status is not None or connect_error:
            self._fleet.record(entry, failed, connect_error, now)

    def snapshot(self) -> list[dict[str, object]]:
        """Per-endpoint state for ``GET /gateway/backends`` (JSON-serialisable)."""
        return self._fleet.snapshot(self._clock())
