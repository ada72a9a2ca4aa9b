"""The capacity planner: the smallest fleet of each profile that holds a p99 SLO at a given load.

For each profile: a lower bound from the engine's best throughput (full batches of the mix's mean length,
every instance busy: no fleet smaller than ``qps / that`` can keep up) — or no answer at all when one request
alone, on an idle fleet, is slower than the SLO at p99 (:func:`latency_floor`) — then doubling until a simulated run
with the default policy holds the SLO, then a binary search between the last size that failed and the first
that held (p99 falls as replicas are added). At that size every candidate policy is simulated; a policy that
still holds one replica smaller wins outright, otherwise the lowest p99 wins. A run *holds* when its p99 is
within the SLO, the answers it gave inside the arrival window come within 2% of the load offered, and at most
``max_error_rate`` of requests failed. Every run is a full simulation with the same seed, so the answer is reproducible.

Weights for a weighted front end over a mixed fleet are proportional to each profile's best throughput per
replica (:func:`replica_capacity`), in lowest integer terms at a 10% resolution (Envoy's and NGINX's weights
are integers): a weighted round robin then loads every type to the same share of what it can do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fleetserve.batching.config import BatcherConfig
from fleetserve.sim.arrivals import ArrivalConfig
from fleetserve.sim.config import ReplicaGroup, SimConfig
from fleetserve.sim.faults import Fault
from fleetserve.sim.gateway import DEFAULT_POLICY, BalancerConfig
from fleetserve.sim.profile import LengthMix, Profile
from fleetserve.sim.results import SimResult
from fleetserve.sim.simulator import simulate

DEFAULT_POLICIES = ("round-robin", "least-pending", "p2c-peak-ewma")
GATEWAY_TARGET_UTILISATION = 0.5


@dataclass(frozen=True)
class PlanConfig:
    qps: float
    slo_p99_s: float
    policies: tuple[str, ...] = DEFAULT_POLICIES
    requests: int = 60_000
    warmup_s: float = 1.0
    max_error_rate: float = 0.001
    max_replicas: int = 5_000
    instances: int = 1
    rows: int = 1  # sequences per request (a ranking call scores several candidates at once)
    tokens: int | None = None  # every sequence this long; None: the profile's length mix
    gateway_workers: int | None = None  # None: enough for GATEWAY_TARGET_UTILISATION
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    faults: tuple[Fault, ...] = ()
    replica_cores: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.qps > 0 or not self.slo_p99_s > 0:
            raise ValueError("plan needs qps > 0 and an SLO > 0")
        if not self.policies:
            raise ValueError("plan needs at least one policy")
        for name in self.policies:
            BalancerConfig(policy=name)
        if not 0 <= self.max_error_rate < 1 or self.max_replicas < 1 or self.requests < 1000:
            raise ValueError("plan needs 0 <= max_error_rate < 1, max_replicas >= 1 and requests >= 1000")
        if not 1 <= self.rows <= self.batcher.max_batch:
            raise ValueError(f"rows per request must be in 1..max_batch ({self.batcher.max_batch}), got {self.rows}")
        if self.tokens is not None and self.tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {self.tokens}")


@dataclass(frozen=True)
class Trial:
    replicas: int
    policy: str
    result: SimResult
    holds: bool


@dataclass(frozen=True)
class ProfilePlan:
    profile: Profile
    best: Trial | None  # None: no fleet up to max_replicas held the SLO
    policies: tuple[Trial, ...]  # every policy at the chosen size
    trials: tuple[Trial, ...]  # every run, in order
    gateway_workers: int
    reason: str = ""  # why there is no answer, when there is none

    def cost_per_million(self, qps: float) -> float | None:
        cost = self.profile.cost_per_hour
        if self.best is None or cost is None:
            return None
        return self.best.replicas * cost / (qps * 3600.0) * 1e6


def latency_floor(profile: Profile, *, rows: int = 1, tokens: int | None = None) -> float:
    """The 99th percentile of one request's time alone — its length's batch of one on an idle engine, drawn as
    the simulator draws it, over the request mix — plus the replica's and the gateway's time outside the engine
    (CPU and waiting). A request's latency is at least that, so no fleet size gets p99 below it."""
    mix = profile.lengths if tokens is None else LengthMix.fixed(tokens)
    pad = profile.seq_buckets if profile.pad_to_bucket else ()
    total = sum(mix.weights)
    parts = []
    for length, weight in zip(mix.values, mix.weights, strict=True):
        seq = min(length, profile.max_seq)
        seq = next((b for b in pad if b >= seq), seq)
        mean, cv = profile.timing(rows, seq, idle=True)
        sigma = math.sqrt(math.log1p(cv * cv))
        parts.append((weight / total, mean, math.log(mean) - sigma * sigma / 2, sigma))

    def below(x: float) -> float:
        """Share of requests whose time alone is at most ``x`` (a mixture of lognormals)."""
        share = 0.0
        for w, mean, mu, sigma in parts:
            if sigma == 0:
                share += w if x >= mean else 0.0
            else:
                share += w * 0.5 * (1 + math.erf((math.log(x) - mu) / (sigma * math.sqrt(2))))
        return share

    low, high = 0.0, 20 * max(mean for _, mean, _, _ in parts)
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if below(mid) < 0.99 else (low, mid)
    return (high + profile.replica_cpu_s + profile.replica_wait_s + profile.gateway_cpu_s
            + profile.gateway_wait_s)


def gateway_workers(profile: Profile, qps: float) -> int:
    return max(1, math.ceil(qps * profile.gateway_loaded_cpu_s / GATEWAY_TARGET_UTILISATION))


