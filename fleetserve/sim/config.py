"""The simulator's configuration: which replicas, what load, which gateway settings, which faults."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetserve.batching.config import BatcherConfig
from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig
from fleetserve.sim.arrivals import ArrivalConfig
from fleetserve.sim.faults import Fault
from fleetserve.sim.gateway import BalancerConfig
from fleetserve.sim.profile import LengthMix, Profile
from fleetserve.sim.scaling import ScalingConfig

DEFAULT_COLD_START_S = 10.0


@dataclass(frozen=True)
class ReplicaGroup:
    """``replicas`` identical replicas of one profile, each with ``instances`` engine instances."""

    profile: Profile
    replicas: int
    weight: int = 1  # the gateway weight of each (weighted policies, slow start)
    instances: int = 1

    def __post_init__(self) -> None:
        if self.replicas < 0 or self.instances < 1 or self.weight < 1:
            raise ValueError("a replica group needs replicas >= 0, instances >= 1 and weight >= 1")


@dataclass(frozen=True)
class SimConfig:
    """One simulation run.

    Placement: by default every replica has its own host (its event loop and engine instances never
    compete with other replicas) and the gateway workers have a core each. ``shared_host_cores`` puts the
    gateway and every replica's CPU work on one host of that many cores instead (a local fleet on one
    machine, as in the validation runs), shared with ``background_cores`` of demand from other processes
    (the load generator, other tenants) under processor sharing (:mod:`fleetserve.sim.host`).
    ``replica_cores`` sizes each replica's own host (default: its engine threads plus one core for the
    event loop). ``adaptive`` runs the gateway's adaptive concurrency limit in each worker (the gateway's default
    is on, ``AdaptiveConcurrencyConfig()``; None leaves it out, as every simulation before it was modelled).
    """

    groups: tuple[ReplicaGroup, ...]
    arrivals: ArrivalConfig = field(default_factory=ArrivalConfig)
    requests: int = 100_000
    warmup_s: float = 1.0
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    gateway_workers: int = 1
    gateway_cpu_s: float | None = None  # None: the first profile's
    gateway_wait_s: float | None = None  # None: the first profile's (its gateway wall time beyond the CPU)
    max_retries: int = 1
    health_checks: bool = True
    network_s: float = 0.0  # one way, gateway <-> replica
    shared_host_cores: float | None = None
    background_cores: float = 0.0
    replica_cores: float | None = None
    cold_start_s: float | None = None  # None: the profile's, else DEFAULT_COLD_START_S
    lengths: LengthMix | None = None  # None: the first profile's mix
    rows: int = 1
    faults: tuple[Fault, ...] = ()
    scaling: ScalingConfig | None = None
    adaptive: AdaptiveConcurrencyConfig | None = None  # the gateway's adaptive concurrency limit; None: off
    # Requests of more tokens than this are reported apart from the rest (SimResult.latency_by_length); None: not.
    split_tokens: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.groups or sum(g.replicas for g in self.groups) < 1:
            raise ValueError("a simulated fleet needs at least one replica")
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if self.warmup_s < 0 or self.network_s < 0 or self.background_cores < 0:
            raise ValueError("warmup_s, network_s and background_cores must be >= 0")
        if self.gateway_workers < 1:
            raise ValueError(f"gateway_workers must be >= 1, got {self.gateway_workers}")
        if min(self.gateway_cpu_s or 0.0, self.gateway_wait_s or 0.0) < 0:
            raise ValueError("gateway_cpu_s and gateway_wait_s must be >= 0")
        if not 0 <= self.max_retries <= 3:
            raise ValueError(f"max_retries must be in 0..3, got {self.max_retries}")
        if self.replica_cores is not None and self.replica_cores <= 0:
            raise ValueError("replica_cores must be > 0")
        if self.split_tokens is not None and self.split_tokens < 1:
            raise ValueError(f"split_tokens must be >= 1, got {self.split_tokens}")
        if not 1 <= self.rows <= self.batcher.max_batch:
            raise ValueError(f"rows per request must be in 1..max_batch ({self.batcher.max_batch})")
        for group in self.groups:
            if self.batcher.max_batch > group.profile.max_batch:
                raise ValueError(f"max_batch {self.batcher.max_batch} exceeds what profile {group.profile.name} "
                                 f"measured ({group.profile.max_batch})")

    @property
    def replicas(self) -> int:
        return sum(g.replicas for g in self.groups)

    def gateway_cpu(self) -> float:
        return self.groups[0].profile.gateway_cpu_s if self.gateway_cpu_s is None else self.gateway_cpu_s

    def gateway_busy_cpu(self) -> float:
        """A busy gateway worker's CPU per request: the override, else the first profile's."""
        return self.groups[0].profile.gateway_loaded_cpu_s if self.gateway_cpu_s is None else self.gateway_cpu_s

    def gateway_cpu_curve(self) -> tuple[tuple[int, float], ...]:
        """The first profile's gateway CPU against requests in flight; none under an override of the CPU."""
        return self.groups[0].profile.gateway_cpu_curve if self.gateway_cpu_s is None else ()

    def gateway_wait(self) -> float:
        return self.groups[0].profile.gateway_wait_s if self.gateway_wait_s is None else self.gateway_wait_s

    def length_mix(self) -> LengthMix:
        return self.lengths if self.lengths is not None else self.groups[0].profile.lengths

    def cold_start(self, profile: Profile) -> float:
        if self.scaling is not None and self.scaling.cold_start_s is not None:
            return self.scaling.cold_start_s
        if self.cold_start_s is not None:
            return self.cold_start_s
        return profile.cold_start_s if profile.cold_start_s is not None else DEFAULT_COLD_START_S
