"""The simulated twin of a local fleet that ``sim_validate.py`` and ``sim_breakdown.py`` start for real.

Scripts run as ``python benchmarks/NAME.py``, which puts this folder on ``sys.path``: they import it as
``_sim_twin``.
"""

from __future__ import annotations

import os

from fleetserve.batching.config import BatcherConfig
from fleetserve.sim.arrivals import ArrivalConfig
from fleetserve.sim.config import ReplicaGroup, SimConfig
from fleetserve.sim.gateway import BalancerConfig
from fleetserve.sim.profile import Profile


def local_fleet(profile: Profile, replicas: int, rate: float, requests: int, warmup_s: float) -> SimConfig:
    """``replicas`` of ``profile`` behind one gateway, Poisson arrivals at ``rate``: the batcher and the health
    interval the real fleets run with (``--max-batch 32``, 2 ms delay, ``--health-interval 1``), every process
    sharing this machine's cores."""
    return SimConfig(
        groups=(ReplicaGroup(profile, replicas),), arrivals=ArrivalConfig("poisson", rate=rate), requests=requests,
        warmup_s=warmup_s, balancer=BalancerConfig(health_interval_s=1.0),
        batcher=BatcherConfig(max_batch=32, max_delay_s=0.002), shared_host_cores=float(os.cpu_count() or 1),
    )
