"""The autoscaler: asks a rule once per tick, clamps its answer, scales from and back to zero, and keeps the record.

:meth:`Autoscaler.tick` turns one :class:`FleetSignals` snapshot into a :class:`Decision`. Around the rule it
applies what holds whatever the rule: the ``[min_replicas, max_replicas]`` range; at least one replica while
requests are held or arriving (scale from zero, as Knative's activator wakes a revision); and, with
``min_replicas`` 0, zero replicas only after ``idle_to_zero_s`` without a request. Every tick is counted by
direction and reason (the ``fleetserve_autoscale_decisions_total`` metric); every change of the desired count is
logged in one line and kept (the last ``history``) for :meth:`Autoscaler.state`, the admin view.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.autoscale.rules import RULES, Recommendation, Rule, ScaleBounds
from fleetserve.autoscale.signals import FleetSignals

_log = logging.getLogger(__name__)

UP, DOWN, HOLD = "up", "down", "hold"


@dataclass(frozen=True, slots=True)
class Decision:
    """The desired replica count at ``at_s``: ``previous`` was the desired count before this tick."""

    at_s: float
    previous: int
    desired: int
    reason: str
    detail: str
    signals: FleetSignals

    @property
    def direction(self) -> str:
        return UP if self.desired > self.previous else DOWN if self.desired < self.previous else HOLD

    def as_dict(self) -> dict[str, Any]:
        return {"at_s": self.at_s, "from": self.previous, "to": self.desired, "reason": self.reason,
                "detail": self.detail, "signals": signals_dict(self.signals)}


def signals_dict(signals: FleetSignals) -> dict[str, Any]:
    """A snapshot as JSON-able values (replicas as a list of objects)."""
    out = {f.name: getattr(signals, f.name) for f in dataclasses.fields(signals) if f.name != "replicas"}
    out["replicas"] = [dataclasses.asdict(r) for r in signals.replicas]
    return out


def build_rule(config: AutoscaleConfig) -> Rule:
    """The rule ``config.rule`` names, built from ``config`` (every rule class takes the whole config)."""
    if not config.enabled:
        raise ValueError("autoscale is off: there is no rule to build")
    factory = cast(Callable[[AutoscaleConfig], Rule], RULES.load(config.rule))
    return factory(config)


class Autoscaler:
    """Runs ``rule`` within ``bounds``; ``name`` is the rule's name in the state and the log."""

    def __init__(self, rule: Rule, bounds: ScaleBounds, idle_to_zero_s: float = 60.0,
                 log: logging.Logger | None = None, *, name: str | None = None, history: int = 100) -> None:
        self.rule = rule
        self.bounds = bounds
        self.idle_to_zero_s = idle_to_zero_s
        self.name = name or type(rule).__name__
        self._log = log or _log
        self._decisions: deque[Decision] = deque(maxlen=history)
        self._counts: Counter[tuple[str, str]] = Counter()
        self._desired: int | None = None
        self._last: FleetSignals | None = None
        self._last_demand_s: float | None = None  # when a request last arrived or was held

    @classmethod
    def from_config(cls, config: AutoscaleConfig, log: logging.Logger | None = None) -> Autoscaler:
        return cls(build_rule(config), config.bounds, config.idle_to_zero_s, log, name=config.rule,
                   history=config.history)

    @property
    def desired(self) -> int | None:
        """The count the last tick asked for; None before the first tick."""
        return self._desired

    def tick(self, signals: FleetSignals) -> Decision:
        """Ask the rule about ``signals`` and decide the desired replica count."""
        previous = self._desired if self._desired is not None else signals.current
        rec = self.rule.recommend(signals)
        if signals.held > 0 or signals.request_rate > 0 or (self._desired is None and signals.current > 0):
            # A fleet found running counts as just used: it gets idle_to_zero_s before going to zero.
            self._last_demand_s = signals.at_s
        desired, reason, detail = self._bound(rec, signals)
        decision = Decision(signals.at_s, previous, desired, reason, detail, signals)
        self._counts[decision.direction, reason] += 1
        self._last = signals
        self._desired = desired
        if desired != previous:
            self._decisions.append(decision)
            self._log.info("autoscale %s: %d -> %d replicas (%s%s); ready %d, starting %d, draining %d, "
                           "held %d, rate %.1f/s, queue %.1f, p99 %s", self.name, previous, desired, reason,
                           f": {detail}" if detail else "", signals.ready, signals.starting, signals.draining,
                           signals.held, signals.request_rate, signals.queue_depth,
                           "-" if signals.p99_s is None else f"{signals.p99_s * 1000:.0f} ms")
        return decision

    def _bound(self, rec: Recommendation, signals: FleetSignals) -> tuple[int, str, str]:
        lo, hi = self.bounds.min_replicas, self.bounds.max_replicas
        floor_reason = "min_replicas"
        if lo == 0:
            if signals.held > 0 or (signals.request_rate > 0 and signals.ready == 0):
                lo, floor_reason = 1, "scale_from_zero"
            elif self._last_demand_s is not None and signals.at_s - self._last_demand_s < self.idle_to_zero_s:
                lo, floor_reason = 1, "not_idle"
            else:
                return 0, "idle", f"no request for {self.idle_to_zero_s:g} s"
        if rec.replicas < lo:
            return lo, floor_reason, (f"held {signals.held}, rate {signals.request_rate:.2f}/s; "
                                      f"{rec.reason} wanted {rec.replicas}")
        if rec.replicas > hi:
            return hi, "max_replicas", f"{rec.reason} wanted {rec.replicas}"
        return rec.replicas, rec.reason, rec.detail

    def counts(self) -> dict[tuple[str, str], int]:
        """Ticks so far by (direction, reason): direction is ``up``, ``down`` or ``hold``."""
        return dict(self._counts)

    def decisions(self) -> list[Decision]:
        """The last changes of the desired count, oldest first."""
        return list(self._decisions)

    def state(self) -> dict[str, Any]:
        """The admin view (``GET /gateway/autoscale``): JSON-able."""
        last = self._last
        return {
            "rule": self.name,
            "min_replicas": self.bounds.min_replicas,
            "max_replicas": self.bounds.max_replicas,
            "idle_to_zero_s": self.idle_to_zero_s,
            "desired": self._desired,
            "ready": last.ready if last else None,
            "starting": last.starting if last else None,
            "draining": last.draining if last else None,
            "held": last.held if last else None,
            "signals": signals_dict(last) if last else None,
            "decisions": [d.as_dict() for d in self._decisions],
            "counts": [{"direction": d, "reason": r, "count": n} for (d, r), n in sorted(self._counts.items())],
        }
