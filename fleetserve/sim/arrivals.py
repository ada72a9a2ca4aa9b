"""When requests arrive: a Poisson process, evenly spaced, a rate ramp, or a recorded trace.

Every source yields ``(time_s, tokens)`` in increasing time, where ``tokens`` is the request's token count
when the source knows it (a trace may carry it) and ``None`` otherwise (the workload's length mix decides).

- ``poisson`` and ``constant`` reuse the load generator's schedules (:mod:`fleetserve.bench.arrivals`), so
  the simulator sees the same arrival process as the real benchmark runs it is validated against.
- ``ramp``: a piecewise-linear rate, e.g. a sales peak (``0=1000,60=5000,120=5000,180=1000``: time in s =
  requests/s), drawn as a non-homogeneous Poisson process by thinning (Lewis and Shedler, 1979): candidates
  at the peak rate, each kept with probability rate(t) / peak.
- ``trace``: a text file with one arrival per line, ``TIME_S`` or ``TIME_S TOKENS`` (``#`` comments).
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleetserve.bench.arrivals import arrival_offsets

Arrival = tuple[float, int | None]
KINDS = ("poisson", "constant", "ramp", "trace")


@dataclass(frozen=True)
class RampPoint:
    at_s: float
    rate: float


def parse_ramp(text: str) -> tuple[RampPoint, ...]:
    """``T=QPS,T=QPS,...`` with increasing times from 0; the last rate holds afterwards."""
    points = []
    for part in text.split(","):
        at, sep, rate = part.partition("=")
        try:
            point = RampPoint(float(at), float(rate))
        except ValueError:
            raise ValueError(f"ramp point {part!r} must be TIME_S=REQUESTS_PER_S") from None
        if not sep or point.rate < 0:
            raise ValueError(f"ramp point {part!r} must be TIME_S=REQUESTS_PER_S with a rate >= 0")
        points.append(point)
    if not points or points[0].at_s != 0 or any(b.at_s <= a.at_s for a, b in itertools.pairwise(points)):
        raise ValueError(f"ramp {text!r} needs increasing times starting at 0")
    if max(p.rate for p in points) <= 0:
        raise ValueError(f"ramp {text!r} never has a positive rate")
    return tuple(points)


def ramp_rate(points: tuple[RampPoint, ...], t: float) -> float:
    times = [p.at_s for p in points]
    i = bisect.bisect_right(times, t) - 1
    if i >= len(points) - 1:
        return points[-1].rate
    a, b = points[i], points[i + 1]
    return a.rate + (b.rate - a.rate) * (t - a.at_s) / (b.at_s - a.at_s)


def ramp(points: tuple[RampPoint, ...], rng: random.Random) -> Iterator[Arrival]:
    peak = max(p.rate for p in points)
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if rng.random() * peak < ramp_rate(points, t):
            yield t, None


def read_trace(path: Path) -> list[Arrival]:
    arrivals: list[Arrival] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        try:
            at = float(fields[0])
            tokens = int(fields[1]) if len(fields) > 1 else None
        except ValueError:
            raise ValueError(f"trace {path}:{number}: expected TIME_S [TOKENS], got {line.strip()!r}") from None
        if at < 0 or (tokens is not None and tokens < 1) or (arrivals and at < arrivals[-1][0]):
            raise ValueError(f"trace {path}:{number}: times must be >= 0 and non-decreasing, tokens >= 1")
        arrivals.append((at, tokens))
    if not arrivals:
        raise ValueError(f"trace {path} holds no arrivals")
    return arrivals


@dataclass(frozen=True)
class ArrivalConfig:
    """``kind`` with its ``rate`` (poisson, constant), ``ramp`` points or ``trace`` file."""

    kind: str = "poisson"
    rate: float = 100.0
    ramp: tuple[RampPoint, ...] = ()
    trace: Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"arrivals must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind in ("poisson", "constant") and not self.rate > 0:
            raise ValueError(f"arrival rate must be > 0 requests/s, got {self.rate}")
        if self.kind == "ramp" and not self.ramp:
            raise ValueError("ramp arrivals need ramp points")
        if self.kind == "trace" and self.trace is None:
            raise ValueError("trace arrivals need a trace file")

    @classmethod
    def parse(cls, text: str, rate: float) -> ArrivalConfig:
        """``poisson``, ``constant``, ``ramp:T=QPS,...`` or ``trace:FILE``."""
        kind, _, arg = text.partition(":")
        if kind == "ramp":
            return cls(kind, rate, ramp=parse_ramp(arg))
        if kind == "trace":
            return cls(kind, rate, trace=Path(arg))
        return cls(kind, rate)

    def source(self, rng: random.Random) -> Iterator[Arrival]:
        if self.kind == "ramp":
            return ramp(self.ramp, rng)
        if self.kind == "trace":
            assert self.trace is not None
            return iter(read_trace(self.trace))
        return zip(arrival_offsets(self.kind, self.rate, rng), itertools.repeat(None))
