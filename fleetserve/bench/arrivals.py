"""Send-time schedules for open-loop load: evenly spaced, or a Poisson process.

An open-loop generator sends on a schedule fixed in advance, whatever the server does, and measures
each latency from the *scheduled* send time. A closed-loop client that waits for each answer before
sending the next one stops sending while the server stalls, so the stall hides in a few samples:
Gil Tene calls this "coordinated omission" ("How NOT to Measure Latency", 2015; wrk2's README).
A Poisson process (exponential gaps, rate ``λ``) models many independent users; constant spacing
gives the least noisy throughput for comparisons.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

ArrivalSchedule = Callable[[float, random.Random], Iterator[float]]


def constant(rate: float, rng: random.Random) -> Iterator[float]:
    """Offsets ``k / rate``: computed from ``k`` rather than summed, so rounding never drifts."""
    del rng
    return (k / rate for k in itertools.count())


def poisson(rate: float, rng: random.Random) -> Iterator[float]:
    """Offsets of a Poisson process: cumulative sums of exponential gaps with mean ``1 / rate``."""
    t = 0.0
    while True:
        yield t
        t += rng.expovariate(rate)


ARRIVALS: dict[str, ArrivalSchedule] = {"constant": constant, "poisson": poisson}


def arrival_offsets(kind: str, rate: float, rng: random.Random) -> Iterator[float]:
    """Seconds from the start of the run at which the 1st, 2nd, ... request is due."""
    if kind not in ARRIVALS:
        raise ValueError(f"unknown arrival process {kind!r}; choose one of {sorted(ARRIVALS)}")
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    return ARRIVALS[kind](rate, rng)


@dataclass(frozen=True)
class RateProfile:
    """A request rate that changes over the run: ``points`` are ``(seconds, multiplier)`` pairs, linear in
    between and flat after the last; the rate at ``t`` is the run's rate times the multiplier.

    Send times come from time rescaling: a unit-rate schedule (evenly spaced or Poisson) is mapped through the
    inverse of the cumulative rate ``Λ(t) = ∫ rate``, which turns a homogeneous process into the
    inhomogeneous one of that rate (Brown, Barbieri et al., "The time-rescaling theorem and its application
    to neural spike train data analysis", Neural Computation 14, 2002). Rates are piecewise linear, so ``Λ``
    is piecewise quadratic and inverted exactly.
    """

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points or self.points[0][0] != 0:
            raise ValueError("a rate profile starts at 0 s")
        times = [t for t, _ in self.points]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError(f"rate profile times must increase, got {times}")
        if any(not m >= 0 for _, m in self.points) or not any(m > 0 for _, m in self.points):
            raise ValueError("rate profile multipliers must be >= 0 and not all 0")

    @property
    def duration_s(self) -> float:
        return self.points[-1][0]

    def multiplier(self, t: float) -> float:
        for (t0, m0), (t1, m1) in itertools.pairwise(self.points):
            if t0 <= t < t1:
                return m0 + (m1 - m0) * (t - t0) / (t1 - t0)
        return self.points[-1][1] if t >= 0 else self.points[0][1]

    def scaled(self, factor: float) -> RateProfile:
        """The same shape over ``factor`` times the seconds."""
        return RateProfile(tuple((t * factor, m) for t, m in self.points))

    def offsets(self, kind: str, rate: float, rng: random.Random) -> Iterator[float]:
        """Send offsets (seconds from the start) at ``rate`` times the multiplier, ``kind`` a unit-rate
        arrival process of :data:`ARRIVALS`; endless (flat after the last point)."""
        segments = [*itertools.pairwise(self.points), ((self.duration_s, self.points[-1][1]),
                                                          (math.inf, self.points[-1][1]))]
        units = arrival_offsets(kind, 1.0, rng)
        done = 0.0  # Λ at the start of the current segment
        unit = next(units)
        for (t0, m0), (t1, m1) in segments:
            a = rate * m0
            slope = 0.0 if math.isinf(t1) else rate * (m1 - m0) / (t1 - t0)
            total = math.inf if math.isinf(t1) else (a + rate * m1) / 2 * (t1 - t0)
            if math.isinf(t1) and a == 0:
                return
            while unit - done <= total:
                y = unit - done
                # x solving a x + slope x²/2 = y, in the form that stays accurate when slope is near 0.
                root = math.sqrt(max(0.0, a * a + 2 * slope * y))
                yield t0 + (2 * y / (a + root) if y > 0 else 0.0)
                unit = next(units)
            done += total