def replica_capacity(profile: Profile, batcher: BatcherConfig, instances: int, *, rows: int = 1,
                     tokens: int | None = None) -> float:
    """Requests/s one replica could answer at best: full batches of the mix's mean length, all instances busy,
    and no more than its event loop can take in (one request costs a busy loop ``replica_loaded_cpu_s``)."""
    batch = min(batcher.max_batch, profile.max_batch) // rows * rows
    seq = tokens or max(1, round(profile.lengths.mean()))
    mean, _ = profile.timing(batch, seq)
    parallel = instances if profile.device == "cpu" else min(instances, profile.device_capacity)
    engine = parallel * batch / rows / mean
    cpu = profile.replica_loaded_cpu_s
    return min(engine, 1.0 / cpu) if cpu > 0 else engine


def holds(result: SimResult, config: PlanConfig) -> bool:
    answered = result.ok + result.error_count
    return (
        result.p("p99") <= config.slo_p99_s
        and result.goodput_rps >= 0.98 * result.offered_rps
        and result.error_count <= config.max_error_rate * max(1, answered)
    )


class Planner:
    def __init__(self, config: PlanConfig, *, progress: Callable[[str], None] = lambda _: None) -> None:
        self.config = config
        self._progress = progress

    def sim_config(self, profile: Profile, replicas: int, policy: str, *, qps: float | None = None,
                   requests: int | None = None) -> SimConfig:
        cfg = self.config
        rate, count = qps or cfg.qps, requests or cfg.requests
        return SimConfig(
            groups=(ReplicaGroup(profile, replicas, instances=cfg.instances),),
            arrivals=ArrivalConfig("poisson", rate=rate), requests=count,
            warmup_s=min(cfg.warmup_s, 0.2 * count / rate), balancer=BalancerConfig(policy=policy),
            batcher=replace(cfg.batcher, max_batch=min(cfg.batcher.max_batch, profile.max_batch)),
            gateway_workers=cfg.gateway_workers or gateway_workers(profile, cfg.qps), faults=cfg.faults,
            replica_cores=cfg.replica_cores, rows=cfg.rows,
            lengths=LengthMix.fixed(cfg.tokens) if cfg.tokens else None, seed=cfg.seed,
        )

    def trial(self, profile: Profile, replicas: int, policy: str) -> Trial:
        result = simulate(self.sim_config(profile, replicas, policy))
        trial = Trial(replicas, policy, result, holds(result, self.config))
        self._progress(f"{profile.name}: {replicas} replicas, {policy}: p99 {result.p('p99') * 1e3:.2f} ms, "
                       f"{result.throughput_rps:.0f}/{result.offered_rps:.0f} req/s, "
                       f"{'holds' if trial.holds else 'misses'} the SLO")
        return trial

    def plan(self, profile: Profile) -> ProfilePlan:
        cfg = self.config
        default = DEFAULT_POLICY if DEFAULT_POLICY in cfg.policies else cfg.policies[0]
        trials: list[Trial] = []
        workers = self.sim_config(profile, 1, default).gateway_workers

        def run(n: int, policy: str = default) -> Trial:
            trials.append(self.trial(profile, n, policy))
            return trials[-1]

        floor = latency_floor(profile, rows=cfg.rows, tokens=cfg.tokens)
        if floor > cfg.slo_p99_s:
            reason = (f"one request alone takes {floor * 1e3:.1f} ms at p99 for this mix (engine at batch 1 plus "
                      f"replica and gateway CPU): no fleet holds a p99 of {cfg.slo_p99_s * 1e3:g} ms")
            self._progress(f"{profile.name}: {reason}")
            return ProfilePlan(profile, None, (), (), workers, reason)
        best_rate = replica_capacity(profile, cfg.batcher, cfg.instances, rows=cfg.rows, tokens=cfg.tokens)
        low = max(1, math.floor(cfg.qps / best_rate))
        if low > cfg.max_replicas:
            reason = f"keeping up needs at least {low} replicas, more than --max-replicas {cfg.max_replicas}"
            return ProfilePlan(profile, None, (), (), workers, reason)
        failed, n = low - 1, low
        while not run(n).holds:
            failed = n
            if n >= cfg.max_replicas:
                return ProfilePlan(profile, None, (), tuple(trials), workers, f"none of up to {n} replicas held it")
            n = min(cfg.max_replicas, n * 2)
        held = n
        while held - failed > 1:
            mid = (held + failed) // 2
            if run(mid).holds:
                held = mid
            else:
                failed = mid
        at_size = [next(t for t in reversed(trials) if t.replicas == held and t.policy == default)]
        at_size += [run(held, p) for p in cfg.policies if p != default]
        candidates = [t for t in at_size if t.holds]
        if held > 1:
            smaller = [t for t in (run(held - 1, p.policy) for p in candidates if p.policy != default) if t.holds]
            candidates = smaller or candidates
        best = min(candidates, key=lambda t: (t.replicas, t.result.p("p99")))
        return ProfilePlan(profile, best, tuple(at_size), tuple(trials), workers)


def derived_weights(profiles: list[Profile], batcher: BatcherConfig, *, instances: int = 1, rows: int = 1,
                    tokens: int | None = None) -> dict[str, int]:
    """Integer gateway weights ∝ each profile's best requests/s per replica (see the module docstring)."""
    rates = {p.name: replica_capacity(p, batcher, instances, rows=rows, tokens=tokens) for p in profiles}
    low = min(rates.values())
    raw = {name: max(1, round(10 * r / low)) for name, r in rates.items()}
    divisor = math.gcd(*raw.values())
    return {name: w // divisor for name, w in raw.items()}
