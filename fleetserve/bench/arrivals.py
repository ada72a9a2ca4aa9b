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
import random
from collections.abc import Callable, Iterator

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
