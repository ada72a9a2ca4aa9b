"""``fleetserve serve MODEL``: one replica (engine + batcher + KServe v2 HTTP/gRPC + /inference + metrics)."""

from __future__ import annotations

from fleetserve.replica.config import ReplicaConfig

OPTIONS = ReplicaConfig


def run(config: ReplicaConfig) -> int:
    from fleetserve.replica.server import run as run_replica

    return run_replica(config)
