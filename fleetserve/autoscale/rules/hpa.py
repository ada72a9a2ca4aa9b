"""The ``hpa`` rule: Kubernetes' HorizontalPodAutoscaler v2 algorithm, as its documentation describes it.

Source: "Horizontal Pod Autoscaling", https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/
(sections "Algorithm details" and "Configurable scaling behavior"). Per metric, with per-replica average ``m`` and
target ``t``::

    desired = ceil(ready * m / t)        unless |m / t - 1| <= tolerance (then: no change)

Replicas that are ready but report no value for a metric are set aside and then counted at 100% of the target
when scaling down and at 0% when scaling up; replicas not yet ready (starting) are counted at 0% when the ready
ones alone would scale up. If that recomputed ratio is within the tolerance or points the other way, nothing
changes. Several metrics: the largest desired count wins. The result is then stabilised (scale up only to the
lowest, scale down only to the highest recommendation of their windows) and limited by the scaling policies
(replicas or percent of the count at the start of each policy's period; ``select`` ``max`` allows the largest
change). Metrics here: rows queued per replica and rows running per replica (from the replicas' load reports) and
GPU utilisation, the signals the article scales on.

The recommendations start with the count found at the first tick, as the HPA controller's do. The replica count
the rule scales from is ``FleetSignals.current`` (ready + starting: what the actuator was told,
HPA's ``spec.replicas``); changes of it between ticks are the scale events the policies' periods look back on.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from fleetserve.autoscale.config import AutoscaleConfig, HpaConfig, ScalingPolicy
from fleetserve.autoscale.rules.base import Recommendation
from fleetserve.autoscale.signals import FleetSignals


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One metric as HPA sees it: the sum of its values over the ``reporting`` ready replicas, how many ready
    replicas report none (``missing``), and the per-replica target."""

    name: str
    total: float
    reporting: int
    missing: int
    target: float

    @property
    def mean(self) -> float:
        return self.total / self.reporting


def replicas_for(sample: MetricSample, starting: int, current: int, tolerance: float) -> int:
    """The replica count one metric asks for (HPA's per-metric calculation, incl. missing and not-yet-ready)."""
    n = sample.reporting
    ratio = sample.total / (n * sample.target)
    scale_up = ratio > 1.0
    unready = starting if scale_up else 0
    if sample.missing == 0 and unready == 0:
        return current if abs(ratio - 1.0) <= tolerance else math.ceil(ratio * n)
    # Set-aside replicas: missing ones at 100% of the target when scaling down, 0% when scaling up; not-yet-ready
    # ones at 0% (only when scaling up).
    filled = sample.total + (0.0 if scale_up else sample.missing * sample.target)
    total = n + sample.missing + unready
    new_ratio = filled / (total * sample.target)
    if abs(new_ratio - 1.0) <= tolerance or (new_ratio > 1.0) != scale_up:
        return current
    return math.ceil(new_ratio * total)


def policy_limit(policies: Sequence[ScalingPolicy], select: str, current: int, events: Sequence[tuple[float, int]],
                 now: float, up: bool) -> int:
    """The furthest count the policies allow from ``current`` in one direction: each policy's limit is taken from
    the count at the start of its period (``current`` less the changes in that direction since), and ``select``
    ``max`` takes the limit allowing the most change, ``min`` the least, ``disabled`` none."""
    if select == "disabled" or not policies:
        return current
    limits = []
    for policy in policies:
        changed = sum(d for t, d in events if now - t < policy.period_s and (d > 0) == up)
        start = current - changed
        # A percent step rounds up ("10% of 72 is 7.2, rounded up to 8" in the documentation's example).
        step = math.floor(policy.value) if policy.kind == "pods" else math.ceil(start * policy.value / 100.0 - 1e-9)
        limits.append(start + step if up else start - step)
    most = max(limits) if (select == "max") == up else min(limits)
    return max(current, most) if up else min(current, most)


