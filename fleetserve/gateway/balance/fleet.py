"""The fleet as the balancer sees it: the endpoints discovery announced, their health and ejection state,
and which of them may take traffic now.

Routable = health state ``healthy`` and not ejected by outlier detection. When fewer than
``panic_threshold_percent`` of the endpoints are routable the fleet is in *panic* (Envoy's panic
threshold) and every endpoint is a candidate: a mass failure of health checks is more often a probe or
network problem than every replica being dead, and some traffic beats none.

:meth:`Fleet.candidates` is on every request's path, so the routable list is rebuilt only when something
changes (insert, remove, health flip, ejection, re-admission) and re-admission is checked against the
earliest ejection deadline: the common case is O(1).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from fleetserve.gateway.balance.config import BalancerConfig
from fleetserve.gateway.balance.discovery import Event, Insert, Remove
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.health import EndpointHealth, HealthState
from fleetserve.gateway.balance.load import EndpointLoad
from fleetserve.gateway.balance.observer import REMOVED, BalancerObserver
from fleetserve.gateway.balance.outlier import OutlierDetector, OutlierState

log = logging.getLogger(__name__)


class Entry:
    """One endpoint and its state: load signals, health, outlier streaks."""

    __slots__ = ("endpoint", "health", "load", "outlier")

    def __init__(self, endpoint: Endpoint, load: EndpointLoad, health: EndpointHealth) -> None:
        self.endpoint = endpoint
        self.load = load
        self.health = health
        self.outlier = OutlierState()


class Fleet:
    def __init__(self, config: BalancerConfig, clock: Callable[[], float], observer: BalancerObserver) -> None:
        self._config = config
        self._clock = clock
        self._observer = observer
        self._health_config = config.health_config()
        self._load_config = config.load_config()
        self._slow_start = config.slow_start_config()
        self._outlier = OutlierDetector(config.outlier_config())
        self.entries: dict[str, Entry] = {}
        self._active_health = False
        self._ejected = 0
        self._next_readmit_at = math.inf
        self._dirty = False
        self._routable: list[Endpoint] = []
        self._all: list[Endpoint] = []
        self._panic = False
        self._warmed = False

    def apply(self, event: Event) -> Entry | None:
        """Apply a discovery event; returns the entry a ``Remove`` took out, if any."""
        if isinstance(event, Insert):
            self._insert(event.endpoint)
            return None
        if isinstance(event, Remove):
            return self._remove(event.endpoint)
        raise TypeError(f"unknown discovery event {event!r}")

    def _insert(self, ep: Endpoint) -> None:
        entry = self.entries.get(ep.url)
        if entry is not None:
            entry.endpoint = ep
            entry.load.weight = ep.weight
            self._dirty = True
            return
        now = self._clock()
        state = HealthState.UNKNOWN if self._active_health else HealthState.HEALTHY
        entry = self.new_entry(ep, state, now)
        if state is HealthState.HEALTHY:
            entry.load.admitted(now)
        self.entries[ep.url] = entry
        self._dirty = True
        log.info("backend %s added (%s)", ep, state)
        self._observer.on_state_change(ep, state)

    def _remove(self, ep: Endpoint) -> Entry | None:
        entry = self.entries.pop(ep.url, None)
        if entry is None:
            return None
        if entry.outlier.ejected:
            self._ejected -= 1
        self._dirty = True
        log.info("backend %s removed", entry.endpoint)
        self._observer.on_state_change(entry.endpoint, REMOVED)
        return entry

    def new_entry(self, ep: Endpoint, state: HealthState, now: float) -> Entry:
        load = EndpointLoad(ep.weight, self._load_config, self._slow_start, now)
        return Entry(ep, load, EndpointHealth(state))

    def enable_active_health(self) -> None:
        if self._active_health:
            return
        self._active_health = True
        for entry in self.entries.values():
            if not entry.health.probed and entry.health.state is HealthState.HEALTHY:
                entry.health.state = HealthState.UNKNOWN
                self._dirty = True
                self._observer.on_state_change(entry.endpoint, HealthState.UNKNOWN)

    def set_probe_result(self, ep: Endpoint, ok: bool) -> None:
        entry = self.entries.get(ep.url)
        if entry is None:
            return
        starting = entry.health.state is HealthState.UNKNOWN
        state = entry.health.record(ok, self._health_config)
        if state is None:
            return
        self._dirty = True
        if state is HealthState.HEALTHY:
            entry.load.admitted(self._clock())
            log.info("backend %s is healthy", entry.endpoint)
        elif starting:  # never healthy yet: a replica still starting, not one that went bad
            log.info("backend %s not ready yet (%d probes failed)", entry.endpoint,
                     self._health_config.unhealthy_threshold)
        else:
            log.warning("backend %s failed %d probes in a row", entry.endpoint, self._health_config.unhealthy_threshold)
        self._observer.on_state_change(entry.endpoint, state)

    def record(self, entry: Entry, failed: bool, connect_error: bool, now: float) -> None:
        """Count a request outcome towards outlier ejection (only for entries still in the fleet)."""
        state = entry.outlier
        if not failed and not state.consecutive_failures and not state.consecutive_connect_failures:
            return  # a success with no failure streak to reset changes nothing: the usual case, made cheap
        if self.entries.get(entry.endpoint.url) is not entry:
            return
        until = self._outlier.record(state, failed, now, self._ejected, len(self.entries), connect_error=connect_error)
        if until is None:
            return
        self._ejected += 1
        self._dirty = True
        self._next_readmit_at = min(self._next_readmit_at, until)
        log.warning("backend %s ejected for %.1fs after repeated failures", entry.endpoint, until - now)
        self._observer.on_eject(entry.endpoint)

    def candidates(self, now: float) -> list[Endpoint]:
        """The endpoints that may take traffic now: the routable ones, or all of them in panic."""
        if now >= self._next_readmit_at:
            self._readmit_due(now)
        if self._dirty:
            self._rebuild()
        return self._all if self._panic else self._routable

    def panic(self, now: float) -> bool:
        self.candidates(now)
        return self._panic

    def warmed(self, now: float) -> bool:
        self.candidates(now)
        return self._warmed

    def _readmit_due(self, now: float) -> None:
        next_at = math.inf
        for entry in self.entries.values():
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
        self._all = [e.endpoint for e in self.entries.values()]
        self._routable = [
            e.endpoint
            for e in self.entries.values()
            if e.health.state is HealthState.HEALTHY and not e.outlier.ejected
        ]
        total = len(self._all)
        panic = total > 0 and len(self._routable) * 100 < self._config.panic_threshold_percent * total
        if panic != self._panic and self._warmed:
            # Before any backend has passed its health checks, panic is how every gateway starts: no news.
            level = logging.WARNING if panic else logging.INFO
            log.log(level, "panic %s: %d of %d backends routable", "on" if panic else "off", len(self._routable), total)
        self._panic = panic
        self._warmed = self._warmed or bool(self._routable)
        self._dirty = False

    def snapshot(self, now: float) -> list[dict[str, object]]:
        self.candidates(now)
        rows: list[dict[str, object]] = []
        for entry in self.entries.values():
            ep, health = entry.endpoint, str(entry.health.state)
            row: dict[str, object] = {"url": ep.url, "state": "ejected" if entry.outlier.ejected else health}
            row.update(health=health, weight=ep.weight, labels=dict(ep.labels))
            row.update(entry.load.describe(now))
            row.update(entry.outlier.describe(now))
            rows.append(row)
        return rows
