"""Active health checking: probe every endpoint on an interval, flip its state after N in a row.

The state machine per endpoint (thresholds as in Envoy's and Kubernetes' probes):

* ``unknown``   → ``healthy`` on the first successful probe; → ``unhealthy`` after
  ``unhealthy_threshold`` failures in a row.
* ``healthy``   → ``unhealthy`` after ``unhealthy_threshold`` consecutive failures (default 3).
* ``unhealthy`` → ``healthy`` after ``healthy_threshold`` consecutive successes (default 2).

Only ``healthy`` endpoints take traffic (outside panic mode). Choice for new endpoints: once a
health checker runs, a newly discovered endpoint starts ``unknown`` and is admitted only after its
first successful probe, like Envoy, so a replica that is still loading its engine is never sent
traffic. Without a health checker there is nothing to wait for, and endpoints start ``healthy``
(passive outlier ejection still guards them).

The probe itself is injected (``probe(endpoint) -> bool``): the data plane decides what "healthy"
means (``GET /v2/health/ready`` on a replica); this module only schedules, times out and counts.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fleetserve.gateway.balance.endpoint import Endpoint

if TYPE_CHECKING:
    from fleetserve.gateway.balance.config import BalancerConfig

log = logging.getLogger(__name__)

Probe = Callable[[Endpoint], Awaitable[bool]]
Sleep = Callable[[float], Awaitable[None]]


class HealthState(enum.StrEnum):
    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class HealthConfig:
    interval_s: float = 2.0
    timeout_s: float = 3.0
    unhealthy_threshold: int = 3
    healthy_threshold: int = 2

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"health_interval_s must be > 0, got {self.interval_s}")
        if self.timeout_s <= 0:
            raise ValueError(f"health_timeout_s must be > 0, got {self.timeout_s}")
        if self.unhealthy_threshold < 1:
            raise ValueError(f"unhealthy_threshold must be >= 1, got {self.unhealthy_threshold}")
        if self.healthy_threshold < 1:
            raise ValueError(f"healthy_threshold must be >= 1, got {self.healthy_threshold}")


class EndpointHealth:
    """Consecutive probe results of one endpoint and the state they imply."""

    __slots__ = ("_failures", "_successes", "probed", "state")

    def __init__(self, state: HealthState) -> None:
        self.state = state
        self.probed = False
        self._successes = 0
        self._failures = 0

    def record(self, ok: bool, config: HealthConfig) -> HealthState | None:
        """Count one probe result; return the new state if it changed, else None."""
        self.probed = True
        if ok:
            self._successes += 1
            self._failures = 0
            if self.state is HealthState.UNKNOWN or (
                self.state is HealthState.UNHEALTHY and self._successes >= config.healthy_threshold
            ):
                return self._become(HealthState.HEALTHY)
        else:
            self._failures += 1
            self._successes = 0
            if self.state is not HealthState.UNHEALTHY and self._failures >= config.unhealthy_threshold:
                return self._become(HealthState.UNHEALTHY)
        return None

    def _become(self, state: HealthState) -> HealthState:
        self.state = state
        self._successes = 0
        self._failures = 0
        return state


class ProbeTarget(Protocol):
    """What the checker needs from the balancer."""

    def endpoints(self) -> list[Endpoint]: ...

    def set_probe_result(self, ep: Endpoint, ok: bool) -> None: ...

    def enable_active_health(self) -> None: ...


class HealthChecker:
    """Probes all endpoints of ``target`` concurrently once per interval.

    Only ``interval_s`` and ``timeout_s`` of ``config`` apply here; the target (the balancer)
    counts the results against its own thresholds.
    """

    def __init__(
        self,
        target: ProbeTarget,
        probe: Probe,
        config: HealthConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._target = target
        self._probe = probe
        self._config = config
        self._clock = clock
        self._sleep = sleep

    async def check_once(self) -> None:
        endpoints = self._target.endpoints()
        results: Sequence[bool] = await asyncio.gather(*(self._probe_one(ep) for ep in endpoints))
        for ep, ok in zip(endpoints, results, strict=True):
            self._target.set_probe_result(ep, ok)

    async def _probe_one(self, ep: Endpoint) -> bool:
        try:
            async with asyncio.timeout(self._config.timeout_s):
                return bool(await self._probe(ep))
        except TimeoutError:
            log.debug("health probe of %s timed out after %.1fs", ep.url, self._config.timeout_s)
        except Exception as exc:
            # Any probe error (refused, reset, bad answer) is a failed probe, never a dead checker.
            log.debug("health probe of %s failed: %r", ep.url, exc)
        return False

    async def run(self) -> None:
        self._target.enable_active_health()
        while True:
            started = self._clock()
            await self.check_once()
            # Rounds start every interval; a round slower than that starts the next one at once.
            await self._sleep(max(0.0, started + self._config.interval_s - self._clock()))


async def run_health_checks(
    balancer: ProbeTarget,
    probe: Probe,
    config: BalancerConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Sleep = asyncio.sleep,
) -> None:
    """Probe ``balancer``'s endpoints forever (until cancelled), feeding it the results."""
    await HealthChecker(balancer, probe, config.health_config(), clock=clock, sleep=sleep).run()