class HpaRule:
    """HPA v2 over the fleet's snapshots; see the module docstring. Time comes only from ``FleetSignals.at_s``."""

    def __init__(self, config: AutoscaleConfig | HpaConfig) -> None:
        self.config = config.hpa if isinstance(config, AutoscaleConfig) else config
        self._history: deque[tuple[float, int]] = deque()  # (at_s, raw recommendation) within the longest window
        self._events: deque[tuple[float, int]] = deque()  # (at_s, change of the current count)
        self._current: int | None = None
        c = self.config
        self._window_s = max(c.scale_up_stabilization_s, c.scale_down_stabilization_s)
        self._period_s = max((p.period_s for p in (*c.scale_up_policies, *c.scale_down_policies)), default=0.0)

    def metrics(self, signals: FleetSignals) -> list[MetricSample]:
        """The configured metrics, from the ready replicas' reports (or the fleet's sums when a snapshot lists no
        replicas); a metric no ready replica reports is left out."""
        c = self.config
        out: list[MetricSample] = []
        if signals.ready <= 0:
            return out
        ready = [r for r in signals.replicas if r.ready]
        if c.target_queue_depth:
            total = sum(r.queue_depth for r in ready) if ready else signals.queue_depth
            out.append(MetricSample("queue_depth", total, signals.ready, 0, c.target_queue_depth))
        if c.target_inflight:
            total = sum(r.inflight for r in ready) if ready else signals.inflight
            out.append(MetricSample("inflight", total, signals.ready, 0, c.target_inflight))
        if c.target_gpu_utilization:
            target = c.target_gpu_utilization / 100.0
            if ready:
                gpu = [r.gpu_utilization for r in ready if r.gpu_utilization is not None]
                if gpu:
                    out.append(MetricSample("gpu_utilization", sum(gpu), len(gpu), len(ready) - len(gpu), target))
            elif signals.gpu_utilization is not None:
                out.append(MetricSample("gpu_utilization", signals.gpu_utilization * signals.ready, signals.ready, 0,
                                        target))
        return out

    def recommend(self, signals: FleetSignals) -> Recommendation:
        c = self.config
        now = signals.at_s
        current = signals.current
        if self._current is None:
            # Like the HPA controller meeting a scale target for the first time, start the recommendations with
            # the count found: a fresh rule shrinks no fleet before its scale-down window has passed.
            self._history.append((now, current))
        elif current != self._current:
            self._events.append((now, current - self._current))
        self._current = current
        while self._events and now - self._events[0][0] >= self._period_s:
            self._events.popleft()

        samples = self.metrics(signals)
        if not samples:
            return Recommendation(current, "no_metrics", f"ready {signals.ready}: no metric to scale on")
        wanted = [(replicas_for(s, signals.starting, current, c.tolerance), s) for s in samples]
        raw, top = max(wanted, key=lambda w: w[0])
        detail = "; ".join(f"{s.name} {s.mean:.3g}/replica vs {s.target:.3g} -> {n}" for n, s in wanted)
        reason = top.name if raw != current else "tolerance"

        while self._history and now - self._history[0][0] >= self._window_s:
            self._history.popleft()
        up_floor = min((r for t, r in self._history if now - t < c.scale_up_stabilization_s), default=raw)
        down_ceiling = max((r for t, r in self._history if now - t < c.scale_down_stabilization_s), default=raw)
        up_floor, down_ceiling = min(up_floor, raw), max(down_ceiling, raw)
        self._history.append((now, raw))
        stabilized = min(max(current, up_floor), down_ceiling)
        if stabilized != raw:
            reason = "stabilized"
            detail += f"; stabilised to {stabilized}"

        if stabilized > current:
            limit = policy_limit(c.scale_up_policies, c.scale_up_select, current, self._events, now, up=True)
            final = min(stabilized, limit)
        elif stabilized < current:
            limit = policy_limit(c.scale_down_policies, c.scale_down_select, current, self._events, now, up=False)
            final = max(stabilized, limit)
        else:
            final = stabilized
        if final != stabilized:
            reason = "policy"
            detail += f"; policies allow {final}"
        return Recommendation(final, reason, detail)
