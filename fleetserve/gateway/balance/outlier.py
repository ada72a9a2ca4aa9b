"""Passive outlier detection: eject an endpoint whose requests keep failing, for a growing time.

Modelled on Envoy's outlier detection (arch_overview/upstream/outlier): after ``consecutive_errors``
failures in a row (connect errors and 5xx answers; a 4xx is the client's fault and counts as a
success) the endpoint is ejected for ``base_ejection_s × n``, where ``n`` is how many times it has
been ejected recently, capped at ``max_ejection_s``. Like Envoy's multiplier, ``n`` shrinks by one
for every ``multiplier_decay_s`` the endpoint stays in service, so an old incident stops lengthening
new ejections. An ejection never takes more than ``max_ejection_percent`` of the fleet out
(Envoy ejects at least one host regardless; we do not, so a one-replica fleet is never ejected).

Connect failures also keep a streak of their own with a lower threshold (``consecutive_connect_errors``,
Envoy's split local-origin mode): a refused connection means nothing listens there any more — a crashed
or restarting replica — and waiting for five of them only spends retries.

Re-admission is lazy: the balancer asks :meth:`OutlierDetector.expired` when it picks, so no timer
runs per endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OutlierConfig:
    consecutive_errors: int = 5
    consecutive_connect_errors: int = 2
    base_ejection_s: float = 5.0
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0
    multiplier_decay_s: float = 30.0

    def __post_init__(self) -> None:
        if self.consecutive_errors < 1:
            raise ValueError(f"consecutive_errors must be >= 1, got {self.consecutive_errors}")
        if self.consecutive_connect_errors < 1:
            raise ValueError(f"consecutive_connect_errors must be >= 1, got {self.consecutive_connect_errors}")
        if self.base_ejection_s <= 0:
            raise ValueError(f"base_ejection_s must be > 0, got {self.base_ejection_s}")
        if self.max_ejection_s < self.base_ejection_s:
            raise ValueError(
                f"max_ejection_s ({self.max_ejection_s}) must be >= base_ejection_s ({self.base_ejection_s})"
            )
        if not 0 <= self.max_ejection_percent <= 100:
            raise ValueError(f"max_ejection_percent must be in 0..100, got {self.max_ejection_percent}")
        if self.multiplier_decay_s <= 0:
            raise ValueError(f"ejection multiplier_decay_s must be > 0, got {self.multiplier_decay_s}")


class OutlierState:
    """Failure streak and ejection history of one endpoint."""

    __slots__ = (
        "consecutive_connect_failures", "consecutive_failures", "ejected_until", "ejections_total", "multiplier",
        "readmitted_at",
    )

    def __init__(self) -> None:
        self.consecutive_failures = 0
        self.consecutive_connect_failures = 0
        self.multiplier = 0
        self.ejections_total = 0
        self.ejected_until: float | None = None
        self.readmitted_at: float | None = None

    @property
    def ejected(self) -> bool:
        return self.ejected_until is not None

    def describe(self, now: float) -> dict[str, object]:
        """The outlier fields of an endpoint's row in ``GET /gateway/backends``."""
        until = self.ejected_until
        return {
            "consecutive_failures": self.consecutive_failures,
            "ejections": self.ejections_total,
            "ejected_until": until,
            "ejected_remaining_s": None if until is None else round(max(0.0, until - now), 3),
        }


class OutlierDetector:
    """Stateless rules over :class:`OutlierState`; the balancer supplies fleet-wide counts."""

    def __init__(self, config: OutlierConfig) -> None:
        self.config = config

    def may_eject(self, ejected: int, total: int) -> bool:
        """Whether one more ejection keeps the ejected share within ``max_ejection_percent``."""
        return (ejected + 1) * 100 <= self.config.max_ejection_percent * total

    def record(
        self, state: OutlierState, failed: bool, now: float, ejected: int, total: int, connect_error: bool = False
    ) -> float | None:
        """Count one request outcome; when it ejects the endpoint, return the time it ends."""
        if not failed:
            state.consecutive_failures = 0
            state.consecutive_connect_failures = 0
            return None
        state.consecutive_failures += 1
        state.consecutive_connect_failures = state.consecutive_connect_failures + 1 if connect_error else 0
        tripped = (
            state.consecutive_failures >= self.config.consecutive_errors
            or state.consecutive_connect_failures >= self.config.consecutive_connect_errors
        )
        if state.ejected or not tripped:
            return None
        if not self.may_eject(ejected, total):
            return None
        cfg = self.config
        if state.readmitted_at is not None:
            quiet_periods = int(max(0.0, now - state.readmitted_at) // cfg.multiplier_decay_s)
            state.multiplier = max(0, state.multiplier - quiet_periods)
        state.multiplier += 1
        state.ejections_total += 1
        until = now + min(cfg.base_ejection_s * state.multiplier, cfg.max_ejection_s)
        state.ejected_until = until
        return until

    @staticmethod
    def expired(state: OutlierState, now: float) -> bool:
        return state.ejected_until is not None and now >= state.ejected_until

    @staticmethod
    def readmit(state: OutlierState, now: float) -> None:
        state.ejected_until = None
        state.readmitted_at = now
        state.consecutive_failures = 0
        state.consecutive_connect_failures = 0
