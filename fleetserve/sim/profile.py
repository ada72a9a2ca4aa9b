"""Engine profiles: what one replica's engine costs, measured once, read by the simulator and the planner.

A profile holds the service time of one batch per (batch size, padded sequence length) — mean, standard deviation
and quantiles over repeated runs of one engine instance, back to back and after the instance idled (and how long a
wait makes a call one after idling) — plus what else a replica costs: CPU per request on the replica (HTTP, JSON,
tokenizer, batching) and on the gateway, the wall time each of them adds to a request at low load (CPU plus
waiting: loopback, thread wake-ups and hand-offs), how late the batcher's timer fires, the time from process start
to ready (cold start), how much concurrent work the device overlaps (``device_capacity``: 1.0 for a CPU instance
that owns its cores; a GPU runs several instances' kernels partly side by side), and the tokenized length mix of
the benchmark workload. ``fleetserve profile`` writes it (:mod:`fleetserve.sim.profiler`); ``derived_from`` marks a
profile whose numbers were transcribed from a recorded benchmark rather than measured by that command. The JSON
format is versioned by ``format``.

Service time between measured points is interpolated linearly in batch size and in sequence length (an
engine's cost is close to linear in both between neighbouring shapes); a batch is drawn from a lognormal
with the interpolated mean and coefficient of variation (service times are positive and right-skewed).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

FORMAT = "fleetserve-profile/1"


@dataclass(frozen=True)
class ShapeTiming:
    """Service time of one batch shape over ``n`` runs, in seconds.

    ``mean_s``/``std_s`` time calls run back to back (an instance with work queued); ``idle_mean_s``/``idle_std_s``
    time calls that each start after the instance sat idle (a replica between requests at low load: its core
    went idle and its caches cooled), None in profiles recorded before they were measured (then idle calls
    cost what back-to-back ones do).
    """

    mean_s: float
    std_s: float
    p50_s: float
    p99_s: float
    n: int
    idle_mean_s: float | None = None
    idle_std_s: float | None = None

    def __post_init__(self) -> None:
        if not (self.mean_s > 0 and self.std_s >= 0 and self.n >= 1):
            raise ValueError(f"shape timing needs mean_s > 0, std_s >= 0, n >= 1, got {self}")
        if (self.idle_mean_s is None) != (self.idle_std_s is None) or (
            self.idle_mean_s is not None and not (self.idle_mean_s > 0 and (self.idle_std_s or 0.0) >= 0)
        ):
            raise ValueError(f"shape timing needs both idle_mean_s > 0 and idle_std_s >= 0, or neither, got {self}")

    def moments(self, idle: bool) -> tuple[float, float]:
        """(mean, standard deviation) of a back-to-back call, or of one after idling when measured."""
        if idle and self.idle_mean_s is not None and self.idle_std_s is not None:
            return self.idle_mean_s, self.idle_std_s
        return self.mean_s, self.std_s


@dataclass(frozen=True)
class LengthMix:
    """Token counts per request (with [CLS]/[SEP], after truncation) and their relative weights."""

    values: tuple[int, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values or len(self.values) != len(self.weights):
            raise ValueError("a length mix needs as many weights as values, at least one")
        if min(self.values) < 1 or min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError("length mix values must be >= 1 and weights >= 0 with a positive sum")

    @classmethod
    def fixed(cls, tokens: int) -> LengthMix:
        return cls((tokens,), (1.0,))

    @classmethod
    def from_samples(cls, samples: list[int]) -> LengthMix:
        counts: dict[int, int] = {}
        for s in samples:
            counts[s] = counts.get(s, 0) + 1
        values = tuple(sorted(counts))
        return cls(values, tuple(float(counts[v]) for v in values))

    def mean(self) -> float:
        return sum(v * w for v, w in zip(self.values, self.weights, strict=True)) / sum(self.weights)

    def sampler(self, rng: random.Random) -> LengthSampler:
        return LengthSampler(self, rng)


class LengthSampler:
    """Draws token counts from a :class:`LengthMix` (inverse CDF over the cumulative weights)."""

    __slots__ = ("_cum", "_random", "_total", "_values")

    def __init__(self, mix: LengthMix, rng: random.Random) -> None:
        self._values = mix.values
        total, cum = 0.0, []
        for w in mix.weights:
            total += w
            cum.append(total)
        self._cum = cum
        self._total = total
        self._random = rng.random

    def __call__(self) -> int:
        return self._values[bisect.bisect_right(self._cum, self._random() * self._total)]


@dataclass(frozen=True)
class Profile:
    model: str
    precision: str
    backend: str
    device: str  # "cpu" or "cuda"
    device_name: str  # e.g. "AMD EPYC, 2 cores" or "NVIDIA H200"
    batch_sizes: tuple[int, ...]
    seq_lengths: tuple[int, ...]
    service: tuple[tuple[ShapeTiming, ...], ...]  # [batch index][seq index]
    threads: int = 1  # intra-op threads per instance during the measurement (cores it demands)
    device_capacity: float = 1.0  # instances' worth of work the device runs at once at full speed
    replica_cpu_s: float = 0.0  # per request, outside the engine
    gateway_cpu_s: float = 0.0  # per request
    # Wall time per request at low load (0: not measured, taken as the CPU alone): in the replica outside its
    # batcher queue and engine call, and what the gateway adds; the part beyond the CPU is waiting (loopback,
    # wake-ups of idle threads and processes, hand-offs between threads), which takes no core.
    replica_wall_s: float = 0.0
    gateway_wall_s: float = 0.0
    # CPU per request of a process already busy with other requests (measured at saturation, where wake-ups,
    # system calls and timers are shared between requests); None: not measured, the figures above (measured
    # with one request in flight, the upper bound) apply throughout.
    replica_busy_cpu_s: float | None = None
    gateway_busy_cpu_s: float | None = None
    # CPU per request against the requests its process has in hand when it arrives, itself included: ((in hand,
    # seconds), ...) from 1 upward, measured closed loop with that many in flight; empty: not measured, and a
    # request costs the busy figure above when its process is busy, the one-in-flight figure otherwise.
    replica_cpu_curve: tuple[tuple[int, float], ...] = ()
    gateway_cpu_curve: tuple[tuple[int, float], ...] = ()
    timer_lag_s: float = 0.0  # how late the batcher's max-delay timer fires (event-loop timer resolution)
    # The shortest wait for work after which an engine call runs at its after-idle timing (a core that waited a
    # few milliseconds is still awake and warm); 0: any wait, as profiles recorded before it was measured assume.
    idle_after_s: float = 0.0
    # How much slower the engine's calls run inside a serving replica than the same shapes timed alone, after the
    # same wait: the replica's own mean engine call at low load over the after-idle timing of the shapes it ran
    # (between calls its core runs the replica's HTTP, JSON and tokenizer work rather than a sleep); every timing
    # of the table is scaled by it. 1.0: not measured.
    served_factor: float = 1.0
    cold_start_s: float | None = None  # process start to ready; None: not measured
    lengths: LengthMix = field(default_factory=lambda: LengthMix.fixed(32))
    seq_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    pad_to_bucket: bool = False  # True: the engine runs the bucket's shape (CUDA graphs), not the longest row
    cost_per_hour: float | None = None
    measured_at: str = ""
    command: str = ""
    derived_from: str | None = None
    notes: tuple[str, ...] = ()
    name: str = ""  # a short label for tables; defaults to model/precision/device

    def __post_init__(self) -> None:
        if not self.batch_sizes or list(self.batch_sizes) != sorted(set(self.batch_sizes)) or self.batch_sizes[0] < 1:
            raise ValueError(f"profile batch_sizes must be increasing positive integers, got {self.batch_sizes}")
        if not self.seq_lengths or list(self.seq_lengths) != sorted(set(self.seq_lengths)):
            raise ValueError(f"profile seq_lengths must be increasing, got {self.seq_lengths}")
        if len(self.service) != len(self.batch_sizes) or any(len(r) != len(self.seq_lengths) for r in self.service):
            raise ValueError("profile service table must have one row per batch size and one column per length")
        if self.threads < 1 or self.device_capacity <= 0 or not self.served_factor > 0:
            raise ValueError("profile threads must be >= 1, device_capacity and served_factor > 0")
        if min(self.replica_cpu_s, self.gateway_cpu_s, self.replica_wall_s, self.gateway_wall_s,
               self.timer_lag_s, self.idle_after_s, self.replica_busy_cpu_s or 0.0, self.gateway_busy_cpu_s or 0.0) < 0:
            raise ValueError("profile CPU costs, wall times, timer lag and idle_after_s must be >= 0")
        for curve in (self.replica_cpu_curve, self.gateway_cpu_curve):
            if curve and (curve[0][0] != 1 or any(b[0] <= a[0] for a, b in itertools.pairwise(curve))
                          or min(c for _, c in curve) < 0):
                raise ValueError(f"a CPU curve needs rising in-flight counts from 1 and costs >= 0, got {curve}")
        if self.cost_per_hour is not None and self.cost_per_hour < 0:
            raise ValueError(f"cost_per_hour must be >= 0, got {self.cost_per_hour}")
        if not self.name:
            object.__setattr__(self, "name", f"{self.model}/{self.precision}/{self.device_name or self.device}")

    @property
    def replica_wait_s(self) -> float:
        """Waiting a request does in the replica at low load beyond its CPU (no core taken)."""
        return max(0.0, self.replica_wall_s - self.replica_cpu_s)

    @property
    def gateway_wait_s(self) -> float:
        """Waiting a request does in the gateway at low load beyond its CPU (no core taken)."""
        return max(0.0, self.gateway_wall_s - self.gateway_cpu_s)

    @property
    def replica_loaded_cpu_s(self) -> float:
        """CPU per request of a busy replica event loop (the one-in-flight figure when not measured)."""
        return self.replica_cpu_s if self.replica_busy_cpu_s is None else self.replica_busy_cpu_s

    @property
    def gateway_loaded_cpu_s(self) -> float:
        """CPU per request of a busy gateway worker (the one-in-flight figure when not measured)."""
        return self.gateway_cpu_s if self.gateway_busy_cpu_s is None else self.gateway_busy_cpu_s

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    @property
    def max_seq(self) -> int:
        return self.seq_lengths[-1]

    def timing(self, rows: int, seq: int, idle: bool = False) -> tuple[float, float]:
        """Interpolated (mean seconds, coefficient of variation) of a batch of ``rows`` padded to ``seq``,
        run back to back or (``idle``) on an instance that was idle before it, in a serving replica (the table's
        timing times ``served_factor``)."""
        bi, bw = _bracket(self.batch_sizes, rows)
        si, sw = _bracket(self.seq_lengths, seq)
        mean = cv = 0.0
        for i, wi in ((bi, 1.0 - bw), (bi + 1, bw)):
            for j, wj in ((si, 1.0 - sw), (si + 1, sw)):
                w = wi * wj
                if w:
                    m, sd = self.service[i][j].moments(idle)
                    mean += w * m
                    cv += w * sd / m
        return mean * self.served_factor, cv

    def slowed(self, factor: float) -> Profile:
        """This profile on a machine ``factor`` times slower (faster below 1): every time spent running code
        scaled, the engine's and the replica's and gateway's CPU and wall time per request; the timer's lag,
        the idle threshold and the cold start kept. For a machine whose speed drifts between the profile and a
        run (:mod:`fleetserve.sim.speed` measures the factor)."""
        if not factor > 0:
            raise ValueError(f"a speed factor must be > 0, got {factor}")

        def scaled(t: ShapeTiming) -> ShapeTiming:
            idle = (None, None) if t.idle_mean_s is None or t.idle_std_s is None else (
                t.idle_mean_s * factor, t.idle_std_s * factor)
            return ShapeTiming(t.mean_s * factor, t.std_s * factor, t.p50_s * factor, t.p99_s * factor, t.n, *idle)

        def times(x: float | None) -> float | None:
            return None if x is None else x * factor

        return replace(
            self, service=tuple(tuple(scaled(t) for t in row) for row in self.service),
            replica_cpu_s=self.replica_cpu_s * factor, gateway_cpu_s=self.gateway_cpu_s * factor,
            replica_wall_s=self.replica_wall_s * factor, gateway_wall_s=self.gateway_wall_s * factor,
            replica_busy_cpu_s=times(self.replica_busy_cpu_s), gateway_busy_cpu_s=times(self.gateway_busy_cpu_s),
            replica_cpu_curve=tuple((k, c * factor) for k, c in self.replica_cpu_curve),
            gateway_cpu_curve=tuple((k, c * factor) for k, c in self.gateway_cpu_curve),
        )

    def with_cost(self, cost_per_hour: float | None) -> Profile:
        return self if cost_per_hour is None else replace(self, cost_per_hour=cost_per_hour)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["lengths"] = {"values": list(self.lengths.values), "weights": list(self.lengths.weights)}
        return {"format": FORMAT, **data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a fleetserve profile (format {data.get('format')!r}, expected {FORMAT!r})")
        fields = {k: v for k, v in data.items() if k != "format"}
        try:
            fields["service"] = tuple(tuple(ShapeTiming(**t) for t in row) for row in fields["service"])
            fields["lengths"] = LengthMix(tuple(fields["lengths"]["values"]), tuple(fields["lengths"]["weights"]))
            for key in ("batch_sizes", "seq_lengths", "seq_buckets", "notes"):
                if key in fields:
                    fields[key] = tuple(fields[key])
            for key in ("replica_cpu_curve", "gateway_cpu_curve"):
                if key in fields:
                    fields[key] = tuple((int(k), float(c)) for k, c in fields[key])
            return cls(**fields)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed profile: {exc}") from None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Profile:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ValueError(f"cannot read profile {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"profile {path} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"profile {path} must hold a JSON object")
        try:
            return cls.from_json(data)
        except ValueError as exc:
            raise ValueError(f"profile {path}: {exc}") from None


def _bracket(points: tuple[int, ...], x: float) -> tuple[int, float]:
    """Index i and weight w so that x ≈ (1 - w)·points[i] + w·points[i+1]; clamped to the grid's ends
    except above the last point, where the last interval is extended (cost keeps growing with size)."""
    if len(points) == 1:
        return 0, 0.0
    i = bisect.bisect_right(points, x) - 1
    i = min(max(i, 0), len(points) - 2)
    lo, hi = points[i], points[i + 1]
    return i, max(0.0, (x - lo) / (hi - lo))


class ServiceSampler:
    """Draws batch service times from a profile: lognormal with the interpolated mean and CV.

    The lognormal's parameters are computed once per shape into ``cache`` (keyed ``(rows, seq)``, the length negated
    for a call after idling), which samplers of the same profile may share (a large fleet has one sampler per
    replica, each with its own random stream). """

    __slots__ = ("_cache", "_normal", "_profile")

    def __init__(self, profile: Profile, rng: random.Random, *,
                 cache: dict[tuple[int, int], tuple[float, float, float]] | None = None) -> None:
        self._profile = profile
        # A lognormal draw is exp of a normal one (what ``Random.lognormvariate`` computes, one call deeper).
        self._normal = rng.normalvariate
        self._cache = {} if cache is None else cache

    def params(self, rows: int, seq: int, idle: bool = False) -> tuple[float, float, float]:
        """(mean, mu, sigma) of the lognormal for this shape (run back to back, or after idling)."""
        key = (rows, -seq) if idle else (rows, seq)
        got = self._cache.get(key)
        if got is None:
            mean, cv = self._profile.timing(rows, seq, idle)
            sigma2 = math.log1p(cv * cv)
            got = (mean, math.log(mean) - sigma2 / 2, math.sqrt(sigma2))
            self._cache[key] = got
        return got

    def __call__(self, rows: int, seq: int, idle: bool = False) -> float:
        mean, mu, sigma = self._cache.get((rows, -seq) if idle else (rows, seq)) or self.params(rows, seq, idle)
        return math.exp(self._normal(mu, sigma)) if sigma > 0 else mean
